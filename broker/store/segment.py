"""The on-disk format of message-store segment files, and the one seam where bytes hit the disk.

A segment file is a 16-byte header followed by records::

    file header : magic "HSEG" | version u16 | kind u16 | file number u64
    record      : crc32 u32 | payload length u32 | type u8 | msg_id u128 | payload

The CRC covers everything after itself (length, type, id, payload), so a scan tells a torn
write (short or failing record at the tail) from a good record, and a zero-filled hole (type 0)
from a message. Pure functions here; file handles are opened by the callers."""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "COMPACT_SUFFIX",
    "FILE_HEADER_SIZE",
    "RECORD_HEADER_SIZE",
    "REC_COMMIT",
    "REC_MSG",
    "SEGMENT_SUFFIX",
    "BadHeader",
    "CorruptRecord",
    "FileWriter",
    "ScanResult",
    "decode_record",
    "encode_file_header",
    "encode_record_header",
    "parse_file_header",
    "record_checks",
    "scan_records",
    "segment_name",
    "segment_number",
    "unpack_record_header",
]

SEGMENT_SUFFIX = ".hseg"
COMPACT_SUFFIX = ".hcmp"  # a compaction's temporary copy (see compaction.py)
SEGMENT_MAGIC = b"HSEG"
FORMAT_VERSION = 1

REC_MSG = 1  # a message body
REC_COMMIT = 2  # end marker of a complete compaction file

_FILE_HEADER = struct.Struct(">4sHHQ")
FILE_HEADER_SIZE = _FILE_HEADER.size  # 16
_CRC = struct.Struct(">I")
_TAIL = struct.Struct(">IBQQ")  # length, type, msg_id high, msg_id low
RECORD_HEADER_SIZE = _CRC.size + _TAIL.size  # 25
_REC = struct.Struct(">IIBQQ")
_M64 = (1 << 64) - 1
_VALID_TYPES = frozenset((REC_MSG, REC_COMMIT))


class BadHeader(ValueError):
    """A file whose header is not ours (wrong magic, unknown version, too short)."""


class CorruptRecord(ValueError):
    """A record whose CRC, type or length does not check out."""


def segment_name(number: int) -> str:
    return f"{number:08d}{SEGMENT_SUFFIX}"


def segment_number(path: Path) -> int | None:
    """The file number of a segment or compaction file name, None for anything else."""
    stem, suffix = path.stem, path.suffix
    if suffix not in (SEGMENT_SUFFIX, COMPACT_SUFFIX) or not stem.isdigit():
        return None
    return int(stem)


def encode_file_header(number: int, kind: int = 0, magic: bytes = SEGMENT_MAGIC) -> bytes:
    return _FILE_HEADER.pack(magic, FORMAT_VERSION, kind, number)


def parse_file_header(buf: bytes | memoryview, magic: bytes = SEGMENT_MAGIC) -> tuple[int, int]:
    """(kind, number) from a file header; BadHeader if it is not a header of ours."""
    if len(buf) < FILE_HEADER_SIZE:
        raise BadHeader(f"file shorter than its header ({len(buf)} bytes)")
    got, version, kind, number = _FILE_HEADER.unpack_from(buf)
    if got != magic:
        raise BadHeader(f"bad magic {bytes(got)!r}")
    if version != FORMAT_VERSION:
        raise BadHeader(f"unknown format version {version}")
    return kind, number


def encode_record_header(msg_id: int, payload: bytes, rtype: int = REC_MSG) -> bytes:
    """The 25-byte header for `payload`; write it immediately before the payload."""
    tail = _TAIL.pack(len(payload), rtype, msg_id >> 64, msg_id & _M64)
    return _CRC.pack(zlib.crc32(payload, zlib.crc32(tail))) + tail


def unpack_record_header(buf: bytes | memoryview, pos: int = 0) -> tuple[int, int, int, int]:
    """(crc, payload length, type, id) of the record header at `pos`, unchecked: for readers
    of other record kinds in the same framing (the stream log's chunks)."""
    crc, length, rtype, hi, lo = _REC.unpack_from(buf, pos)
    return crc, length, rtype, hi << 64 | lo


def record_checks(header: bytes | memoryview, payload: bytes | memoryview) -> bool:
    """Whether a record's CRC (the first field of its 25-byte `header`) covers the rest of the
    header and `payload` as written by encode_record_header."""
    tail = zlib.crc32(header[_CRC.size : RECORD_HEADER_SIZE])
    return zlib.crc32(payload, tail) == _CRC.unpack_from(header)[0]


def decode_record(buf: bytes | memoryview, msg_id: int) -> bytes:
    """The payload of one whole record read back from disk; CorruptRecord if it does not check
    out or is not the record of `msg_id`."""
    if len(buf) < RECORD_HEADER_SIZE:
        raise CorruptRecord(f"short read: {len(buf)} bytes")
    crc, length, rtype, hi, lo = _REC.unpack_from(buf)
    if rtype != REC_MSG or length != len(buf) - RECORD_HEADER_SIZE:
        raise CorruptRecord(f"bad record header (type {rtype}, length {length})")
    if (hi << 64 | lo) != msg_id:
        raise CorruptRecord("record belongs to another message")
    if zlib.crc32(buf[_CRC.size :]) != crc:
        raise CorruptRecord("checksum mismatch")
    return bytes(buf[RECORD_HEADER_SIZE:])


@dataclass(slots=True)
class ScanResult:
    """What a scan of one file's records found."""

    records: list[tuple[int, int, int]] = field(default_factory=list)  # (msg_id, offset, size)
    commits: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, payload)
    good_end: int = 0  # end of the last good record: where a torn tail is cut off
    torn_bytes: int = 0  # bytes after good_end that do not form a record
    corrupt: list[tuple[int, int]] = field(default_factory=list)  # (offset, length) skipped


def _record_at(buf: bytes, pos: int, n: int) -> tuple[int, int, int] | None:
    """(type, msg_id, end) if a valid record starts at pos, else None."""
    if n - pos < RECORD_HEADER_SIZE:
        return None
    crc, length, rtype, hi, lo = _REC.unpack_from(buf, pos)
    end = pos + RECORD_HEADER_SIZE + length
    if rtype not in _VALID_TYPES or end > n:
        return None
    if zlib.crc32(buf[pos + _CRC.size : end]) != crc:
        return None
    return rtype, hi << 64 | lo, end


def _resync(buf: bytes, pos: int, n: int) -> int:
    """The offset of the next valid record at or after pos, -1 if there is none."""
    type_at = _CRC.size + 4  # offset of the type byte inside a record
    probe = pos + type_at
    while True:
        hits = [i for i in (buf.find(b"\x01", probe), buf.find(b"\x02", probe)) if i >= 0]
        if not hits:
            return -1
        cand = min(hits) - type_at
        if _record_at(buf, cand, n) is not None:
            return cand
        probe = cand + type_at + 1


def scan_records(buf: bytes, start: int = FILE_HEADER_SIZE) -> ScanResult:
    """Walk the records of a file image. A failing record followed by good ones is skipped and
    reported as corrupt (first trying its own length, then searching); failing bytes with no
    good record after them are the torn tail."""
    res = ScanResult(good_end=start)
    n = len(buf)
    pos = start
    while pos < n:
        rec = _record_at(buf, pos, n)
        if rec is not None:
            rtype, msg_id, end = rec
            if rtype == REC_MSG:
                res.records.append((msg_id, pos, end - pos))
            else:
                res.commits.append((pos, buf[pos + RECORD_HEADER_SIZE : end]))
            pos = res.good_end = end
            continue
        nxt = -1
        if n - pos >= RECORD_HEADER_SIZE:  # trust the length field first (payload damage)
            (length,) = struct.unpack_from(">I", buf, pos + _CRC.size)
            skip = pos + RECORD_HEADER_SIZE + length
            if skip < n and _record_at(buf, skip, n) is not None:
                nxt = skip
        if nxt < 0:
            nxt = _resync(buf, pos + 1, n)
        if nxt < 0:
            break
        res.corrupt.append((pos, nxt - pos))
        pos = nxt
    res.torn_bytes = n - pos if pos < n else 0
    return res


class FileWriter:
    """Where bytes meet the disk. Tests swap in a subclass that raises OSError(ENOSPC) to
    exercise the full-disk path; everything else in the store goes through these methods."""

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fallocate(self, fd: int, length: int) -> None:
        """Reserve blocks up to length, so a later overwrite cannot hit ENOSPC half-way."""
        try:
            os.posix_fallocate(fd, 0, length)
        except OSError as e:
            if e.errno not in (95, 22):  # EOPNOTSUPP / EINVAL: filesystem cannot; carry on
                raise

    def create(self, path: Path, header: bytes, sync: bool) -> int:
        """Create a new file holding only `header`; returns an O_RDWR descriptor."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self.pwrite(fd, header, 0)
            if sync:
                self.fsync(fd)
                fsync_dir(path.parent)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return fd


def fsync_dir(directory: Path) -> None:
    """Make file creations, renames and deletions in directory durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
