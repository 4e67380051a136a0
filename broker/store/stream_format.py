"""The on-disk format of a stream's log (docs/STORAGE.md, "Streams"). Pure functions over file
descriptors: no event loop, no writes. The broker's log (stream_log.py), its readers
(stream_reader.py) and the offline Spark reader all parse the files through these.

A stream directory holds segment files named by the offset of their first message, each with
a sparse index beside it::

    <first offset:020d>.hstr  file header (16 B): magic "HSTR" | version u16 | kind u16 | first u64
                              then chunks, in the message store's record framing (segment.py):
                              crc32 u32 | length u32 | type u8 (3) | first offset u64 | time u64
                              | payload: count u32, then count x (length u32 | Message.encode())
    <first offset:020d>.hidx  file header (16 B): magic "HSIX" | ... | first u64
                              then one entry per chunk: offset u64 | time u64 | position u64
                              | count u32

A chunk is what the stream appended in one go (one queue turn, at most about 1 MiB): its
messages have consecutive offsets from `first offset`, and `time` (ms since the epoch, never
decreasing within a stream) is the timestamp a consumer's `x-stream-offset` timestamp is
compared with. The CRC covers the whole chunk, so a scan tells a torn write at the tail from
data. The index holds nothing the segment does not: recovery rebuilds what is missing of it."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from broker.message import Message
from broker.store.segment import (
    FILE_HEADER_SIZE,
    RECORD_HEADER_SIZE,
    BadHeader,
    encode_file_header,
    encode_record_header,
    parse_file_header,
    record_checks,
    unpack_record_header,
)

__all__ = [
    "FILE_HEADER_SIZE",
    "INDEX_ENTRY_SIZE",
    "INDEX_MAGIC",
    "INDEX_SUFFIX",
    "REC_CHUNK",
    "SEGMENT_MAGIC",
    "SEGMENT_SUFFIX",
    "BadHeader",
    "ChunkInfo",
    "SegmentDamage",
    "SegmentScan",
    "chunk_bytes",
    "chunk_messages",
    "chunk_records",
    "encode_index_entry",
    "find_entry",
    "index_entries",
    "index_entry",
    "index_header",
    "index_path",
    "iter_chunks",
    "list_segments",
    "read_chunk",
    "scan_segment",
    "segment_header",
    "segment_path",
    "walk_segment",
]

SEGMENT_SUFFIX = ".hstr"
INDEX_SUFFIX = ".hidx"
SEGMENT_MAGIC = b"HSTR"
INDEX_MAGIC = b"HSIX"
REC_CHUNK = 3  # the store's record types: 1 message, 2 compaction commit (segment.py)

_M64 = (1 << 64) - 1
_U32 = struct.Struct(">I")
_ENTRY = struct.Struct(">QQQI")
INDEX_ENTRY_SIZE = _ENTRY.size  # 28


class ChunkInfo(NamedTuple):
    """Where a chunk is and what it holds: offsets offset .. offset+messages-1."""

    position: int  # of its record header in the segment file
    offset: int
    timestamp: int  # ms since the epoch
    messages: int
    end: int  # position after it


def segment_path(directory: Path, first: int) -> Path:
    return directory / f"{first:020d}{SEGMENT_SUFFIX}"


def index_path(directory: Path, first: int) -> Path:
    return directory / f"{first:020d}{INDEX_SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    """The first offsets of the segment files in `directory`, ascending."""
    found = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        stem, dot, suffix = name.partition(".")
        if dot and "." + suffix == SEGMENT_SUFFIX and stem.isdigit():
            found.append(int(stem))
    return sorted(found)


def segment_header(first: int) -> bytes:
    return encode_file_header(first, magic=SEGMENT_MAGIC)


def index_header(first: int) -> bytes:
    return encode_file_header(first, magic=INDEX_MAGIC)


# -- chunks -------------------------------------------------------------------------------
def chunk_bytes(first: int, timestamp: int, records: Sequence[bytes]) -> bytes:
    """One chunk (record header + payload) holding `records` (Message.encode() bytes)."""
    parts = [_U32.pack(len(records))]
    for rec in records:
        parts.append(_U32.pack(len(rec)))
        parts.append(rec)
    payload = b"".join(parts)
    return encode_record_header(first << 64 | timestamp, payload, REC_CHUNK) + payload


def _info(header: bytes, position: int, payload: bytes) -> ChunkInfo:
    _, length, _, rid = unpack_record_header(header)
    return ChunkInfo(position, rid >> 64, rid & _M64, _U32.unpack_from(payload)[0],
                     position + RECORD_HEADER_SIZE + length)


def read_chunk(fd: int, position: int, limit: int) -> tuple[ChunkInfo, bytes] | None:
    """The chunk at `position` of a segment whose valid bytes end at `limit`, with its
    payload; None when no whole chunk that checks out starts there (a torn or damaged one)."""
    if position + RECORD_HEADER_SIZE > limit:
        return None
    header = os.pread(fd, RECORD_HEADER_SIZE, position)
    if len(header) < RECORD_HEADER_SIZE:
        return None
    _, length, rtype, _ = unpack_record_header(header)
    end = position + RECORD_HEADER_SIZE + length
    if rtype != REC_CHUNK or length < 4 or end > limit:
        return None
    payload = os.pread(fd, length, position + RECORD_HEADER_SIZE)
    if len(payload) < length or not record_checks(header, payload):
        return None
    return _info(header, position, payload), payload


def iter_chunks(fd: int, start: int, limit: int) -> Iterator[tuple[ChunkInfo, bytes]]:
    """The chunks from `start` on, up to the first that does not check out."""
    pos = start
    while True:
        got = read_chunk(fd, pos, limit)
        if got is None:
            return
        yield got
        pos = got[0].end


def chunk_records(payload: bytes) -> list[tuple[int, int]]:
    """(start, end) in `payload` of each message of a chunk that checked out."""
    (count,) = _U32.unpack_from(payload)
    spans = []
    pos = 4
    for _ in range(count):
        (n,) = _U32.unpack_from(payload, pos)
        pos += 4
        spans.append((pos, pos + n))
        pos += n
    return spans


def chunk_messages(payload: bytes) -> list[Message]:
    return [Message.decode(payload, 0, a, b) for a, b in chunk_records(payload)]


# -- the index ----------------------------------------------------------------------------
def encode_index_entry(info: ChunkInfo) -> bytes:
    return _ENTRY.pack(info.offset, info.timestamp, info.position, info.messages)


def index_entry(fd: int, i: int) -> ChunkInfo | None:
    """Entry `i` of an index file (None past its end). `end` is not stored: it is 0."""
    raw = os.pread(fd, INDEX_ENTRY_SIZE, FILE_HEADER_SIZE + i * INDEX_ENTRY_SIZE)
    if len(raw) < INDEX_ENTRY_SIZE:
        return None
    offset, ts, pos, count = _ENTRY.unpack(raw)
    return ChunkInfo(pos, offset, ts, count, 0)


def index_entries(fd: int) -> int:
    """How many whole entries an index file holds."""
    return max(0, (os.fstat(fd).st_size - FILE_HEADER_SIZE) // INDEX_ENTRY_SIZE)


def find_entry(fd: int, entries: int, key: int, by_time: bool = False) -> int:
    """By offset: the last entry whose chunk starts at or before offset `key` (-1 if none).
    By time: the first entry whose time is at or after `key` (`entries` if none)."""
    lo, hi = 0, entries
    while lo < hi:
        mid = (lo + hi) // 2
        e = index_entry(fd, mid)
        assert e is not None
        if (e.timestamp < key) if by_time else (e.offset <= key):
            lo = mid + 1
        else:
            hi = mid
    return lo if by_time else lo - 1


# -- a whole segment, for recovery and offline readers ------------------------------------
class SegmentDamage(NamedTuple):
    """Bytes of a segment that are not a chunk that checks out."""

    what: str  # "corrupt chunk" (good chunks follow) or "torn tail"
    position: int
    length: int


def walk_segment(directory: Path, first: int) -> Iterator[tuple[ChunkInfo, bytes] | SegmentDamage]:
    """Every chunk of a segment that checks out, in order, and the damage between them: at a
    chunk that fails, the walk goes on at the next chunk the segment's index names (a corrupt
    chunk), or stops (a torn tail). The offline readers' walk (hare-store, hare-ctl verify);
    readers in the broker skip damage the same way (stream_reader.py)."""
    fd = os.open(segment_path(directory, first), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = FILE_HEADER_SIZE
        while pos < size:
            got = read_chunk(fd, pos, size)
            if got is not None:
                yield got
                pos = got[0].end
                continue
            after = _next_indexed(directory, first, pos)
            if after is None:
                yield SegmentDamage("torn tail", pos, size - pos)
                return
            yield SegmentDamage("corrupt chunk", pos, after - pos)
            pos = after
    finally:
        os.close(fd)


def _next_indexed(directory: Path, first: int, pos: int) -> int | None:
    """The position of the first chunk the segment's index names after `pos`."""
    try:
        fd = os.open(index_path(directory, first), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        n = index_entries(fd)
        lo, hi = 0, n
        while lo < hi:  # the entries' positions ascend
            mid = (lo + hi) // 2
            e = index_entry(fd, mid)
            assert e is not None
            if e.position <= pos:
                lo = mid + 1
            else:
                hi = mid
        e = index_entry(fd, lo) if lo < n else None
        return e.position if e is not None else None
    finally:
        os.close(fd)


@dataclass(slots=True)
class SegmentScan:
    """What a segment holds, as recovery and `hare-store` establish it."""

    first: int  # the offset the file is named after
    chunks: int = 0
    end_offset: int = 0  # the offset after its last message
    first_time: int = 0
    last_time: int = 0
    last_chunk: int = -1  # offset of its last chunk
    good_end: int = FILE_HEADER_SIZE  # where its last good chunk ends
    size: int = 0  # bytes in the file
    rebuilt: int = 0  # index entries recovery had to write


def scan_segment(directory: Path, first: int) -> tuple[SegmentScan, list[ChunkInfo]]:
    """Read a segment through its index: the index entries that point at a chunk that checks
    out are trusted up to the last such one (at most a few are tried, from the end), and
    the segment is walked from there on. Returns the summary and the chunks found after the
    trusted entries (those the index lacks). BadHeader for a file that is not a segment."""
    path = segment_path(directory, first)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        kind_first = parse_file_header(os.pread(fd, FILE_HEADER_SIZE, 0), SEGMENT_MAGIC)[1]
        if kind_first != first:
            raise BadHeader(f"segment {path.name} names offset {kind_first}")
        scan = SegmentScan(first, end_offset=first, size=size)
        start = FILE_HEADER_SIZE
        trusted = _trusted_entries(directory, first, fd, size)
        if trusted is not None:
            n, head, last = trusted
            scan.chunks, scan.first_time = n, head.timestamp
            scan.last_time, scan.last_chunk = last.timestamp, last.offset
            scan.end_offset = last.offset + last.messages
            start = scan.good_end = last.end
        missing = []
        for info, _ in iter_chunks(fd, start, size):
            missing.append(info)
            if not scan.chunks:
                scan.first_time = info.timestamp
            scan.chunks += 1
            scan.last_time, scan.last_chunk = info.timestamp, info.offset
            scan.end_offset = info.offset + info.messages
            scan.good_end = info.end
        return scan, missing
    finally:
        os.close(fd)


def _trusted_entries(directory: Path, first: int, seg_fd: int, size: int
                     ) -> tuple[int, ChunkInfo, ChunkInfo] | None:
    """(entries kept, first entry, last kept entry with its end) of the index, or None."""
    try:
        fd = os.open(index_path(directory, first), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            parse_file_header(os.pread(fd, FILE_HEADER_SIZE, 0), INDEX_MAGIC)
        except BadHeader:
            return None
        n = index_entries(fd)
        head = index_entry(fd, 0)
        for i in range(n - 1, max(-1, n - 9), -1):
            e = index_entry(fd, i)
            assert e is not None
            got = read_chunk(seg_fd, e.position, size)
            if got is not None and got[0][1:4] == e[1:4]:
                assert head is not None
                return i + 1, head, got[0]
        return None
    finally:
        os.close(fd)
