"""Starting a persistent store from disk: clean (snapshot), dirty (scan), torn and corrupt
records, quarantine of unreadable segments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from msg_store_helpers import RecordingClient, body, filled

from broker.store.msg_store import MessageUnreadable
from broker.store.msg_store_recovery import CLEAN_MARKER, QUARANTINE_DIR, SNAPSHOT
from broker.store.segment import FILE_HEADER_SIZE, RECORD_HEADER_SIZE, segment_name

REC = RECORD_HEADER_SIZE + 1000  # on-disk size of one body(i)


async def test_clean_restart_uses_the_snapshot(make_store, tmp_path: Path) -> None:
    store = await filled(make_store, file_size_limit=8000)
    store.write(3, body(3), None)  # a second reference
    store.remove_many([10, 11])
    await store.sync()
    await store.stop()
    d = tmp_path / "store"
    assert (d / CLEAN_MARKER).exists() and (d / SNAPSHOT).exists()
    calls: list[int] = []
    again = await make_store(refs=lambda: calls.append(1) or {})
    report = again.last_report
    assert report.clean and calls == []  # snapshot trusted, refs not needed
    assert not (d / CLEAN_MARKER).exists()  # a crash from now on is a dirty start
    assert report.messages == 28
    assert again.read(3) == body(3) and not again.contains(10)
    again.remove(3)
    assert again.contains(3)  # the ref count came back from the snapshot
    assert again.stats()["garbage_bytes"] == store.stats()["garbage_bytes"]


async def test_dirty_restart_rebuilds_by_scan_with_callers_refs(make_store, tmp_path) -> None:
    store = await filled(make_store, file_size_limit=8000)
    await store.close_dirty()  # crash: no snapshot, no marker
    refs = {i: 1 for i in range(0, 30, 2)} | {4: 3, 999: 1}
    again = await make_store(refs=lambda: refs)
    report = again.last_report
    assert not report.clean
    assert report.unreferenced == 15 and report.missing == 1
    assert sorted(i for i in range(30) if again.contains(i)) == list(range(0, 30, 2))
    assert all(again.read(i) == body(i) for i in range(0, 30, 2))
    again.remove(4)
    again.remove(4)
    assert again.contains(4)  # three references from the caller
    again.remove(4)
    assert not again.contains(4)
    assert again.stats()["garbage_bytes"] >= 15 * REC


async def test_dirty_restart_without_refs_keeps_everything_found(make_store) -> None:
    store = await filled(make_store, n=5)
    await store.close_dirty()
    again = await make_store()
    assert sorted(i for i in range(5) if again.contains(i)) == [0, 1, 2, 3, 4]


async def test_stale_marker_with_damaged_snapshot_falls_back_to_scan(make_store, tmp_path) -> None:
    store = await filled(make_store, n=5)
    await store.stop()
    snap = tmp_path / "store" / SNAPSHOT
    data = bytearray(snap.read_bytes())
    data[20] ^= 0xFF
    snap.write_bytes(bytes(data))
    again = await make_store()
    assert not again.last_report.clean and again.last_report.messages == 5
    assert again.read(4) == body(4)


async def test_torn_last_record_is_dropped(make_store, tmp_path: Path) -> None:
    store = await filled(make_store, n=5)
    await store.close_dirty()
    seg = tmp_path / "store" / segment_name(1)
    size = seg.stat().st_size
    os.truncate(seg, size - 300)  # the last write was cut short by the crash
    again = await make_store()
    report = again.last_report
    assert report.torn_bytes == REC - 300
    assert sorted(i for i in range(5) if again.contains(i)) == [0, 1, 2, 3]
    assert seg.stat().st_size == FILE_HEADER_SIZE + 4 * REC  # cut back to the last good record
    c = RecordingClient()
    again.write(4, body(4), c)  # appends after the good data
    await again.sync()
    assert again.read(4) == body(4) and again.read(3) == body(3)


async def test_corrupt_record_detected_at_recovery(make_store, tmp_path: Path) -> None:
    store = await filled(make_store, n=5)
    await store.close_dirty()
    seg = tmp_path / "store" / segment_name(1)
    with open(seg, "r+b") as f:
        f.seek(FILE_HEADER_SIZE + 2 * REC + RECORD_HEADER_SIZE + 500)
        f.write(b"\xde\xad\xbe\xef")  # flip bytes in message 2's body
    again = await make_store()
    assert again.last_report.corrupt_records == 1
    assert sorted(i for i in range(5) if again.contains(i)) == [0, 1, 3, 4]
    assert again.stats()["corrupt_records"] == 1


async def test_corrupt_record_detected_on_read(make_store, tmp_path: Path) -> None:
    store = await filled(make_store, n=5)
    await store.stop()
    again = await make_store()  # clean start: nothing cached, reads go to the file
    seg = tmp_path / "store" / segment_name(1)
    with open(seg, "r+b") as f:
        f.seek(FILE_HEADER_SIZE + REC + RECORD_HEADER_SIZE + 10)
        f.write(b"\x00\x01\x02")
    with pytest.raises(MessageUnreadable):
        again.read(1)
    assert not again.contains(1)  # dropped, never served wrong
    assert again.read(2) == body(2)
    assert again.stats()["corrupt_records"] == 1


async def test_segment_with_bad_header_is_quarantined(make_store, tmp_path: Path) -> None:
    store = await filled(make_store, n=20, file_size_limit=5000)
    await store.close_dirty()
    d = tmp_path / "store"
    bad = d / segment_name(2)
    with open(bad, "r+b") as f:
        f.write(b"JUNK")
    again = await make_store()
    report = again.last_report
    assert report.quarantined == [segment_name(2)]
    assert (d / QUARANTINE_DIR / segment_name(2)).exists() and not bad.exists()
    lost = {i for i in range(20) if not again.contains(i)}
    assert lost == {5, 6, 7, 8, 9}  # file 2's messages (five a file), nothing else
    assert all(again.read(i) == body(i) for i in range(20) if i not in lost)
    assert again.stats()["quarantined"] == 1
    c = RecordingClient()
    again.write(100, body(100), c)
    await again.sync()
    assert c.durable == [100]


async def test_unreadable_segment_quarantined_while_running(make_store, tmp_path: Path) -> None:
    store = await filled(make_store, n=20, file_size_limit=5000)
    await store.stop()
    again = await make_store()
    d = tmp_path / "store"
    seg = d / segment_name(2)
    seg.unlink()
    seg.mkdir()  # reading it now fails with EISDIR, as a dead disk sector would with EIO
    with pytest.raises(MessageUnreadable):
        again.read(5)
    assert (d / QUARANTINE_DIR / segment_name(2)).is_dir()
    assert not any(again.contains(i) for i in (5, 6, 7, 8, 9))
    assert again.read(10) == body(10) and again.read(4) == body(4)
    assert again.stats()["quarantined"] == 1
    await again.stop()
    third = await make_store()
    assert third.last_report.clean and third.read(19) == body(19)


async def test_new_file_torn_while_rolling_is_dropped_not_quarantined(make_store, tmp_path) -> None:
    store = await filled(make_store, n=5)
    await store.close_dirty()
    d = tmp_path / "store"
    (d / segment_name(2)).write_bytes(b"HSE")  # the crash hit while the header was written
    (d / segment_name(3)).write_bytes(b"")
    again = await make_store()
    assert again.last_report.quarantined == []
    assert sorted(i for i in range(5) if again.contains(i)) == [0, 1, 2, 3, 4]
    c = RecordingClient()
    again.write(9, body(9), c)
    await again.sync()
    assert again.read(9) == body(9)


async def test_clean_start_does_not_scan(make_store, tmp_path: Path) -> None:
    store = await filled(make_store, n=5)
    await store.stop()
    seg = tmp_path / "store" / segment_name(1)
    with open(seg, "r+b") as f:  # damage a body without changing the file's size
        f.seek(FILE_HEADER_SIZE + 3 * REC + RECORD_HEADER_SIZE + 1)
        f.write(b"!!")
    again = await make_store()
    assert again.last_report.clean and again.last_report.corrupt_records == 0  # not scanned
    assert again.contains(3)  # the snapshot's word is taken...
    with pytest.raises(MessageUnreadable):
        again.read(3)  # ...and the read's CRC check still catches the damage


async def test_start_after_a_full_last_file_links_the_new_one(make_store) -> None:
    store = await filled(make_store, n=6, file_size_limit=3000)  # files 1, 2 full
    await store.stop()
    again = await make_store(file_size_limit=3000)
    summary = again._summary
    assert again.stats()["current_file"] == 3
    assert summary[2].right == 3 and summary[3].left == 2
