"""The per-queue index: round trips through real segment files, recovery from damage."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from broker.message import Message
from broker.store.queue_index import IndexEntry, QueueIndex, msg_refs, remove_orphans
from broker.store.queue_index_files import read_queue_index
from broker.store.queue_index_format import (
    FILE_HEADER_SIZE,
    REC_ACK,
    encode_header,
    encode_offsets,
    encode_pub,
    scan_segment,
    segment_file_name,
)

PUB_REF_SIZE = 9 + 25  # record head + seq/msg_id/flags


def segment_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.glob("*.hqi"))


def mid(i: int) -> int:
    """A 128-bit msg_id that uses both halves."""
    return (0xABCD << 64) | i


def payload(i: int) -> bytes:
    return Message("ex", f"rk{i}", b"\x00\x00", b"x" * i).encode()


def test_round_trip_across_segments(tmp_path: Path) -> None:
    qi = QueueIndex(tmp_path / "q", segment_entries=8)
    assert qi.recover() == []
    for seq in range(30):
        qi.publish(seq, mid(seq), payload(seq) if seq % 3 == 0 else None)
    qi.deliver(range(0, 30, 2))
    qi.ack([1, 4, 5, 17, 29])
    qi.close()
    assert len(segment_files(tmp_path / "q")) == 4

    again = QueueIndex(tmp_path / "q", segment_entries=8)
    got = again.recover()
    acked = {1, 4, 5, 17, 29}
    want = [
        IndexEntry(s, mid(s), payload(s) if s % 3 == 0 else None, s % 2 == 0)
        for s in range(30)
        if s not in acked
    ]
    assert got == want
    assert again.bounds() == (0, 30)
    again.ack([0, 2])
    assert again.bounds() == (3, 30)


def test_sparse_seq_ids_far_apart(tmp_path: Path) -> None:
    """A priority queue's levels number from p << 48: reads over the whole span and a
    second recover() visit only the segments that exist, and the clean marker keeps the
    highest seq_id."""
    qi = QueueIndex(tmp_path / "q", segment_entries=8)
    far = [0, 1, (5 << 48) + 3, (255 << 48) + 9]
    for seq in far:
        qi.publish(seq, mid(seq & 0xFFFF), None)
    assert [e.seq_id for e in qi.read(0, 256 << 48)] == far
    assert [e.seq_id for e in qi.recover()] == far
    qi.close()
    again = QueueIndex(tmp_path / "q", segment_entries=8)
    assert [e.seq_id for e in again.recover()] == far
    assert again.bounds() == (0, (255 << 48) + 10)


def test_embedded_payload_decodes_to_the_message(tmp_path: Path) -> None:
    msg = Message("amq.direct", "key", b"\x10\x00\x02", b"hello")
    qi = QueueIndex(tmp_path / "q")
    qi.recover()
    assert qi.should_embed(len(msg.encode()))
    qi.publish(0, msg.msg_id, msg.encode())
    qi.close()
    [entry] = QueueIndex(tmp_path / "q").recover()
    back = Message.decode(entry.payload or b"", entry.msg_id)
    assert (back.exchange, back.routing_key, back.props, back.body) == (
        "amq.direct",
        "key",
        b"\x10\x00\x02",
        b"hello",
    )
    assert back.persistent


def test_embedding_threshold(tmp_path: Path) -> None:
    default = QueueIndex(tmp_path / "a")
    assert default.should_embed(4095) and not default.should_embed(4096)
    small = QueueIndex(tmp_path / "b", embed_below=100)
    assert small.should_embed(99) and not small.should_embed(100)
    never = QueueIndex(tmp_path / "c", embed_below=0)
    assert not never.should_embed(0)


def test_publish_acked_before_flush_never_reaches_disk(tmp_path: Path) -> None:
    qi = QueueIndex(tmp_path / "q", segment_entries=8)
    qi.recover()
    qi.publish(0, mid(0), None)
    qi.deliver([0])
    qi.ack([0])
    qi.sync()
    assert segment_files(tmp_path / "q") == []


def test_fully_acked_segments_are_deleted(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    for seq in range(10):
        qi.publish(seq, mid(seq), None)
    qi.flush()
    assert segment_files(d) == [segment_file_name(n) for n in (0, 1, 2)]
    qi.ack(range(0, 3))
    assert segment_file_name(0) in segment_files(d)  # one entry still un-acked
    qi.ack([3, 4, 5, 6, 7])
    qi.flush()  # deletion waits for the flush, like the ack records it replaces
    assert segment_files(d) == [segment_file_name(2)]
    qi.close()
    assert [e.seq_id for e in QueueIndex(d, segment_entries=4).recover()] == [8, 9]


def test_recover_deletes_a_segment_whose_acks_were_flushed(tmp_path: Path) -> None:
    # A crash can leave a fully acked segment behind (its unlink not yet durable).
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    for seq in range(4):
        qi.publish(seq, mid(seq), None)
    qi.flush()
    leftover = (d / segment_file_name(0)).read_bytes()
    qi.ack(range(4))
    qi.flush()
    assert segment_files(d) == []
    acks = bytearray()
    encode_offsets(acks, REC_ACK, [0, 1, 2, 3])
    (d / segment_file_name(0)).write_bytes(leftover + acks)
    assert QueueIndex(d, segment_entries=4).recover() == []
    assert segment_files(d) == []


def test_read_pages_entries_back_from_disk_and_journal(tmp_path: Path) -> None:
    qi = QueueIndex(tmp_path / "q", segment_entries=8)
    qi.recover()
    for seq in range(20):
        qi.publish(seq, mid(seq), payload(seq) if seq % 2 else None)
        if seq == 11:
            qi.flush()  # 0..11 on disk, 12..19 in the journal
    qi.deliver([3, 13])
    qi.ack([4, 14])
    got = qi.read(2, 16)
    assert [e.seq_id for e in got] == [2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15]
    assert {e.seq_id for e in got if e.delivered} == {3, 13}
    assert all(e.msg_id == mid(e.seq_id) for e in got)
    assert all(e.payload == (payload(e.seq_id) if e.seq_id % 2 else None) for e in got)
    assert qi.read(5, 5) == []
    assert qi.read(100, 200) == []


def test_ack_is_idempotent_and_ignores_unknown_seq_ids(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    qi.publish(0, mid(0), None)
    qi.publish(1, mid(1), None)
    qi.flush()
    qi.ack([0, 0, 7, 1000])  # a double ack must not count twice and delete the segment
    assert segment_files(d) == [segment_file_name(0)]
    qi.close()
    assert [e.seq_id for e in QueueIndex(d, segment_entries=4).recover()] == [1]


def test_clean_shutdown_is_recorded_and_keeps_next_seq(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    assert not qi.clean_shutdown  # a new index
    qi.recover()
    for seq in range(6):
        qi.publish(seq, mid(seq), None)
    qi.ack(range(6))
    qi.close()
    assert segment_files(d) == []

    again = QueueIndex(d, segment_entries=4)
    assert again.clean_shutdown
    assert again.recover() == []
    assert again.bounds() == (6, 6)  # only the clean marker remembers it


def test_dirty_stop_recovers_what_was_flushed(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.close()  # leaves a clean marker...
    qi = QueueIndex(d, segment_entries=4)
    assert qi.clean_shutdown
    qi.recover()
    for seq in range(6):
        qi.publish(seq, mid(seq), None)
    qi.deliver([1])
    qi.flush()
    qi.publish(6, mid(6), None)  # still in the journal when the "crash" comes
    # ...which opening consumed, so this abandoned index reads as a dirty stop.
    again = QueueIndex(d, segment_entries=4)
    assert not again.clean_shutdown
    got = again.recover()
    assert [(e.seq_id, e.delivered) for e in got] == [(s, s == 1) for s in range(6)]
    assert again.bounds() == (0, 6)


def test_torn_last_record_is_dropped_and_logged(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=8)
    qi.recover()
    for seq in range(3):
        qi.publish(seq, mid(seq), None)
    qi.flush()
    path = d / segment_file_name(0)
    full = path.stat().st_size
    os.truncate(path, full - 5)  # the write of record 2 was cut short

    again = QueueIndex(d, segment_entries=8)
    with capture_logs() as logs:
        got = again.recover()
    assert [e.seq_id for e in got] == [0, 1]
    assert again.stats.torn_records == 1 and again.stats.corrupt_records == 0
    assert path.stat().st_size == FILE_HEADER_SIZE + 2 * PUB_REF_SIZE
    assert any(e["event"] == "queue_index.torn_record_dropped" for e in logs)
    # New records go after the cut, so the next recovery reads them.
    again.publish(2, mid(22), None)
    again.close()
    assert [e.msg_id for e in QueueIndex(d, segment_entries=8).recover()] == [
        mid(0),
        mid(1),
        mid(22),
    ]


def test_torn_tail_with_whole_length_but_bad_crc_is_dropped(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=8)
    qi.recover()
    qi.publish(0, mid(0), None)
    qi.publish(1, mid(1), payload(50))
    qi.flush()
    path = d / segment_file_name(0)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # last sector of the last record never written
    path.write_bytes(data)
    again = QueueIndex(d, segment_entries=8)
    assert [e.seq_id for e in again.recover()] == [0]
    assert again.stats.torn_records == 1


def test_torn_header_of_a_new_segment_is_dropped(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    qi.publish(0, mid(0), None)
    qi.close()
    (d / segment_file_name(1)).write_bytes(encode_header(1, 4)[:7])
    again = QueueIndex(d, segment_entries=4)
    assert [e.seq_id for e in again.recover()] == [0]
    assert again.stats.torn_records == 1
    assert segment_files(d) == [segment_file_name(0)]


def test_corrupt_record_in_the_middle_is_skipped_and_segment_rewritten(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=8)
    qi.recover()
    for seq in range(4):
        qi.publish(seq, mid(seq), payload(seq + 10))
    qi.flush()
    qi.ack([3])
    qi.flush()
    path = d / segment_file_name(0)
    data = bytearray(path.read_bytes())
    second = FILE_HEADER_SIZE + PUB_REF_SIZE + len(payload(10))
    data[second + PUB_REF_SIZE + 3] ^= 0x55  # a flipped bit inside record 1's payload
    path.write_bytes(data)

    again = QueueIndex(d, segment_entries=8)
    with capture_logs() as logs:
        got = again.recover()
    assert [e.seq_id for e in got] == [0, 2]  # 1 damaged, 3 acked by the record after it
    assert [e.payload for e in got] == [payload(10), payload(12)]
    assert again.stats.corrupt_records == 1
    assert again.stats.quarantined_segments == 1
    assert any(e["event"] == "queue_index.corrupt_records_skipped" for e in logs)
    [kept] = list((d / "quarantine").iterdir())
    assert kept.read_bytes() == bytes(data)  # the evidence, unchanged
    assert scan_segment(path.read_bytes()).corrupt == []  # the live file is whole again
    again.close()
    third = QueueIndex(d, segment_entries=8)
    assert [e.seq_id for e in third.recover()] == [0, 2]
    assert third.stats.corrupt_records == 0


def test_damaged_length_field_resyncs_on_the_next_good_record(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=8)
    qi.recover()
    for seq in range(4):
        qi.publish(seq, mid(seq), None)
    qi.flush()
    path = d / segment_file_name(0)
    data = bytearray(path.read_bytes())
    data[FILE_HEADER_SIZE + PUB_REF_SIZE + 4] = 0x7F  # record 1's length: now huge
    path.write_bytes(data)
    again = QueueIndex(d, segment_entries=8)
    assert [e.seq_id for e in again.recover()] == [0, 2, 3]
    assert again.stats.corrupt_records == 1


def test_unreadable_segment_is_quarantined(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    for seq in range(8):
        qi.publish(seq, mid(seq), None)
    qi.close()
    bad = d / segment_file_name(0)
    data = bytearray(bad.read_bytes())
    data[0:4] = b"JUNK"
    bad.write_bytes(data)

    again = QueueIndex(d, segment_entries=4)
    with capture_logs() as logs:
        got = again.recover()
    assert [e.seq_id for e in got] == [4, 5, 6, 7]
    assert again.stats.quarantined_segments == 1
    assert not bad.exists()
    [moved] = list((d / "quarantine").iterdir())
    assert moved.read_bytes() == bytes(data)
    assert any(e["event"] == "queue_index.segment_quarantined" for e in logs)
    assert msg_refs(tmp_path) == {mid(s): 1 for s in range(4, 8)}  # quarantine is not read


def test_segment_with_a_foreign_header_number_is_quarantined(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    qi.publish(0, mid(0), None)
    qi.close()
    os.rename(d / segment_file_name(0), d / segment_file_name(3))
    again = QueueIndex(d, segment_entries=4)
    assert again.recover() == []
    assert again.stats.quarantined_segments == 1


def test_segment_size_on_disk_wins_over_configuration(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    for seq in range(6):
        qi.publish(seq, mid(seq), None)
    qi.close()
    again = QueueIndex(d, segment_entries=16384)
    assert again.segment_entries == 4
    assert [e.seq_id for e in again.recover()] == list(range(6))


def test_msg_refs_counts_unacked_store_references(tmp_path: Path) -> None:
    root = tmp_path / "queues"
    a = QueueIndex(root / "vhost" / "a", segment_entries=4)
    b = QueueIndex(root / "vhost" / "b", segment_entries=4)
    for qi in (a, b):
        qi.recover()
    a.publish(0, 100, None)
    a.publish(1, 101, None)
    a.publish(2, 102, payload(1))  # embedded: not the store's business
    a.publish(3, 103, None)
    a.publish(4, 104, None)
    b.publish(0, 100, None)
    b.publish(1, 103, None)
    a.flush()
    a.ack([3])
    a.flush()  # segment 0 of a keeps the pub of 103 and its ack record
    b.flush()
    b.publish(2, 105, None)  # journal only: lost in a crash, so not counted
    assert msg_refs(root) == {100: 2, 101: 1, 103: 1, 104: 1}


def test_msg_refs_skips_what_recovery_quarantines(tmp_path: Path) -> None:
    d = tmp_path / "queues" / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    for seq in range(6):
        qi.publish(seq, mid(seq), None)
    qi.close()
    os.rename(d / segment_file_name(1), d / segment_file_name(2))  # names another segment
    assert msg_refs(tmp_path / "queues", 4) == {mid(s): 1 for s in range(4)}
    assert [e.seq_id for e in QueueIndex(d, segment_entries=4).recover()] == [0, 1, 2, 3]


def test_read_queue_index_changes_nothing_and_names_the_damage(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    for seq in range(10):
        qi.publish(seq, mid(seq), payload(seq) if seq % 2 else None)
    qi.deliver([1, 6])
    qi.ack([2])
    qi.close()
    (d / segment_file_name(1)).write_bytes(b"JUNK" + bytes(30))
    last = d / segment_file_name(2)
    os.truncate(last, last.stat().st_size - 3)  # seq 9's record torn
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    segs = list(read_queue_index(d))  # the segment size comes from the headers
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert [(s.number, s.fault) for s in segs] == [(0, ""), (1, "bad header"), (2, "")]
    first, _, last_seg = (s.scan for s in segs)
    assert first is not None and last_seg is not None
    assert sorted(first.entries) == [0, 1, 3] and first.delivered == {1}
    assert first.entries[1] == (mid(1), payload(1)) and first.entries[0] == (mid(0), None)
    assert sorted(last_seg.entries) == [0] and last_seg.torn_bytes > 0


def test_delete_removes_the_directory(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    qi.publish(0, mid(0), None)
    qi.sync()
    qi.publish(4, mid(4), None)  # a new segment file: the directory needs an fsync too
    qi.flush()
    qi.delete()
    assert not d.exists()
    qi.sync()  # a queue's last batch may still sync after the delete: nothing to do
    assert not d.exists()


def test_journal_limit_forces_a_flush(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=64, max_journal_entries=10)
    qi.recover()
    for seq in range(10):
        qi.publish(seq, mid(seq), None)
    # Dropped without flush or close: only the forced flush reached the file.
    assert len(QueueIndex(d, segment_entries=64).recover()) == 10


def test_sync_in_a_thread_while_publishing(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=64)
    qi.recover()
    stop = threading.Event()
    errors: list[BaseException] = []

    def syncer() -> None:
        try:
            while not stop.is_set():
                qi.sync()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=syncer)
    t.start()
    for seq in range(3000):
        qi.publish(seq, mid(seq), payload(seq % 7) if seq % 2 else None)
        if seq % 3 == 0:
            qi.ack([seq - 3] if seq >= 3 else [])
    stop.set()
    t.join()
    qi.close()
    assert errors == []
    got = QueueIndex(d, segment_entries=64).recover()
    want = [s for s in range(3000) if not (s % 3 == 0 and s + 3 < 3000)]
    assert [e.seq_id for e in got] == want


# -- a model-based property: any sequence of operations, flushes and restarts --------------
ops = st.lists(
    st.one_of(
        st.tuples(st.just("pub"), st.integers(0, 5)),
        st.tuples(st.just("deliver"), st.lists(st.integers(0, 40), max_size=5)),
        st.tuples(st.just("ack"), st.lists(st.integers(0, 40), max_size=5)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(st.just("read"), st.integers(0, 40)),
        st.tuples(st.just("restart"), st.booleans()),
    ),
    max_size=60,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops)
def test_index_matches_a_model(tmp_path_factory: object, script: list[tuple[str, object]]) -> None:
    d = Path(tmp_path_factory.mktemp("qi")) / "q"  # type: ignore[attr-defined]
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    model: dict[int, tuple[bytes | None, bool]] = {}  # seq -> (payload, delivered)
    durable: dict[int, tuple[bytes | None, bool]] = {}  # what a crash now would keep
    next_seq = 0
    for op, arg in script:
        if op == "pub":
            size = int(arg)  # type: ignore[call-overload]
            data = b"p" * size if size % 2 else None
            qi.publish(next_seq, mid(next_seq), data)
            model[next_seq] = (data, False)
            next_seq += 1
        elif op == "deliver":
            qi.deliver(arg)  # type: ignore[arg-type]
            for s in arg:  # type: ignore[attr-defined]
                if s in model:
                    model[s] = (model[s][0], True)
        elif op == "ack":
            qi.ack(arg)  # type: ignore[arg-type]
            for s in arg:  # type: ignore[attr-defined]
                model.pop(s, None)
        elif op == "flush":
            qi.flush()
            durable = dict(model)
        elif op == "read":
            start = int(arg)  # type: ignore[call-overload]
            got = qi.read(start, next_seq)
            assert {e.seq_id: (e.payload, e.delivered) for e in got} == {
                s: v for s, v in model.items() if s >= start
            }
            assert [e.seq_id for e in got] == sorted(e.seq_id for e in got)
        else:
            clean = bool(arg)
            if clean:
                qi.close()
                durable = dict(model)
            else:
                qi._close_fds()  # the "crash": drop the descriptors, not the journal to disk
            qi = QueueIndex(d, segment_entries=4)
            got = qi.recover()
            # A dirty stop loses the journal: un-flushed publishes, delivers and acks.
            assert {e.seq_id: (e.payload, e.delivered) for e in got} == durable
            assert all(e.msg_id == mid(e.seq_id) for e in got)
            model = dict(durable)
            next_seq = max(next_seq, qi.bounds()[1])
    qi.close()
    got = QueueIndex(d, segment_entries=4).recover()
    assert {e.seq_id: (e.payload, e.delivered) for e in got} == model


def test_segment_that_fails_to_read_is_quarantined(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    qi.publish(4, mid(4), None)
    qi.close()
    # A "file" whose read fails with EIO, as a bad disk block would.
    os.symlink("/proc/self/mem", d / segment_file_name(0))
    again = QueueIndex(d, segment_entries=4)
    assert [e.seq_id for e in again.recover()] == [4]
    assert again.stats.quarantined_segments == 1
    assert not (d / segment_file_name(0)).is_symlink()


def test_damaged_record_is_skipped_by_its_length_not_searched_through(tmp_path: Path) -> None:
    # A message body may itself look like an index record; a damaged embedded record must not
    # let recovery pick up such a look-alike from inside its payload.
    fake = bytearray()
    encode_pub(fake, 5, 999, None, False)
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=8)
    qi.recover()
    qi.publish(0, mid(0), b"pad" + bytes(fake))
    qi.publish(1, mid(1), None)
    qi.flush()
    path = d / segment_file_name(0)
    data = bytearray(path.read_bytes())
    data[FILE_HEADER_SIZE + PUB_REF_SIZE] ^= 0x01  # first payload byte of record 0
    path.write_bytes(data)
    again = QueueIndex(d, segment_entries=8)
    assert [e.seq_id for e in again.recover()] == [1]
    assert again.stats.corrupt_records == 1


def test_seq_id_published_again_after_its_ack_survives_the_flush(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    qi.publish(0, mid(0), None)
    qi.publish(1, mid(1), None)
    qi.flush()
    qi.ack([0])
    qi.publish(0, mid(100), None)  # e.g. seq ids reused after a dirty restart
    qi.close()
    got = QueueIndex(d, segment_entries=4).recover()
    assert [(e.seq_id, e.msg_id) for e in got] == [(0, mid(100)), (1, mid(1))]


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past `limit` bytes fail with EFBIG, like a full disk (a real kernel limit)."""
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_failed_write_leaves_no_partial_record_and_keeps_the_journal(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=64)
    qi.recover()
    qi.publish(0, mid(0), None)
    qi.flush()
    path = d / segment_file_name(0)
    size = path.stat().st_size
    qi.publish(1, mid(1), payload(100))
    qi.publish(2, mid(2), None)
    with file_size_limit(size + 50), pytest.raises(OSError) as err:
        qi.sync()  # the write gets part-way (50 bytes), then EFBIG
    assert err.value.errno == errno.EFBIG
    assert path.stat().st_size == size  # cut back: no torn record before later appends
    qi.sync()  # room again: the journal was kept, so the retry writes it
    qi.close()
    again = QueueIndex(d, segment_entries=64)
    assert [e.seq_id for e in again.recover()] == [0, 1, 2]
    assert again.stats.torn_records == again.stats.corrupt_records == 0


def test_failed_header_write_leaves_an_empty_file_the_retry_completes(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    qi.close()  # creates the directory and marker: the limit below only hits segment files
    qi = QueueIndex(d, segment_entries=4)
    qi.recover()
    qi.publish(0, mid(0), None)
    with file_size_limit(10), pytest.raises(OSError):
        qi.flush()
    assert (d / segment_file_name(0)).stat().st_size == 0
    qi.close()
    assert [e.seq_id for e in QueueIndex(d, segment_entries=4).recover()] == [0]


def test_read_single_entries_and_whole_segments_from_disk(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=128)
    qi.recover()
    for seq in range(100):
        qi.publish(seq, mid(seq), payload(seq) if seq % 2 else None)
    qi.close()
    qi = QueueIndex(d, segment_entries=128)
    qi.recover()
    qi.ack([10])
    for seq in (0, 1, 57, 99):  # one pread each
        [e] = qi.read(seq, seq + 1)
        assert (e.seq_id, e.msg_id, e.payload) == (seq, mid(seq), payload(seq) if seq % 2 else None)
    assert qi.read(10, 11) == []
    bulk = qi.read(0, 100)  # one read of the file
    assert [e.seq_id for e in bulk] == [s for s in range(100) if s != 10]
    assert all(e.payload == (payload(e.seq_id) if e.seq_id % 2 else None) for e in bulk)


def test_read_an_entry_embedded_under_a_larger_threshold(tmp_path: Path) -> None:
    d = tmp_path / "q"
    big = payload(6000)
    qi = QueueIndex(d, embed_below=10_000)
    qi.recover()
    qi.publish(0, mid(0), big)
    qi.close()
    qi = QueueIndex(d, embed_below=100)  # the first pread is too short for this record
    qi.recover()
    assert [e.payload for e in qi.read(0, 1)] == [big]


def test_entry_damaged_after_recovery_is_reported_not_returned(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=8)
    qi.recover()
    qi.publish(0, mid(0), None)
    qi.publish(1, mid(1), None)
    qi.flush()
    path = d / segment_file_name(0)
    data = bytearray(path.read_bytes())
    data[FILE_HEADER_SIZE + PUB_REF_SIZE + 20] ^= 0xFF  # inside record 1's msg_id
    path.write_bytes(data)
    with capture_logs() as logs:
        got = qi.read(0, 2)
    assert [e.seq_id for e in got] == [0]
    assert any(e["event"] == "queue_index.entry_unreadable" for e in logs)


def test_publish_before_recover_loads_leftover_segments(tmp_path: Path) -> None:
    d = tmp_path / "q"
    old = QueueIndex(d, segment_entries=4)
    old.recover()
    old.publish(0, mid(0), None)
    old.publish(1, mid(1), None)
    old.close()
    qi = QueueIndex(d, segment_entries=4)
    with capture_logs() as logs:
        qi.publish(2, mid(2), None)  # the owner forgot recover(): nothing is lost or mixed up
    assert any(e["event"] == "queue_index.recover_implied" for e in logs)
    qi.ack([2])  # without the loaded state this emptied "segment" would be deleted, 0 and 1 too
    qi.close()
    assert [e.seq_id for e in QueueIndex(d, segment_entries=4).recover()] == [0, 1]


def test_second_recover_reads_what_the_index_holds(tmp_path: Path) -> None:
    qi = QueueIndex(tmp_path / "q", segment_entries=4)
    assert qi.recover() == []
    qi.publish(0, mid(0), None)
    qi.publish(5, mid(5), payload(5))
    qi.deliver([5])
    assert qi.recover() == [
        IndexEntry(0, mid(0), None, False),
        IndexEntry(5, mid(5), payload(5), True),
    ]


def test_remove_orphans_keeps_only_known_queues(tmp_path: Path) -> None:
    root = tmp_path / "queues"
    for name in ("live", "gone", "gone_clean"):
        qi = QueueIndex(root / name, segment_entries=4)
        qi.recover()
        if name != "gone_clean":
            qi.publish(0, mid(0), None)
            qi.flush()
        else:
            qi.close()  # only a clean marker left
    removed = remove_orphans(root, [root / "live"])
    assert sorted(p.name for p in removed) == ["gone", "gone_clean"]
    assert sorted(p.name for p in root.iterdir()) == ["live"]
    assert msg_refs(root) == {mid(0): 1}


CRASH_CHILD = """
import sys
from pathlib import Path
from broker.store.queue_index import QueueIndex
qi = QueueIndex(Path(sys.argv[1]), segment_entries=64)
qi.recover()
seq = 0
while True:
    for _ in range(10):
        qi.publish(seq, seq * 7, bytes([seq % 256]) * (seq % 50) if seq % 3 else None)
        seq += 1
    qi.ack(range(seq - 10, seq, 4))
    qi.flush()
    print(seq, flush=True)
"""


def test_killed_writer_loses_nothing_it_flushed(tmp_path: Path) -> None:
    d = tmp_path / "q"
    child = subprocess.Popen(
        [sys.executable, "-c", CRASH_CHILD, str(d)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    flushed = 0
    while flushed < 2000:  # wait for its word, not for a clock
        line = child.stdout.readline()
        assert line, "the writer died on its own"
        if line.strip().isdigit():  # other lines are its log
            flushed = int(line)
    child.kill()  # SIGKILL, mid-loop: whatever it was doing stops there
    child.wait()
    child.stdout.close()
    got = QueueIndex(d, segment_entries=64).recover()
    by_seq = {e.seq_id: e for e in got}
    for seq in range(flushed):
        if seq % 10 % 4 == 0:
            assert seq not in by_seq
            continue
        e = by_seq[seq]
        assert e.msg_id == seq * 7
        assert e.payload == (bytes([seq % 256]) * (seq % 50) if seq % 3 else None)
    assert [e.seq_id for e in got] == sorted(by_seq)


def expected_payload(seq: int) -> bytes | None:
    return bytes([seq % 251]) * (seq % 40) if seq % 3 else None


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    count=st.integers(1, 60),
    acked=st.sets(st.integers(0, 59)),
    damage=st.one_of(
        st.tuples(st.just("cut"), st.integers(0, 10_000)),
        st.tuples(st.just("flip"), st.integers(0, 10_000)),
        st.tuples(st.just("flip"), st.integers(0, FILE_HEADER_SIZE * 8 - 1)),  # the header
    ),
    which=st.integers(0, 100),
)
def test_damage_anywhere_never_yields_a_wrong_entry(
    tmp_path_factory: pytest.TempPathFactory,
    count: int,
    acked: set[int],
    damage: tuple[str, int],
    which: int,
) -> None:
    d = tmp_path_factory.mktemp("qi") / "q"
    qi = QueueIndex(d, segment_entries=16)
    qi.recover()
    for seq in range(count):
        qi.publish(seq, mid(seq), expected_payload(seq))
        if seq % 7 == 0:
            qi.flush()
    qi.deliver(range(0, count, 2))
    qi.ack(acked)
    qi.close()
    files = sorted(d.glob("*.hqi"))
    damaged = -1
    if files:
        path = files[which % len(files)]
        damaged = int(path.name.split(".")[0])
        data = bytearray(path.read_bytes())
        kind, at = damage
        if kind == "cut":
            data = data[: at % (len(data) + 1)]
        else:
            data[at // 8 % len(data)] ^= 1 << (at % 8)
        path.write_bytes(data)
    again = QueueIndex(d, segment_entries=16)
    got = again.recover()  # never raises
    for e in got:  # whatever comes back is exactly what was published under that seq_id
        assert 0 <= e.seq_id < count
        assert e.msg_id == mid(e.seq_id)
        assert e.payload == expected_payload(e.seq_id)
    assert [e.seq_id for e in got] == sorted({e.seq_id for e in got})
    live = {s for s in range(count) if s not in acked}
    untouched = {s for s in live if s // 16 != damaged}
    assert untouched <= {e.seq_id for e in got}  # damage stays inside its segment
    again.close()  # and the repaired files read back the same
    assert QueueIndex(d, segment_entries=16).recover() == got


def test_a_damaged_header_cannot_change_the_segment_size_of_the_others(tmp_path: Path) -> None:
    d = tmp_path / "q"
    qi = QueueIndex(d, segment_entries=16)
    qi.recover()
    for seq in range(48):
        qi.publish(seq, mid(seq), None)
    qi.close()
    first = d / segment_file_name(0)
    data = bytearray(first.read_bytes())
    data[11] ^= 0x01  # segment_entries 16 -> 17 in the first file's header
    first.write_bytes(data)
    again = QueueIndex(d, segment_entries=16)
    assert again.segment_entries == 16
    assert [e.seq_id for e in again.recover()] == list(range(16, 48))
    assert again.stats.quarantined_segments == 1
