"""The per-queue index (RabbitMQ's rabbit_queue_index): which messages a durable queue holds, in
what order, and whether each was delivered; acks remove entries.

One directory per queue, one segment file per `segment_entries` seq ids (format in
queue_index_format.py). Small messages (encoded size below `embed_below`) live in the index entry
itself, so they cost no msg_store write. Operations go to a per-segment journal in memory first:
a publish acked before the next flush never reaches the disk, and a flush writes each touched
segment with one write call. A segment whose entries are all acked is deleted.

Recovery replays every segment: a torn last record is cut off, a damaged record in the middle is
skipped, an unreadable file is moved to ``quarantine/``; each is logged and counted in
`QueueIndex.stats` (the file-level work is in queue_index_files.py). `close()` leaves a clean
marker, so the next start knows the index is whole (and the message store may trust its own
reference counts); `msg_refs()` rebuilds those counts from all queue indexes after a dirty stop.

Thread safety: `sync()` is meant to run in an executor thread while the event loop keeps calling
`publish`/`deliver`/`ack`, so every public method holds one lock; the fsyncs run outside it."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import threading
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

import structlog

from broker.store.queue_index_files import (
    RecoveryStats,
    append,
    existing_segment_entries,
    fsync_dir,
    msg_refs,
    recover_file,
    remove_orphans,
    segment_files,
    take_clean_marker,
    write_clean_marker,
)
from broker.store.queue_index_format import (
    PUB_RECORD_SIZE,
    REC_ACK,
    REC_DELIVER,
    encode_header,
    encode_offsets,
    encode_pub,
    pub_at,
    record_size,
    segment_file_name,
)

__all__ = ["IndexEntry", "QueueIndex", "RecoveryStats", "msg_refs", "remove_orphans"]

log = structlog.get_logger(__name__)

_MAX_OPEN_FILES = 8  # segment descriptors kept open between flushes
_MAX_JOURNAL_BYTES = 4 << 20  # embedded payload bytes buffered before a forced flush
_BULK_READ = 32  # more entries than this from one segment: read the file once
_LIVE_RUN = re.compile(rb"[^\x00]+")  # runs of live entries in a segment's state array

# per-entry state in a segment's state array
_ABSENT = 0
_PUBLISHED = 1
_DELIVERED = 2


@dataclass(slots=True)
class IndexEntry:
    seq_id: int
    msg_id: int
    payload: bytes | None  # embedded Message.encode() bytes; None: the body is in the msg_store
    delivered: bool


class _Segment:
    """In-memory state of one live segment: entry states, where each entry's PUB record sits in
    the file, the unflushed journal, its fd. The two arrays grow as offsets are used, so a queue
    holding a few messages costs bytes, not the 144 KiB of a full segment."""

    __slots__ = ("acks", "dels", "fd", "number", "positions", "pubs", "state", "unacked")

    def __init__(self, number: int) -> None:
        self.number = number
        self.state = bytearray()  # _ABSENT / _PUBLISHED / _DELIVERED per offset
        self.positions = array("Q")  # file position of each offset's PUB record
        self.unacked = 0
        self.pubs: dict[int, tuple[int, bytes | None]] = {}  # offset -> (msg_id, payload)
        self.dels: list[int] = []  # delivers of entries already on disk
        self.acks: list[int] = []  # acks of entries already on disk
        self.fd = -1

    def grow(self, rel: int, limit: int) -> None:
        """Make offset `rel` addressable (doubling, up to the segment size)."""
        new = min(max(rel + 1, 2 * len(self.state), 64), limit)
        add = new - len(self.state)
        self.state.extend(bytes(add))
        self.positions.frombytes(bytes(8 * add))


class QueueIndex:
    def __init__(
        self,
        directory: pathlib.Path,
        *,
        embed_below: int = 4096,
        segment_entries: int = 16384,
        max_journal_entries: int = 32768,
    ) -> None:
        self.directory = pathlib.Path(directory)
        self.embed_below = embed_below
        self.max_journal_entries = max_journal_entries
        self.stats = RecoveryStats()
        self._lock = threading.Lock()
        self._segments: dict[int, _Segment] = {}
        self._dirty: set[int] = set()  # segments with journal entries
        self._unsynced: set[int] = set()  # segments written since the last fsync
        self._dir_unsynced = False  # a segment file was created or removed
        self._journal_ops = 0
        self._journal_bytes = 0
        self._closed = False
        self._recovered = False
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_entries = existing_segment_entries(self.directory, segment_entries)
        if self.segment_entries != segment_entries:
            log.info(
                "queue_index.segment_entries_from_disk",
                directory=str(self.directory),
                configured=segment_entries,
                on_disk=self.segment_entries,
            )
        # Consume the clean marker now: a crash from here on must look dirty to the next start.
        self.clean_shutdown, self._next_seq = take_clean_marker(self.directory)

    # -- writes -------------------------------------------------------------------------------
    def should_embed(self, size: int) -> bool:
        return size < self.embed_below

    def publish(self, seq_id: int, msg_id: int, payload: bytes | None) -> None:
        n = self.segment_entries
        with self._lock:
            if not self._recovered:
                self._recover_implied()
            number, rel = divmod(seq_id, n)
            seg = self._segments.get(number)
            if seg is None:
                seg = self._segments[number] = _Segment(number)
            if rel >= len(seg.state):
                seg.grow(rel, n)
            if not seg.state[rel]:
                seg.unacked += 1
            seg.state[rel] = _PUBLISHED
            seg.pubs[rel] = (msg_id, payload)
            self._dirty.add(number)
            if seq_id >= self._next_seq:
                self._next_seq = seq_id + 1
            self._journal_ops += 1
            if payload is not None:
                self._journal_bytes += len(payload)
            if self._journal_full():
                self._flush_locked()

    def deliver(self, seq_ids: Iterable[int]) -> None:
        n = self.segment_entries
        with self._lock:
            seg: _Segment | None = None
            for seq_id in seq_ids:
                number, rel = divmod(seq_id, n)
                if seg is None or seg.number != number:
                    seg = self._segments.get(number)
                    if seg is None:
                        continue
                if rel >= len(seg.state) or seg.state[rel] != _PUBLISHED:
                    continue  # unknown, acked or delivered already
                seg.state[rel] = _DELIVERED
                if rel not in seg.pubs:  # an unflushed publish carries the flag itself
                    seg.dels.append(rel)
                    self._dirty.add(number)
                    self._journal_ops += 1
            if self._journal_full():
                self._flush_locked()

    def ack(self, seq_ids: Iterable[int]) -> None:
        n = self.segment_entries
        with self._lock:
            seg: _Segment | None = None
            for seq_id in seq_ids:
                number, rel = divmod(seq_id, n)
                if seg is None or seg.number != number:
                    seg = self._segments.get(number)
                    if seg is None:
                        continue
                if rel >= len(seg.state) or not seg.state[rel]:
                    continue  # unknown or acked already: acks are idempotent
                seg.state[rel] = _ABSENT
                seg.unacked -= 1
                if seg.pubs.pop(rel, None) is None:  # on disk: needs an ack record
                    seg.acks.append(rel)
                    self._journal_ops += 1
                self._dirty.add(number)  # the flush writes the ack or deletes the segment
            if self._journal_full():
                self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def sync(self) -> None:
        with self._lock:
            self._flush_locked()
            fds: list[int] = []
            try:
                for number in self._unsynced:
                    seg = self._segments.get(number)
                    if seg is None:
                        continue  # deleted since: nothing left to make durable
                    if seg.fd < 0:
                        seg.fd = self._open_segment(number)
                    fds.append(os.dup(seg.fd))  # our own fd: a concurrent close cannot reuse it
            except BaseException:
                for fd in fds:
                    os.close(fd)
                raise
            self._unsynced.clear()
            sync_dir, self._dir_unsynced = self._dir_unsynced, False
        try:
            for fd in fds:
                os.fsync(fd)
            if sync_dir:
                try:
                    fsync_dir(self.directory)
                except FileNotFoundError:
                    if not self._closed:  # else delete() won a race with this executor thread
                        raise
        finally:
            for fd in fds:
                os.close(fd)

    def close(self) -> None:
        if self._closed:
            return
        self.sync()
        with self._lock:
            self._close_fds()
            write_clean_marker(self.directory, self._next_seq)
            self._closed = True

    def delete(self) -> None:
        with self._lock:
            self._close_fds()
            self._segments.clear()
            self._dirty.clear()
            self._unsynced.clear()
            self._dir_unsynced = False
            shutil.rmtree(self.directory, ignore_errors=True)
            self._closed = True

    # -- reads --------------------------------------------------------------------------------
    def recover(self) -> list[IndexEntry]:
        """Un-acked entries, ascending seq_id. Repairs what it can (see the module docstring).
        Meant to run once, at start; a second call just reads what the index holds."""
        with self._lock:
            if self._recovered:
                return self._read_locked(0, self._next_seq)
            return self._recover_locked()

    def _recover_implied(self) -> None:
        """publish() before recover(): a new queue, unless its directory holds segments (say a
        queue of the same name was deleted during a crash). Their entries are loaded, never
        appended to blindly nor dropped; the owner should have recovered or removed them."""
        if segment_files(self.directory):
            log.warning("queue_index.recover_implied", directory=str(self.directory))
            self._recover_locked()
        self._recovered = True

    def _recover_locked(self) -> list[IndexEntry]:
        self._recovered = True
        for stray in self.directory.glob("*.tmp"):
            stray.unlink(missing_ok=True)
        out: list[IndexEntry] = []
        for number, path in segment_files(self.directory):
            scan = recover_file(path, number, self.segment_entries, self.stats)
            if scan is None:
                continue
            self._next_seq = max(self._next_seq, scan.max_seq + 1)
            if not scan.entries:
                path.unlink()  # fully acked: RabbitMQ deletes such segments too
                self._dir_unsynced = True
                continue
            seg = self._segments[number] = _Segment(number)
            seg.grow(max(scan.entries), self.segment_entries)
            base = number * self.segment_entries
            for rel in sorted(scan.entries):
                msg_id, payload = scan.entries[rel]
                delivered = rel in scan.delivered
                seg.state[rel] = _DELIVERED if delivered else _PUBLISHED
                seg.positions[rel] = scan.positions[rel]
                out.append(IndexEntry(base + rel, msg_id, payload, delivered))
            seg.unacked = len(scan.entries)
        log.info(
            "queue_index.recovered",
            directory=str(self.directory),
            entries=len(out),
            clean=self.clean_shutdown,
            torn=self.stats.torn_records,
            corrupt=self.stats.corrupt_records,
            quarantined=self.stats.quarantined_segments,
        )
        return out

    def read(self, start_seq: int, end_seq: int) -> list[IndexEntry]:
        """Un-acked entries with start_seq <= seq_id < end_seq, ascending. Entries on disk are
        read at their recorded positions: one pread each for a few, one read of the file for
        many (paging a whole segment back in)."""
        with self._lock:
            return self._read_locked(start_seq, end_seq)

    def _read_locked(self, start_seq: int, end_seq: int) -> list[IndexEntry]:
        n = self.segment_entries
        out: list[IndexEntry] = []
        if end_seq <= start_seq:
            return out
        first, last = start_seq // n, (end_seq - 1) // n
        numbers: Iterable[int] = range(first, last + 1)
        if last - first > len(self._segments):  # a wide range (a priority queue's levels)
            numbers = sorted(k for k in self._segments if first <= k <= last)
        for number in numbers:
            seg = self._segments.get(number)
            if seg is None:
                continue
            base = number * n
            state, pubs = seg.state, seg.pubs
            lo, hi = max(start_seq - base, 0), min(end_seq - base, len(state))
            live = [rel for rel in range(lo, hi) if state[rel]]
            if not live:
                continue
            on_disk = [rel for rel in live if rel not in pubs]
            found = self._read_pubs(seg, on_disk) if on_disk else {}
            for rel in live:
                ids = pubs.get(rel) or found.get(rel)
                if ids is not None:
                    out.append(IndexEntry(base + rel, ids[0], ids[1], state[rel] == _DELIVERED))
        self._limit_open_files()
        return out

    def live_ranges(self) -> list[tuple[int, int]]:
        """The un-acked seq_ids as sorted [start, end) ranges (from the state arrays)."""
        out: list[tuple[int, int]] = []
        with self._lock:
            for number in sorted(self._segments):
                seg = self._segments[number]
                if not seg.unacked:
                    continue
                base = number * self.segment_entries
                for run in _LIVE_RUN.finditer(seg.state):
                    start, end = base + run.start(), base + run.end()
                    if out and out[-1][1] == start:
                        out[-1] = (out[-1][0], end)
                    else:
                        out.append((start, end))
        return out

    def count(self) -> int:
        """How many entries are un-acked (from the state arrays: no file is read)."""
        with self._lock:
            return sum(seg.unacked for seg in self._segments.values())

    def bounds(self) -> tuple[int, int]:
        """(lowest un-acked seq_id, next seq_id); (next, next) when nothing is un-acked."""
        with self._lock:
            for number in sorted(self._segments):
                seg = self._segments[number]
                if seg.unacked:
                    state = seg.state
                    rel = len(state) - len(state.lstrip(b"\x00"))
                    return number * self.segment_entries + rel, self._next_seq
            return self._next_seq, self._next_seq

    # -- internals (called with the lock held) ------------------------------------------------
    def _journal_full(self) -> bool:
        return (
            self._journal_ops >= self.max_journal_entries
            or self._journal_bytes >= _MAX_JOURNAL_BYTES
        )

    def _flush_locked(self) -> None:
        for number in sorted(self._dirty):
            seg = self._segments.get(number)
            if seg is None:
                continue
            if not seg.unacked:
                # Deleted here rather than at the last ack, so a crash before this flush
                # finds the segment exactly as the last flush left it.
                self._drop_segment(seg)
                continue
            # Acks and delivers first: they name entries already on disk, and a seq id
            # published again after its ack must not be wiped by that ack.
            buf = bytearray()
            state = seg.state
            if seg.acks:
                encode_offsets(buf, REC_ACK, seg.acks)
            if seg.dels:
                live = [rel for rel in seg.dels if state[rel] == _DELIVERED]
                if live:
                    encode_offsets(buf, REC_DELIVER, live)
            base = number * self.segment_entries
            positions = seg.positions
            for rel, (msg_id, payload) in seg.pubs.items():
                positions[rel] = len(buf)  # relative to this write until it succeeds
                encode_pub(buf, base + rel, msg_id, payload, state[rel] == _DELIVERED)
            if buf:
                if seg.fd < 0:
                    seg.fd = self._open_segment(number)
                start = append(seg.fd, buf)  # on failure the journal stays for a retry
                for rel in seg.pubs:
                    positions[rel] += start
                self._unsynced.add(number)
            seg.pubs, seg.dels, seg.acks = {}, [], []
        self._dirty.clear()
        self._journal_ops = self._journal_bytes = 0
        self._limit_open_files()

    def _open_segment(self, number: int) -> int:
        path = self.directory / segment_file_name(number)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(fd).st_size == 0:
            self._dir_unsynced = True
            try:
                append(fd, encode_header(number, self.segment_entries))
            except OSError:
                os.close(fd)
                raise
        return fd

    def _limit_open_files(self) -> None:
        open_segs = [s for s in self._segments.values() if s.fd >= 0]
        if len(open_segs) <= _MAX_OPEN_FILES:
            return
        # Keep the newest (the publish head); sync() reopens a closed one to fsync it.
        open_segs.sort(key=lambda s: s.number)
        for seg in open_segs[:-_MAX_OPEN_FILES]:
            os.close(seg.fd)
            seg.fd = -1

    def _drop_segment(self, seg: _Segment) -> None:
        """Every entry of `seg` is acked: forget it and delete its file."""
        if seg.fd >= 0:
            os.close(seg.fd)
            seg.fd = -1
        del self._segments[seg.number]
        self._unsynced.discard(seg.number)
        path = self.directory / segment_file_name(seg.number)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            self._dir_unsynced = True

    def _close_fds(self) -> None:
        for seg in self._segments.values():
            if seg.fd >= 0:
                os.close(seg.fd)
                seg.fd = -1

    def _read_pubs(self, seg: _Segment, rels: list[int]) -> dict[int, tuple[int, bytes | None]]:
        """(msg_id, payload) of the flushed entries `rels` of `seg`, read at their positions."""
        if seg.fd < 0:
            seg.fd = self._open_segment(seg.number)
        fd, positions = seg.fd, seg.positions
        n = self.segment_entries
        base = seg.number * n
        out: dict[int, tuple[int, bytes | None]] = {}
        if len(rels) > _BULK_READ:
            first = min(positions[rel] for rel in rels)
            buf = os.pread(fd, os.fstat(fd).st_size - first, first)
            for rel in rels:
                got = pub_at(buf, positions[rel] - first, base, n)
                self._found(out, got, base, rel)
            return out
        guess = PUB_RECORD_SIZE + self.embed_below  # enough for any record written now
        for rel in rels:
            pos = positions[rel]
            buf = os.pread(fd, guess, pos)
            if len(buf) >= PUB_RECORD_SIZE and record_size(buf) > len(buf):
                buf = os.pread(fd, record_size(buf), pos)  # embedded under a larger setting
            self._found(out, pub_at(buf, 0, base, n), base, rel)
        return out

    def _found(
        self,
        out: dict[int, tuple[int, bytes | None]],
        got: tuple[int, int, bytes | None] | None,
        base: int,
        rel: int,
    ) -> None:
        if got is None or got[0] != base + rel:  # damaged since recovery (or a bug): say so
            log.error(
                "queue_index.entry_unreadable", directory=str(self.directory), seq_id=base + rel
            )
            return
        out[rel] = (got[1], got[2])
