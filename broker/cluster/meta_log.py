"""The meta server's files: an append-only log of changes and a snapshot, in its directory.

``meta.log``::

    file header : magic "HMLG" | version u16 = 1 | reserved u16
    record      : crc32 u32 | body length u32 | type u8 | body
      CHANGE 1  : revision u64 | n u32 |
                  n x (kind u8 (1 put, 2 delete) | lease u64 | key length u32 |
                       value length u32 | key | value)

``meta.snapshot``: the same file header (magic "HMSN") and one record:

      SNAPSHOT 2: revision u64 | n u32 |
                  n x (create u64 | mod u64 | version u64 | lease u64 | key length u32 |
                       value length u32 | key | value)

Big-endian; the CRC covers length, type and body (as the queue index's and quorum member
file's records). Each CHANGE is one revision's events, written and fsynced before anyone is
answered or told of it (several revisions share one fsync when they come together). Recovery
loads the snapshot, replays the CHANGE records above its revision in order, cuts a torn last
record (a failing record with nothing good after it) and refuses a damaged log (good records
after a failing one: definitions would be lost silently). Then the state is written as a new
snapshot and the log starts empty; the same happens when the log passes `SNAPSHOT_BYTES`. The
snapshot is replaced by rename, so a crash leaves the old one or the new one; CHANGE records at
or below the snapshot's revision are skipped, so a crash between the two renames loses
nothing. Keys are kept with their lease: the replay needs them, and `MetaStore.restarted`
drops them after it (leases are not kept across a restart)."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from broker.cluster.meta_store import Event, MetaStore, Record
from broker.store.segment import fsync_dir

__all__ = ["LOG_FILE", "SNAPSHOT_BYTES", "SNAPSHOT_FILE", "Forget", "LogScan", "MetaLog",
           "MetaLogDamaged", "encode_change", "scan_log"]

# (key, value) of every key -> the keys that go at a restart (MetaLog.recover)
Forget = Callable[[list[tuple[bytes, bytes]]], Iterable[bytes]]

LOG_FILE = "meta.log"
SNAPSHOT_FILE = "meta.snapshot"
SNAPSHOT_BYTES = 4 << 20
LOG_MAGIC = b"HMLG"
SNAPSHOT_MAGIC = b"HMSN"
VERSION = 1
REC_CHANGE = 1
REC_SNAPSHOT = 2
PUT, DELETE = 1, 2

_HEADER = struct.Struct(">4sHH")
_REC_HEAD = struct.Struct(">IIB")  # crc, body length, type
_COUNT = struct.Struct(">QI")  # revision, n
_EVENT = struct.Struct(">BQII")
_KEY = struct.Struct(">QQQQII")

Change = tuple[int, list[tuple[bytes, bytes | None, int]]]  # revision, (key, value, lease)


class MetaLogDamaged(Exception):
    """The log or the snapshot cannot be read back: the broker must not start on it."""


def _record(rtype: int, body: bytes) -> bytes:
    tail = _REC_HEAD.pack(0, len(body), rtype)[4:]
    return struct.pack(">I", zlib.crc32(body, zlib.crc32(tail))) + tail + body


def encode_change(events: list[Event]) -> bytes:
    parts = [_COUNT.pack(events[0].revision, len(events))]
    for e in events:
        value = e.record.value if e.record is not None else b""
        lease = e.record.lease if e.record is not None else 0
        parts += [_EVENT.pack(PUT if e.record is not None else DELETE, lease, len(e.key),
                              len(value)), e.key, value]
    return _record(REC_CHANGE, b"".join(parts))


def encode_snapshot(store: MetaStore) -> bytes:
    parts = [_HEADER.pack(SNAPSHOT_MAGIC, VERSION, 0)]
    body = [_COUNT.pack(store.revision, len(store.keys))]
    for key, r in store.keys.items():
        body += [_KEY.pack(r.create_revision, r.mod_revision, r.version, r.lease, len(key),
                           len(r.value)), key, r.value]
    parts.append(_record(REC_SNAPSHOT, b"".join(body)))
    return b"".join(parts)


def _records(buf: bytes, start: int) -> Iterator[tuple[int, int, bytes]]:
    """(end, type, body) of each record that checks out, from start until one does not."""
    pos, n = start, len(buf)
    while n - pos >= _REC_HEAD.size:
        crc, length, rtype = _REC_HEAD.unpack_from(buf, pos)
        end = pos + _REC_HEAD.size + length
        if end > n or zlib.crc32(buf[pos + 4:end]) != crc:
            return
        yield end, rtype, buf[pos + _REC_HEAD.size:end]
        pos = end


def _fields(body: bytes, item: struct.Struct) -> Iterator[tuple[tuple[int, ...], bytes, bytes]]:
    """The n items of a CHANGE or SNAPSHOT body: (fixed fields, key, value)."""
    n = _COUNT.unpack_from(body)[1]
    pos = _COUNT.size
    for _ in range(n):
        fixed = item.unpack_from(body, pos)
        pos += item.size
        key = body[pos:pos + fixed[-2]]
        pos += fixed[-2]
        value = body[pos:pos + fixed[-1]]
        pos += fixed[-1]
        yield fixed, key, value
    if pos != len(body):
        raise struct.error("trailing bytes")


def _decode_change(body: bytes) -> Change:
    revision = _COUNT.unpack_from(body)[0]
    events: list[tuple[bytes, bytes | None, int]] = [
        (key, value if kind == PUT else None, lease)
        for (kind, lease, _, _), key, value in _fields(body, _EVENT)]
    return revision, events


@dataclass(slots=True)
class LogScan:
    changes: list[Change] = field(default_factory=list)
    good_end: int = _HEADER.size
    torn_bytes: int = 0


def scan_log(buf: bytes) -> LogScan:
    """The one parser of meta.log: the changes that check out, and how much tail is torn;
    MetaLogDamaged when a good record follows a bad one."""
    scan = LogScan()
    if not buf:
        scan.good_end = 0
        return scan
    if len(buf) < _HEADER.size or _HEADER.unpack_from(buf)[:2] != (LOG_MAGIC, VERSION):
        raise MetaLogDamaged(f"{LOG_FILE}: not a meta log (bad magic or version)")
    for end, rtype, body in _records(buf, _HEADER.size):
        try:
            if rtype != REC_CHANGE:
                raise struct.error(f"record type {rtype}")
            scan.changes.append(_decode_change(body))
        except struct.error as exc:
            raise MetaLogDamaged(f"{LOG_FILE}: bad record at {scan.good_end}: {exc}") from None
        scan.good_end = end
    scan.torn_bytes = len(buf) - scan.good_end
    for pos in range(scan.good_end + 1, len(buf) - _REC_HEAD.size + 1):
        if next(_records(buf, pos), None) is not None and buf[pos + 8] == REC_CHANGE:
            raise MetaLogDamaged(f"{LOG_FILE}: damaged at byte {scan.good_end}, with good "
                                 f"records after it")
    return scan


def read_snapshot(buf: bytes) -> tuple[int, dict[bytes, Record]]:
    if len(buf) < _HEADER.size or _HEADER.unpack_from(buf)[:2] != (SNAPSHOT_MAGIC, VERSION):
        raise MetaLogDamaged(f"{SNAPSHOT_FILE}: not a meta snapshot (bad magic or version)")
    found = next(_records(buf, _HEADER.size), None)
    if found is None or found[1] != REC_SNAPSHOT or found[0] != len(buf):
        raise MetaLogDamaged(f"{SNAPSHOT_FILE}: damaged")
    body = found[2]
    try:
        records = {key: Record(value, create, mod, version, lease)
                   for (create, mod, version, lease, _, _), key, value in _fields(body, _KEY)}
    except struct.error as exc:
        raise MetaLogDamaged(f"{SNAPSHOT_FILE}: damaged: {exc}") from None
    return _COUNT.unpack_from(body)[0], records


class MetaLog:
    """The two files of one directory. `recover` once at start (on the loop, before
    serving); `write` and `rewrite` from one worker thread at a time."""

    def __init__(self, directory: Path, *, fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self.size = 0
        self._fd = -1

    def recover(self, store: MetaStore,
                forget: Forget | None = None) -> int:
        """Load the files into `store`; the torn bytes cut off the log's tail. `forget`
        picks, from every (key, value), keys that do not outlive the restart either (the
        non-durable definitions of a multi-worker server: MetaServer.start)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        snapshot = self.directory / SNAPSHOT_FILE
        if snapshot.exists():
            store.load(*read_snapshot(snapshot.read_bytes()))
        log_path = self.directory / LOG_FILE
        scan = scan_log(log_path.read_bytes() if log_path.exists() else b"")
        base = store.revision
        for revision, events in scan.changes:
            if revision > base:
                store.apply(revision, events)
        store.restarted(forget([(k, r.value) for k, r in store.keys.items()])
                        if forget is not None else ())
        self.rewrite(encode_snapshot(store))
        return scan.torn_bytes

    def write(self, data: bytes) -> None:
        """Append records and make them durable."""
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        if self.fsync:
            os.fdatasync(self._fd)
        self.size += len(data)

    def rewrite(self, snapshot: bytes) -> None:
        """A new snapshot, then an empty log (each by temp file, fsync, rename)."""
        self._replace(SNAPSHOT_FILE, snapshot)
        self._replace(LOG_FILE, _HEADER.pack(LOG_MAGIC, VERSION, 0))
        self.close()
        self._fd = os.open(self.directory / LOG_FILE, os.O_WRONLY | os.O_APPEND)
        self.size = _HEADER.size

    def _replace(self, name: str, data: bytes) -> None:
        tmp = self.directory / (name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, self.directory / name)
        if self.fsync:
            fsync_dir(self.directory)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
