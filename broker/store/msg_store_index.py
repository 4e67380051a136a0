"""The message store's two tables and their clean-shutdown snapshot.

index        msg_id -> MsgLocation(ref_count, file, offset, total_size)
file summary file   -> FileSummary(valid_total_size, file_size, left, right, locked, readers)

Both are plain dicts owned by the MsgStore on the event loop thread. The snapshot is written at
clean shutdown and read back (then deleted) at a clean start:

    header  : magic "HSNP" | version u16 | pad u16 | messages u64 | files u64
    message : msg_id high u64 | msg_id low u64 | ref_count u32 | file u32 | offset u64 | size u32
    file    : file u32 | valid_total_size u64 | file_size u64
    trailer : crc32 u32 of everything before it
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

__all__ = [
    "FAILED",
    "PENDING",
    "REMOVED",
    "FileSummary",
    "MsgLocation",
    "SnapshotError",
    "link_neighbours",
    "read_snapshot",
    "write_snapshot",
]

# MsgLocation.file values that are not files (file numbers start at 1)
PENDING = -1  # accepted by write(), not yet given a place in a file
REMOVED = -2  # removed while pending: the write is cancelled ("flying" elimination)
FAILED = -3  # its write failed (e.g. ENOSPC); the writers were told


class MsgLocation:
    __slots__ = ("file", "offset", "ref_count", "total_size")

    def __init__(self, ref_count: int, file: int, offset: int, total_size: int) -> None:
        self.ref_count = ref_count
        self.file = file
        self.offset = offset
        self.total_size = total_size

    def __repr__(self) -> str:
        return f"<MsgLocation refs={self.ref_count} {self.file}@{self.offset}+{self.total_size}>"


class FileSummary:
    """valid_total_size: bytes of live records; file_size: bytes in the file incl. header;
    locked: under compaction; readers: reads of it in progress off the loop thread."""

    __slots__ = ("file_size", "left", "locked", "readers", "right", "valid_total_size")

    def __init__(self, valid_total_size: int, file_size: int) -> None:
        self.valid_total_size = valid_total_size
        self.file_size = file_size
        self.left: int | None = None
        self.right: int | None = None
        self.locked = False
        self.readers = 0

    def __repr__(self) -> str:
        return (
            f"<FileSummary valid={self.valid_total_size} size={self.file_size} "
            f"left={self.left} right={self.right} locked={self.locked}>"
        )


def link_neighbours(summary: dict[int, FileSummary]) -> None:
    """Set left/right from the ascending file order."""
    prev: int | None = None
    for number in sorted(summary):
        summary[number].left = prev
        summary[number].right = None
        if prev is not None:
            summary[prev].right = number
        prev = number


class SnapshotError(ValueError):
    pass


_MAGIC = b"HSNP"
_VERSION = 1
_HEAD = struct.Struct(">4sHHQQ")
_MSG = struct.Struct(">QQIIQI")
_FILE = struct.Struct(">IQQ")
_CRC = struct.Struct(">I")
_M64 = (1 << 64) - 1


def write_snapshot(
    path: Path, index: dict[int, MsgLocation], summary: dict[int, FileSummary]
) -> None:
    """Write the tables atomically (temp file, fsync, rename, fsync of the directory)."""
    buf = bytearray(_HEAD.size + _MSG.size * len(index) + _FILE.size * len(summary) + _CRC.size)
    _HEAD.pack_into(buf, 0, _MAGIC, _VERSION, 0, len(index), len(summary))
    pos = _HEAD.size
    pack_msg = _MSG.pack_into
    for msg_id, loc in index.items():
        pack_msg(buf, pos, msg_id >> 64, msg_id & _M64, loc.ref_count, loc.file, loc.offset,
                 loc.total_size)
        pos += _MSG.size
    for number, s in summary.items():
        _FILE.pack_into(buf, pos, number, s.valid_total_size, s.file_size)
        pos += _FILE.size
    _CRC.pack_into(buf, pos, zlib.crc32(memoryview(buf)[:pos]))
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(buf)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_snapshot(path: Path) -> tuple[dict[int, MsgLocation], dict[int, FileSummary]]:
    """The tables from a snapshot file; SnapshotError if it is damaged or not ours."""
    data = path.read_bytes()
    if len(data) < _HEAD.size + _CRC.size:
        raise SnapshotError("snapshot too short")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if zlib.crc32(memoryview(data)[: len(data) - _CRC.size]) != crc:
        raise SnapshotError("snapshot checksum mismatch")
    magic, version, _, n_msgs, n_files = _HEAD.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise SnapshotError(f"not a snapshot (magic {magic!r}, version {version})")
    end = _HEAD.size + _MSG.size * n_msgs
    if end + _FILE.size * n_files + _CRC.size != len(data):
        raise SnapshotError("snapshot length does not match its counts")
    index = {
        hi << 64 | lo: MsgLocation(refs, file, offset, size)
        for hi, lo, refs, file, offset, size in _MSG.iter_unpack(data[_HEAD.size : end])
    }
    summary: dict[int, FileSummary] = {}
    for number, valid, size in _FILE.iter_unpack(data[end : len(data) - _CRC.size]):
        summary[number] = FileSummary(valid, size)
    link_neighbours(summary)
    return index, summary
