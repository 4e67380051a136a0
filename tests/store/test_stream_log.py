"""A stream's log on disk: appending in chunks, segments and their sparse index, readers from
every kind of start, recovery of a torn tail and a lost index, retention by whole segments,
a full disk, a damaged chunk, and memory that does not grow with the stream."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from msg_store_helpers import FullDisk

from broker.message import Message
from broker.store.stream_format import (
    INDEX_ENTRY_SIZE,
    iter_chunks,
    list_segments,
    segment_path,
)
from broker.store.stream_log import StreamLog
from broker.store.stream_reader import StreamReader, offset_at_time, start_offset


def msg(i: int, size: int = 10) -> Message:
    return Message("ex", f"rk{i}", b"\x00\x00", (b"%d-" % i).ljust(size, b"x"))


def bodies(got: list[tuple[int, Message]]) -> list[bytes]:
    return [m.body for _, m in got]


@pytest.fixture
async def make_log(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[StreamLog] = []

    async def make(directory: Path | None = None, **options: Any) -> StreamLog:
        slog = StreamLog(directory or tmp_path / "s1", name="s1", **options)
        await slog.open()
        made.append(slog)
        return slog

    yield make
    for slog in made:
        await slog.close()


async def fill(slog: StreamLog, n: int, per_append: int = 10, size: int = 10,
               start: int = 0) -> None:
    for i in range(start, start + n, per_append):
        slog.append([msg(j, size) for j in range(i, min(i + per_append, start + n))])
    await slog.sync()


def read_all(slog: StreamLog, offset: int, batch: int = 7) -> list[tuple[int, Message]]:
    reader = StreamReader(slog, offset)
    out: list[tuple[int, Message]] = []
    while True:
        got = reader.read(batch)
        if not got:
            break
        out.extend(got)
    reader.close()
    return out


async def test_append_read_back_with_offsets(make_log) -> None:
    slog = await make_log()
    assert slog.append([msg(0), msg(1)]) == 0
    assert not StreamReader(slog, 0).read(10)  # nothing readable before it is durable
    await slog.sync()
    assert slog.committed == 2 and slog.last_chunk == 0
    await fill(slog, 98, start=2)
    got = read_all(slog, 0)
    assert [o for o, _ in got] == list(range(100))
    assert bodies(got) == [msg(i).body for i in range(100)]
    assert got[5][1].exchange == "ex" and got[5][1].routing_key == "rk5"
    assert slog.last_chunk == 92  # the last append: 92..99


async def test_segments_roll_and_readers_cross_them(make_log, tmp_path: Path) -> None:
    slog = await make_log(max_segment_bytes=2000)
    await fill(slog, 500, per_append=5, size=50)
    firsts = list_segments(tmp_path / "s1")
    assert len(firsts) > 10 and firsts[0] == 0
    assert [s.first for s in slog.segments] == firsts
    # every segment but the last was rolled at a chunk boundary past the limit
    assert all(s.end_offset == n.first for s, n in zip(slog.segments, slog.segments[1:],
                                                         strict=False))
    for start in (0, 1, 123, 250, 499):
        got = read_all(slog, start, batch=13)
        assert [o for o, _ in got] == list(range(start, 500))
        assert bodies(got) == [msg(i, 50).body for i in range(start, 500)]


async def test_start_offsets(make_log) -> None:
    slog = await make_log(max_segment_bytes=1000)
    assert start_offset(slog, "first") == start_offset(slog, "last") == 0
    await fill(slog, 30, per_append=10)
    before = int(time.time() * 1000)
    time.sleep(0.01)
    await fill(slog, 30, per_append=10, start=30)
    assert start_offset(slog, "first") == 0
    assert start_offset(slog, "last") == 50  # the last chunk
    assert start_offset(slog, "next") == 60 == start_offset(slog, None)
    assert start_offset(slog, 17) == 17
    assert start_offset(slog, -5) == 0 and start_offset(slog, 10**9) == 60
    stamp = datetime.datetime.fromtimestamp(before / 1000, datetime.UTC)
    assert start_offset(slog, stamp) == 30  # the first chunk appended at or after it
    assert start_offset(slog, datetime.datetime(2000, 1, 1)) == 0
    assert start_offset(slog, datetime.datetime(2100, 1, 1)) == 60
    assert start_offset(slog, 3600.0) == 0  # an hour back
    assert offset_at_time(slog, before) == 30


async def test_reopen_continues_where_it_was(make_log, tmp_path: Path) -> None:
    slog = await make_log(max_segment_bytes=3000)
    await fill(slog, 200, per_append=20, size=30)
    await slog.close()
    again = await make_log(max_segment_bytes=3000)
    assert (again.first_offset, again.committed, again.last_chunk) == (0, 200, 180)
    assert again.append([msg(200, 30)]) == 200
    await again.sync()
    assert bodies(read_all(again, 190)) == [msg(i, 30).body for i in range(190, 201)]


async def test_torn_tail_and_index_are_repaired(make_log, tmp_path: Path) -> None:
    directory = tmp_path / "s1"
    slog = await make_log(max_segment_bytes=10_000)
    await fill(slog, 100, per_append=10)
    await slog.close()
    last = list_segments(directory)[-1]
    seg, idx = segment_path(directory, last), directory / f"{last:020d}.hidx"
    good = seg.stat().st_size
    with open(seg, "ab") as f:  # half a chunk: a write torn by a crash
        f.write(b"\x01\x02\x03\x04\x00\x00\x10\x00\x03" + b"\x00" * 20)
    with open(idx, "ab") as f:
        f.write(b"\x00" * (INDEX_ENTRY_SIZE // 2))
    again = await make_log()
    assert again.committed == 100
    assert seg.stat().st_size == good
    assert (idx.stat().st_size - 16) % INDEX_ENTRY_SIZE == 0
    assert bodies(read_all(again, 0)) == [msg(i).body for i in range(100)]


async def test_lost_index_is_rebuilt_from_the_segment(make_log, tmp_path: Path) -> None:
    directory = tmp_path / "s1"
    slog = await make_log(max_segment_bytes=1500)
    await fill(slog, 120, per_append=6)
    await slog.close()
    firsts = list_segments(directory)
    (directory / f"{firsts[1]:020d}.hidx").unlink()
    with open(directory / f"{firsts[-1]:020d}.hidx", "r+b") as f:
        f.truncate(16)  # every entry lost
    again = await make_log()
    assert again.committed == 120 and again.last_chunk == 114
    for start in (firsts[1] + 1, firsts[-1] + 2):
        assert [o for o, _ in read_all(again, start)] == list(range(start, 120))


async def test_retention_by_bytes_drops_whole_segments_from_the_head(make_log, tmp_path
                                                                     ) -> None:
    slog = await make_log(max_segment_bytes=2000, max_bytes=6000)
    reader = StreamReader(slog, 0)
    assert len(reader.read(3)) == 0
    await fill(slog, 400, per_append=4, size=40)
    assert slog.bytes_on_disk <= 6000 + 2000 + 500  # the current segment is never dropped
    first = slog.first_offset
    assert first > 0 and first == slog.segments[0].first
    assert list_segments(tmp_path / "s1")[0] == first
    # a reader whose position was dropped goes on with the first message still there
    got = read_all(slog, 0)
    assert got[0][0] == first and [o for o, _ in got] == list(range(first, 400))
    assert start_offset(slog, "first") == first and start_offset(slog, 3) == first


async def test_retention_by_age(make_log) -> None:
    slog = await make_log(max_segment_bytes=500, max_age_ms=60_000)
    await fill(slog, 40, per_append=4, size=40)
    segments = len(slog.segments)
    assert segments > 3 and slog.apply_retention() == 0  # nothing old yet
    later = int(time.time() * 1000) + 61_000
    assert slog.apply_retention(later) == segments - 1  # all but the current one
    assert slog.first_offset == slog.segments[0].first > 0


async def test_a_full_disk_fails_the_batch_and_the_stream_goes_on(make_log) -> None:
    failed: list[tuple[int, int]] = []
    slog = await make_log(on_failed=lambda a, b: failed.append((a, b)))
    await fill(slog, 10)
    disk = FullDisk()
    slog.file_writer = disk
    disk.full = True
    slog.append([msg(i) for i in range(10, 15)])
    await slog.sync()
    assert failed == [(10, 15)] and slog.committed == 10
    disk.full = False
    slog.append([msg(i) for i in range(15, 20)])
    await slog.sync()
    got = read_all(slog, 0)
    assert [o for o, _ in got] == [*range(10), *range(15, 20)]  # 10..14 were never written
    await slog.close()
    again = StreamLog(slog.directory, name="again")
    await again.open()
    assert [o for o, _ in read_all(again, 0)] == [*range(10), *range(15, 20)]
    await again.close()


async def test_a_damaged_chunk_is_skipped_by_readers(make_log, tmp_path: Path) -> None:
    slog = await make_log()
    await fill(slog, 30, per_append=10, size=20)
    await slog.close()
    seg = segment_path(tmp_path / "s1", 0)
    fd = os.open(seg, os.O_RDONLY)
    chunks = [info for info, _ in iter_chunks(fd, 16, os.fstat(fd).st_size)]
    os.close(fd)
    with open(seg, "r+b") as f:  # a bit flipped inside the middle chunk's payload
        f.seek(chunks[1].position + 40)
        byte = f.read(1)
        f.seek(chunks[1].position + 40)
        f.write(bytes((byte[0] ^ 0xFF,)))
    again = StreamLog(tmp_path / "s1", name="s1", tail_bytes=0)
    await again.open()
    try:
        # recovery trusts the last index entry and reads no further back; the reader skips
        assert again.committed == 30
        assert [o for o, _ in read_all(again, 0)] == [*range(10), *range(20, 30)]
    finally:
        await again.close()


async def test_memory_does_not_grow_with_the_stream(make_log) -> None:
    """The log keeps per segment a summary, and a bounded tail of chunks for readers at
    the end; a reader holds one chunk. Nothing per message."""
    slog = await make_log(max_segment_bytes=256 << 10, tail_bytes=64 << 10)
    for _ in range(40):
        await fill(slog, 1000, per_append=250, size=100, start=slog.next_offset)
    assert slog.committed == 40_000
    assert sum(len(m.body) for _, msgs in slog.tail for m in msgs) <= 64 << 10
    assert len(slog.tail) <= 3
    reader = StreamReader(slog, 0)
    seen = 0
    while got := reader.read(500):
        seen += len(got)
        assert len(reader._msgs) <= 250
    assert seen == 40_000
    reader.close()
