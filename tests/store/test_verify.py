"""verify(): an offline check of a stopped store that reports damage without repairing it."""

from __future__ import annotations

import os
from pathlib import Path

from msg_store_helpers import RecordingClient, body

from broker.store import verify
from broker.store.msg_store_recovery import SNAPSHOT
from broker.store.queue_index import QueueIndex
from broker.store.queue_index_format import segment_file_name
from broker.store.segment import FILE_HEADER_SIZE, RECORD_HEADER_SIZE, segment_name
from broker.store.verify import verify_queue_indexes

REC = RECORD_HEADER_SIZE + 1000


async def stopped_store(make_store, tmp_path: Path, clean: bool = True) -> Path:
    store = await make_store(file_size_limit=5000)
    c = RecordingClient()
    for i in range(12):
        store.write(i, body(i), c)
    await store.sync()
    await (store.stop() if clean else store.close_dirty())
    return tmp_path / "store"


async def test_clean_store_verifies_ok(make_store, tmp_path: Path) -> None:
    d = await stopped_store(make_store, tmp_path)
    report = verify(d)
    assert report.ok and report.problems() == []
    assert report.segments == 3 and report.messages == 12
    assert report.clean_shutdown and report.snapshot == "valid"


async def test_verify_reports_torn_corrupt_and_bad_header(make_store, tmp_path: Path) -> None:
    d = await stopped_store(make_store, tmp_path, clean=False)
    seg1, seg2, seg3 = (d / segment_name(n) for n in (1, 2, 3))
    with open(seg1, "r+b") as f:
        f.seek(FILE_HEADER_SIZE + REC + RECORD_HEADER_SIZE + 3)
        f.write(b"XYZ")
    with open(seg2, "r+b") as f:
        f.write(b"NOPE")
    os.truncate(seg3, seg3.stat().st_size - 10)
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    report = verify(d)
    assert not report.ok
    assert report.corrupt_records == [(seg1.name, FILE_HEADER_SIZE + REC, REC)]
    assert report.bad_headers == [seg2.name]
    assert report.torn_tails == [(seg3.name, seg3.stat().st_size - REC + 10, REC - 10)]
    assert len(report.problems()) == 3
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before  # read only


async def test_verify_flags_a_stale_snapshot(make_store, tmp_path: Path) -> None:
    d = await stopped_store(make_store, tmp_path)
    with open(d / segment_name(3), "ab") as f:
        f.write(b"extra")
    report = verify(d)
    assert report.snapshot == "stale" and not report.ok
    (d / SNAPSHOT).write_bytes(b"garbage")
    assert verify(d).snapshot == "invalid"


async def test_store_with_only_an_empty_file_verifies_ok(make_store, tmp_path: Path) -> None:
    d = tmp_path / "transient"
    store = await make_store(d, transient=True)
    await store.stop()
    report = verify(d)
    assert report.ok and report.segments == 1 and report.torn_tails == []
    again = await make_store(d)  # and a start keeps it as the current file
    assert again.last_report.torn_bytes == 0 and again.stats()["files"] == 1


def test_verify_queue_indexes_reports_damage_per_file_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "queues"
    for name in ("a", "b"):
        qi = QueueIndex(root / name, segment_entries=4)
        qi.recover()
        for seq in range(6):
            qi.publish(seq, seq + 1, b"embedded" if seq % 2 else None)
        qi.ack([0])
        qi.close()
    clean = verify_queue_indexes(root)
    assert clean.ok and clean.problems() == []
    assert (clean.queues, clean.segments, clean.messages) == (2, 4, 10)
    seg_a, seg_b = root / "a" / segment_file_name(1), root / "b" / segment_file_name(0)
    os.truncate(seg_a, seg_a.stat().st_size - 3)
    with open(seg_b, "r+b") as f:
        f.write(b"JUNK")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    report = verify_queue_indexes(root)
    assert not report.ok and report.bad_headers == [f"b/{seg_b.name}"]
    [(name, offset, size)] = report.torn_tails
    assert name == f"a/{seg_a.name}" and offset + size == seg_a.stat().st_size
    assert report.messages == 10 - 1 - 3  # the torn record and segment 0 of b are lost
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
