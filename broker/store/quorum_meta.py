"""A quorum queue member's own state beside its queue index: the epoch it knows, the position
of the replicated log it holds, the leader epochs its entries came through, and each returned
message's delivery count. Pure format functions and one small file writer; the queue index
(queue_index.py) keeps the messages themselves.

``member.hqm`` in the queue's index directory::

    file header : magic "HQMX" | version u16 = 1 | reserved u16
    record      : crc32 u32 | body length u32 | type u8 | body
      STATE  1  : epoch u64 | last_epoch u64 | pos u64 | flags u8 | n u16 |
                  n x (epoch u64 | first seq_id u64)
      COUNTS 2  : n x (seq_id u64 | delivery count u32)        (0: forget the entry)

The CRC covers length, type and body (as the index's records). A STATE record is appended after
every group commit, COUNTS records with the returns since the last one; the last STATE that
checks out is the member's state, COUNTS records replay in order. A failing record with nothing
good after it is a torn write (cut off); one with good records after it means the file was
damaged, and then the member's position cannot be trusted: `MetaScan.damaged` is set and the
member must not vote until a leader has copied the queue to it again (docs/CLUSTER.md). The file
is rewritten (tmp + fsync + rename) when it passes `COMPACT_BYTES`."""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from broker.store.queue_index_files import fsync_dir

__all__ = [
    "COMPACT_BYTES",
    "META_FILE",
    "MemberState",
    "MetaFile",
    "MetaScan",
    "encode_counts",
    "encode_state",
    "scan_meta",
]

META_FILE = "member.hqm"
COMPACT_BYTES = 1 << 20
MAGIC = b"HQMX"
VERSION = 1
REC_STATE = 1
REC_COUNTS = 2
FLAG_VOTER = 1  # the member holds the queue as of `pos`: it may vote in an election

_HEADER = struct.Struct(">4sHH")
_REC_HEAD = struct.Struct(">IIB")  # crc, body length, type
_STATE = struct.Struct(">QQQBH")
_EPOCH = struct.Struct(">QQ")
_COUNT = struct.Struct(">QI")
_MAX_HISTORY = 64  # leader epochs kept (older ones: a follower that old is copied afresh)


@dataclass(slots=True)
class MemberState:
    """`epoch`: the highest leader epoch this member has seen (it refuses older leaders);
    `last_epoch`, `pos`: the epoch and log position of the leader whose batches it last
    applied; `voter`: it holds the queue as of `pos`; `history`: (epoch, first seq_id) of the
    leaders its entries came through, oldest first."""

    epoch: int = 0
    last_epoch: int = 0
    pos: int = 0
    voter: bool = False
    history: list[tuple[int, int]] = field(default_factory=list)

    def copy(self) -> MemberState:
        return MemberState(self.epoch, self.last_epoch, self.pos, self.voter,
                           list(self.history))


@dataclass(slots=True)
class MetaScan:
    state: MemberState | None = None
    counts: dict[int, int] = field(default_factory=dict)
    good_end: int = _HEADER.size
    torn_bytes: int = 0
    damaged: bool = False


def _record(rtype: int, body: bytes) -> bytes:
    tail = _REC_HEAD.pack(0, len(body), rtype)[4:]
    return struct.pack(">I", zlib.crc32(body, zlib.crc32(tail))) + tail + body


def encode_state(state: MemberState) -> bytes:
    history = state.history[-_MAX_HISTORY:]
    body = _STATE.pack(state.epoch, state.last_epoch, state.pos,
                       FLAG_VOTER if state.voter else 0, len(history))
    body += b"".join(_EPOCH.pack(e, s) for e, s in history)
    return _record(REC_STATE, body)


def encode_counts(counts: Iterable[tuple[int, int]]) -> bytes:
    body = b"".join(_COUNT.pack(seq, count) for seq, count in counts)
    return _record(REC_COUNTS, body) if body else b""


def _parse(rtype: int, body: bytes, scan: MetaScan) -> bool:
    if rtype == REC_STATE:
        if len(body) < _STATE.size:
            return False
        epoch, last, pos, flags, n = _STATE.unpack_from(body)
        if len(body) != _STATE.size + n * _EPOCH.size:
            return False
        history = [_EPOCH.unpack_from(body, _STATE.size + i * _EPOCH.size) for i in range(n)]
        scan.state = MemberState(epoch, last, pos, bool(flags & FLAG_VOTER), history)
        return True
    if rtype == REC_COUNTS:
        if len(body) % _COUNT.size:
            return False
        for seq, count in _COUNT.iter_unpack(body):
            if count:
                scan.counts[seq] = count
            else:
                scan.counts.pop(seq, None)
        return True
    return False


def scan_meta(buf: bytes) -> MetaScan:
    """Replay a member file image (the one parser of the format). A file that is not ours
    scans as damaged with no state."""
    scan = MetaScan()
    if len(buf) < _HEADER.size or _HEADER.unpack_from(buf)[:2] != (MAGIC, VERSION):
        scan.damaged = bool(buf)
        scan.good_end = 0
        return scan
    pos, n = _HEADER.size, len(buf)
    while pos < n:
        if n - pos < _REC_HEAD.size:
            break
        crc, length, rtype = _REC_HEAD.unpack_from(buf, pos)
        end = pos + _REC_HEAD.size + length
        if end > n or zlib.crc32(buf[pos + 4:end]) != crc:
            break
        if not _parse(rtype, bytes(buf[pos + _REC_HEAD.size:end]), scan):
            scan.damaged = True
            break
        pos = scan.good_end = end
    if pos < n:
        scan.torn_bytes = n - pos
        # good records after the failing one: damage, not a torn tail
        scan.damaged = scan.damaged or _anything_good_after(buf, pos + 1)
    return scan


def _anything_good_after(buf: bytes, start: int) -> bool:
    n = len(buf)
    for pos in range(start, n - _REC_HEAD.size + 1):
        crc, length, rtype = _REC_HEAD.unpack_from(buf, pos)
        end = pos + _REC_HEAD.size + length
        if rtype in (REC_STATE, REC_COUNTS) and end <= n and zlib.crc32(buf[pos + 4:end]) == crc:
            return True
    return False


class MetaFile:
    """The member file of one queue member. `load` once at open (it cuts a torn tail);
    `append` + `sync` from the group commit's worker thread; `rewrite` compacts it."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / META_FILE
        self.size = 0
        self._fd = -1

    def load(self) -> MetaScan:
        try:
            buf = self.path.read_bytes()
        except FileNotFoundError:
            return MetaScan()
        scan = scan_meta(buf)
        if scan.torn_bytes and not scan.damaged:
            with open(self.path, "r+b") as f:
                f.truncate(scan.good_end)
        self.size = scan.good_end
        return scan

    def _open(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            if os.fstat(self._fd).st_size == 0:
                os.write(self._fd, _HEADER.pack(MAGIC, VERSION, 0))
                fsync_dir(self.path.parent)
            self.size = os.fstat(self._fd).st_size
        return self._fd

    def append(self, data: bytes) -> None:
        """Write and fsync (called in a worker thread, one call at a time)."""
        fd = self._open()
        os.write(fd, data)
        os.fsync(fd)
        self.size += len(data)

    def rewrite(self, state: MemberState, counts: dict[int, int]) -> None:
        """The file as one STATE and one COUNTS record (worker thread)."""
        tmp = self.path.with_suffix(".tmp")
        data = _HEADER.pack(MAGIC, VERSION, 0) + encode_counts(counts.items())
        data += encode_state(state)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.close()
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        self.size = len(data)

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
