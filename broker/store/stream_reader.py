"""A reader of a stream's log: one consumer's position, moving forward one chunk at a time.

Reads only what the log has committed (written and fsynced per policy). A position at the
tail is served from the chunks the log keeps in RAM; anything older is read from the segment
files: sequentially while the reader keeps up, through a segment's sparse index when it starts
or jumps. Offsets that are gone (dropped by retention, or never written after a failed write)
are skipped: a reader always goes on with the next offset that exists. A chunk that fails its
CRC at read is logged and skipped (its offsets are known from the index)."""

from __future__ import annotations

import bisect
import datetime
import os
import time
from typing import TYPE_CHECKING

import structlog

from broker.store.stream_format import (
    chunk_messages,
    find_entry,
    index_entry,
    index_path,
    read_chunk,
    segment_path,
)

if TYPE_CHECKING:
    from broker.message import Message
    from broker.store.stream_log import StreamLog

__all__ = ["StreamReader", "offset_at_time", "start_offset"]

log = structlog.get_logger("hare.stream")

_MAX_SKIPS = 64  # damaged chunks or gaps passed in one read before it returns what it has


def _first(chunk: tuple[int, list[Message]]) -> int:
    return chunk[0]


class StreamReader:
    __slots__ = ("_chunk_first", "_fd", "_fd_segment", "_msgs", "_pos", "_pos_offset", "log",
                 "next")

    def __init__(self, stream_log: StreamLog, offset: int) -> None:
        self.log = stream_log
        self.next = offset  # the offset read() returns next
        self._chunk_first = 0  # offset of _msgs[0]
        self._msgs: list[Message] = []  # the chunk being read
        self._fd = -1
        self._fd_segment = -1  # first offset of the segment _fd reads
        self._pos = 0  # in that segment: where the chunk starting at _pos_offset is
        self._pos_offset = -1

    def available(self) -> bool:
        return self.next < self.log.committed

    def read(self, limit: int) -> list[tuple[int, Message]]:
        """Up to `limit` committed messages from `next` on, with their offsets."""
        out: list[tuple[int, Message]] = []
        committed = self.log.committed
        while len(out) < limit and self.next < committed:
            msgs = self._msgs
            i = self.next - self._chunk_first
            if 0 <= i < len(msgs):
                n = min(len(msgs) - i, limit - len(out))
                base = self.next
                out.extend((base + k, msgs[i + k]) for k in range(n))
                self.next = base + n
                continue
            if not self._load():
                break
        return out

    def rewind(self, offset: int) -> None:
        """Read from `offset` again (deliveries its consumer's writer could not take)."""
        self.next = offset

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._msgs = []

    # -- finding the chunk that holds `next` ----------------------------------------------
    def _load(self) -> bool:
        """Make the chunk holding `next` (or the first after it) the current one."""
        slog = self.log
        if self.next < slog.first_offset:
            self.next = slog.first_offset  # dropped by retention: go on with what is there
        tail = slog.tail
        if tail and tail[0][0] <= self.next:
            i = bisect.bisect_right(tail, self.next, key=_first) - 1
            first, msgs = tail[i]
            if self.next >= first + len(msgs):  # in a gap after a failed write
                if i + 1 >= len(tail):
                    return False
                first, msgs = tail[i + 1]
                self.next = first
            self._chunk_first, self._msgs = first, msgs
            return True
        for _ in range(len(slog.segments) + _MAX_SKIPS):
            got = self._from_disk()
            if got is not None:
                return got
        return False

    def _from_disk(self) -> bool | None:
        """One attempt at the chunk holding `next` from the segment files; None to try
        again (moved to another segment, or a segment went meanwhile)."""
        slog = self.log
        segs = slog.segments
        if not segs:
            return False
        seg = segs[slog.segment_for(self.next)]
        if self.next >= seg.end_offset:
            later = [s for s in segs if s.first > self.next]
            if not later:
                return False
            self.next = later[0].first  # a gap between segments
            return None
        try:
            if self._fd_segment != seg.first:
                self.close()
                self._fd = os.open(segment_path(slog.directory, seg.first), os.O_RDONLY)
                self._fd_segment, self._pos_offset = seg.first, -1
            if self._pos_offset != self.next:  # not where the last chunk read ended
                entry = self._seek(seg.first, seg.chunks)
                if entry is None:
                    return None
                self._pos, self._pos_offset = entry
            got = read_chunk(self._fd, self._pos, seg.size)
        except FileNotFoundError:  # dropped by retention meanwhile
            self.close()
            self._fd_segment = -1
            self.next = max(self.next, slog.first_offset)
            return None
        if got is None:
            return self._skip_damaged(seg.first, seg.chunks)
        info, payload = got
        self._pos, self._pos_offset = info.end, info.offset + info.messages
        if info.offset + info.messages <= self.next:
            return None  # a chunk before `next`: the one after it is read next
        self._chunk_first, self._msgs = info.offset, chunk_messages(payload)
        if info.offset > self.next:
            self.next = info.offset
        return True

    def _seek(self, first: int, chunks: int) -> tuple[int, int] | None:
        """(position, offset) of the chunk holding `next` by the segment's index."""
        fd = os.open(index_path(self.log.directory, first), os.O_RDONLY)
        try:
            i = find_entry(fd, chunks, self.next)
            entry = index_entry(fd, max(i, 0))
        finally:
            os.close(fd)
        if entry is None:
            return None
        return entry.position, entry.offset

    def _skip_damaged(self, first: int, chunks: int) -> bool | None:
        """The chunk at _pos does not check out: skip its offsets (the index says which)."""
        fd = os.open(index_path(self.log.directory, first), os.O_RDONLY)
        try:
            i = find_entry(fd, chunks, self.next)
            entry = index_entry(fd, max(i, 0))
            after = index_entry(fd, max(i, 0) + 1) if i + 1 < chunks else None
        finally:
            os.close(fd)
        if entry is None:
            return False
        log.error("stream chunk damaged, skipped", stream=self.log.name, segment=first,
                  position=entry.position, offsets=(entry.offset, entry.offset + entry.messages))
        self.next = max(self.next, entry.offset + entry.messages)
        if after is not None:
            self._pos, self._pos_offset = after.position, after.offset
        else:
            self._pos_offset = -1
        return None


def offset_at_time(stream_log: StreamLog, when_ms: int) -> int:
    """The first offset of the first chunk appended at or after `when_ms`; the next offset
    when there is none."""
    for seg in stream_log.segments:
        if seg.chunks and seg.last_time >= when_ms:
            fd = os.open(index_path(stream_log.directory, seg.first), os.O_RDONLY)
            try:
                entry = index_entry(fd, find_entry(fd, seg.chunks, when_ms, by_time=True))
            finally:
                os.close(fd)
            if entry is not None:
                return entry.offset
    return stream_log.committed


def start_offset(stream_log: StreamLog, spec: object) -> int:
    """Where a consumer starts, from a checked x-stream-offset value (queue/stream_args.py):
    "first", "last" (the last chunk), "next", an offset, a datetime, or a number of seconds
    back from now (an interval such as "1h")."""
    if spec == "first":
        return stream_log.first_offset
    if spec == "last":
        return stream_log.last_chunk if stream_log.last_chunk >= 0 else stream_log.committed
    if spec == "next" or spec is None:
        return stream_log.committed
    if isinstance(spec, datetime.datetime):
        stamp = spec if spec.tzinfo else spec.replace(tzinfo=datetime.UTC)
        return offset_at_time(stream_log, int(stamp.timestamp() * 1000))
    if isinstance(spec, float):  # seconds ago
        return offset_at_time(stream_log, int((time.time() - spec) * 1000))
    assert isinstance(spec, int)
    return min(max(spec, stream_log.first_offset), stream_log.committed)
