"""read_store / read_segment: a store directory read as the next start would see it, without a
byte changed: the snapshot after a clean stop, a scan after a crash, damage reported with file
and offset, an interrupted compaction's moved records found in its copy."""

from __future__ import annotations

import os
from pathlib import Path

from msg_store_helpers import body, filled
from test_compaction import LIMIT, _stuck_compaction

from broker.store.msg_store_files import TORN_CREATION, read_segment, read_store
from broker.store.segment import (
    COMPACT_SUFFIX,
    FILE_HEADER_SIZE,
    RECORD_HEADER_SIZE,
    decode_record,
    segment_name,
)

REC = RECORD_HEADER_SIZE + 1000


def files_of(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def read_at(d: Path, where: tuple[str, int, int], msg_id: int) -> bytes:
    name, offset, size = where
    with open(d / name, "rb") as f:
        return decode_record(os.pread(f.fileno(), size, offset), msg_id)


async def test_clean_stop_is_read_from_the_snapshot(make_store, tmp_path: Path) -> None:
    store = await filled(make_store, 12, file_size_limit=5000)
    store.remove(3)
    await store.stop()
    d = tmp_path / "store"
    before = files_of(d)
    view = read_store(d)
    assert view.clean and view.damage == []
    assert sorted(view.locations) == [i for i in range(12) if i != 3]  # a remove is in it
    assert all(read_at(d, view.locations[i], i) == body(i) for i in view.locations)
    assert files_of(d) == before


async def test_crash_is_scanned_and_damage_reported(make_store, tmp_path: Path) -> None:
    store = await filled(make_store, 12, file_size_limit=5000)
    await store.close_dirty()
    d = tmp_path / "store"
    with open(d / segment_name(1), "r+b") as f:  # message 1's body
        f.seek(FILE_HEADER_SIZE + REC + RECORD_HEADER_SIZE + 3)
        f.write(b"XYZ")
    last = d / segment_name(3)
    os.truncate(last, last.stat().st_size - 10)  # message 11 torn
    (d / segment_name(4)).write_bytes(b"HS")  # a roll the crash cut short
    before = files_of(d)
    view = read_store(d)
    assert not view.clean
    assert sorted(view.locations) == [i for i in range(12) if i not in (1, 11)]
    assert all(read_at(d, view.locations[i], i) == body(i) for i in view.locations)
    assert [(x.file, x.offset, x.what) for x in view.damage] == [
        (segment_name(1), FILE_HEADER_SIZE + REC, "corrupt record"),
        (segment_name(3), FILE_HEADER_SIZE + REC, "torn tail"),
        (segment_name(4), 0, f"{TORN_CREATION}: 2 bytes"),
    ]
    assert files_of(d) == before
    again = await make_store(file_size_limit=5000)  # what the broker's recovery then keeps
    assert sorted(i for i in range(12) if again.contains(i)) == sorted(view.locations)


async def test_interrupted_compaction_is_read_as_redone(make_store, tmp_path: Path) -> None:
    live = await _stuck_compaction(make_store, tmp_path, partial=1500)
    d = tmp_path / "store"
    before = files_of(d)
    view = read_store(d)
    assert not view.clean and view.duplicates > 0
    assert all(read_at(d, view.locations[i], i) == body(i) for i in live)
    assert any(name.endswith(COMPACT_SUFFIX) for name, _, _ in view.locations.values())
    assert files_of(d) == before
    again = await make_store(file_size_limit=LIMIT, refs=lambda: dict.fromkeys(live, 1))
    assert all(again.read(i) == body(i) for i in live)


def test_read_segment_names_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / segment_name(7)
    path.write_bytes(b"NOPE" + bytes(20))
    seg = read_segment(path, 7)
    assert seg.scan is None and seg.fault == "bad header" and "magic" in seg.detail
    missing = read_segment(tmp_path / segment_name(8), 8)
    assert missing.scan is None and missing.fault == "unreadable"
