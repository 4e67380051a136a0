"""A stream's log: append-only segment files of chunks, a sparse index per segment, retention
by whole segments from the head (docs/STORAGE.md, "Streams"; format: stream_format.py).

Who owns what. Everything here lives on the event loop thread except the writer: one flusher
task per log takes the chunks appended since its last turn and hands them to a worker thread,
which rolls segments, writes the chunks and their index entries (one pwrite each per segment)
and fsyncs per policy. Back on the loop the chunks become readable (`committed` moves) and
`on_commit` is called: what a publisher confirm waits for. A message is never readable before
it is durable, so an offset a consumer has seen is never handed out again after a crash.

Memory does not grow with the stream: the log keeps a summary per segment, the chunks not yet
written, and the last few committed chunks (`tail_bytes`) for consumers at the tail; readers
(stream_reader.py) read everything else from disk, one chunk at a time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import os
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog

from broker.message import Message
from broker.store.segment import FILE_HEADER_SIZE, FileWriter
from broker.store.stream_format import (
    INDEX_ENTRY_SIZE,
    BadHeader,
    ChunkInfo,
    chunk_bytes,
    encode_index_entry,
    index_header,
    index_path,
    list_segments,
    scan_segment,
    segment_header,
    segment_path,
)

__all__ = ["CHUNK_MAX_BYTES", "StreamLog", "StreamSegment", "remove_orphan_streams"]

log = structlog.get_logger("hare.stream")

_T = TypeVar("_T")
CHUNK_MAX_BYTES = 1 << 20  # a chunk holds at most this many body bytes (or one message)
DEFAULT_SEGMENT_BYTES = 500_000_000  # RabbitMQ's x-stream-max-segment-size-bytes default
_EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="stream")


@dataclass(slots=True)
class StreamSegment:
    """A segment as the loop knows it: readers stay within `size` (committed bytes)."""

    first: int
    size: int = FILE_HEADER_SIZE
    end_offset: int = 0  # after its last committed message
    first_time: int = 0
    last_time: int = 0
    last_chunk: int = -1
    chunks: int = 0


@dataclass(slots=True)
class _Pending:
    first: int
    timestamp: int
    msgs: list[Message]
    size: int


class _WriteFailed(Exception):
    def __init__(self, done: list[tuple[ChunkInfo, bool]], error: OSError) -> None:
        self.done, self.error = done, error


class StreamLog:
    def __init__(
        self,
        directory: Path,
        *,
        name: str = "",
        max_segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        max_bytes: int | None = None,
        max_age_ms: int | None = None,
        fsync: str = "batch",
        tail_bytes: int = 4 << 20,
        on_commit: Callable[[int], None] | None = None,
        on_failed: Callable[[int, int], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.max_segment_bytes = max_segment_bytes
        self.max_bytes = max_bytes
        self.max_age_ms = max_age_ms
        self.fsync = fsync
        self.tail_bytes = tail_bytes
        self.on_commit = on_commit
        self.on_failed = on_failed
        self.file_writer = FileWriter()  # the disk seam, as the message store's
        self.segments: list[StreamSegment] = []
        self.next_offset = 0  # the offset the next appended message gets
        self.committed = 0  # offsets below are durable and readable
        self.last_chunk = -1  # first offset of the last committed chunk
        # committed chunks kept for readers at the tail: (first offset, messages), and the
        # body bytes they hold
        self.tail: deque[tuple[int, list[Message]]] = deque()
        self._tail_size = 0
        self._last_time = 0
        self._pending: list[_Pending] = []
        self.unwritten_bytes = 0  # bodies appended and not yet written (credit flow reads it)
        self._settled = 0  # offsets below are committed or failed
        self._sync_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False
        self._deleted = False
        self._retention_timer: asyncio.TimerHandle | None = None
        # the writer's side, touched only by the job running in the worker thread
        self._seg_fd = -1
        self._idx_fd = -1
        self._cur_first = -1
        self._cur_size = 0
        self._cur_chunks = 0
        self._in_flight: concurrent.futures.Future[Any] | None = None
        self._lock = threading.Lock()  # one disk job of this log at a time (a delete waits)
        self.write_failures = 0

    # -- life cycle -------------------------------------------------------------------------
    async def open(self) -> None:
        """Recover what is on disk (a torn tail cut off, missing index entries rebuilt) in a
        worker thread, and start the flusher."""
        await self._in_thread(self._recover)
        self._start()

    def open_now(self) -> None:
        """open() for a stream just declared: its directory is new, so recovery reads
        nothing and runs on the loop."""
        self._recover()
        self._start()

    def _start(self) -> None:
        self._flusher = asyncio.get_running_loop().create_task(
            self._run_flusher(), name=f"stream:{self.name}")
        self._arm_retention()

    def _recover(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        firsts = list_segments(self.directory)
        for first in firsts:
            try:
                scan, missing = scan_segment(self.directory, first)
            except (BadHeader, OSError) as exc:
                log.error("stream segment unreadable, set aside", stream=self.name,
                          segment=first, error=str(exc))
                self._set_aside(first)
                continue
            if scan.good_end < scan.size:
                log.warning("stream torn tail dropped", stream=self.name, segment=first,
                            bytes=scan.size - scan.good_end)
            self._repair(first, scan.chunks - len(missing), missing, scan.good_end)
            self.segments.append(StreamSegment(
                first, scan.good_end, scan.end_offset, scan.first_time, scan.last_time,
                scan.last_chunk, scan.chunks))
        if self.segments:
            last = self.segments[-1]
            self.committed = self.next_offset = self._settled = last.end_offset
            self.last_chunk = next((s.last_chunk for s in reversed(self.segments)
                                    if s.last_chunk >= 0), -1)
            self._last_time = max(s.last_time for s in self.segments)
            self._open_segment(last.first, last.size, last.chunks, create=False)

    def _repair(self, first: int, keep: int, missing: list[ChunkInfo], good_end: int) -> None:
        """Cut a segment to its last good chunk and its index to the entries that hold."""
        seg = segment_path(self.directory, first)
        if seg.stat().st_size > good_end:
            os.truncate(seg, good_end)
        idx = index_path(self.directory, first)
        fd = os.open(idx, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = FILE_HEADER_SIZE + keep * INDEX_ENTRY_SIZE
            if keep == 0:
                os.ftruncate(fd, 0)
                os.pwrite(fd, index_header(first), 0)
            else:
                os.ftruncate(fd, size)
            if missing:
                os.pwrite(fd, b"".join(encode_index_entry(i) for i in missing), size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _set_aside(self, first: int) -> None:
        aside = self.directory / "quarantine"
        aside.mkdir(exist_ok=True)
        for path in (segment_path(self.directory, first), index_path(self.directory, first)):
            if path.exists():
                path.rename(aside / path.name)

    async def close(self) -> None:
        """Clean stop: write what was appended, fsync, close the files."""
        if self._closing:
            return
        self._closing = True
        if self._retention_timer is not None:
            self._retention_timer.cancel()
        self._wake.set()
        if self._flusher is not None:
            await self._flusher
        await self._in_thread(self._close_locked)

    def _close_locked(self) -> None:
        with self._lock:
            self._close_files(True)

    async def close_dirty(self) -> None:
        """Stop as a crash would: chunks not yet written are dropped (tests)."""
        self._closing = True
        if self._retention_timer is not None:
            self._retention_timer.cancel()
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            try:
                await self._flusher
            except asyncio.CancelledError:
                pass
        if self._in_flight is not None:
            try:
                await asyncio.wrap_future(self._in_flight)
            except Exception:
                pass
        self._close_files(False)

    def delete(self) -> None:
        """The stream is deleted: what was not written is dropped, the directory is renamed
        aside at once (a new stream of the same name starts empty) and removed by a worker
        thread once the write under way, if any, is done."""
        self._closing = self._deleted = True
        if self._retention_timer is not None:
            self._retention_timer.cancel()
        if self._flusher is not None:
            self._flusher.cancel()
        self._pending.clear()
        self.unwritten_bytes = 0
        self._settled = self.next_offset
        self._wake_syncs()
        gone = self.directory.with_name(f".deleted-{self.directory.name}-{uuid.uuid4().hex[:8]}")
        try:
            self.directory.rename(gone)
        except OSError:
            gone = self.directory
        self.tail.clear()
        _EXECUTOR.submit(self._remove, gone)

    def _remove(self, directory: Path) -> None:
        with self._lock:
            self._close_files(False)
        shutil.rmtree(directory, ignore_errors=True)

    def _close_files(self, sync: bool) -> None:
        for fd in (self._seg_fd, self._idx_fd):
            if fd >= 0:
                if sync:
                    os.fsync(fd)
                os.close(fd)
        self._seg_fd = self._idx_fd = -1

    def _in_thread(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        job = _EXECUTOR.submit(fn, *args)
        self._in_flight = job
        return asyncio.wrap_future(job)

    # -- appending (on the loop, no await) ---------------------------------------------------
    def append(self, msgs: list[Message]) -> int:
        """Messages that take the offsets next_offset .. next_offset+len-1, in chunks of at
        most CHUNK_MAX_BYTES of bodies. Returns the first offset. They become readable, and
        `on_commit` is called, once they are written (and fsynced, per policy)."""
        first = self.next_offset
        now = max(int(time.time() * 1000), self._last_time)
        self._last_time = now
        chunk: _Pending | None = None  # one append, one chunk (or a few, for large bodies)
        for msg in msgs:
            size = len(msg.body)
            if chunk is None or (chunk.size + size > CHUNK_MAX_BYTES and chunk.msgs):
                chunk = _Pending(self.next_offset, now, [], 0)
                self._pending.append(chunk)
            chunk.msgs.append(msg)
            chunk.size += size
            self.unwritten_bytes += size
            self.next_offset += 1
        self._wake.set()
        return first

    # -- the flusher ------------------------------------------------------------------------
    async def _run_flusher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if batch:
                self.unwritten_bytes -= sum(p.size for p in batch)  # settled either way below
                try:
                    done = await self._in_thread(self._write, batch)
                except _WriteFailed as failed:
                    self._committed_chunks(batch, failed.done)
                    self._failed(batch[len(failed.done):], failed.error)
                except Exception:
                    log.exception("stream flusher failed", stream=self.name)
                    self._failed(batch, OSError(errno.EIO, "stream write failed"))
                else:
                    self._committed_chunks(batch, done)
            self._wake_syncs()
            if self._closing and not self._pending:
                return

    async def sync(self) -> None:
        """Return once every message appended so far is committed (or its write failed)."""
        if self._settled >= self.next_offset:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sync_waiters.append((self.next_offset, fut))
        await fut

    def _wake_syncs(self) -> None:
        if not self._sync_waiters:
            return
        waiting = []
        for target, fut in self._sync_waiters:
            if self._settled >= target:
                if not fut.done():
                    fut.set_result(None)
            else:
                waiting.append((target, fut))
        self._sync_waiters = waiting

    def _write(self, batch: list[_Pending]) -> list[tuple[ChunkInfo, bool]]:
        with self._lock:
            if self._deleted:
                return []
            return self._write_locked(batch)

    def _write_locked(self, batch: list[_Pending]) -> list[tuple[ChunkInfo, bool]]:
        """In the worker thread: roll when the segment is full, write each segment's chunks
        and index entries with one pwrite each, fsync per policy. Returns each chunk's place
        and whether it opened a new segment."""
        done: list[tuple[ChunkInfo, bool]] = []
        writer = self.file_writer
        i = 0
        while i < len(batch):
            rolled = False
            if self._seg_fd < 0 or (self._cur_chunks and
                                    self._cur_size >= self.max_segment_bytes):
                try:
                    self._roll(batch[i].first)
                except OSError as exc:
                    raise _WriteFailed(done, exc) from exc
                rolled = True
            start, pos = self._cur_size, self._cur_size
            data: list[bytes] = []
            entries: list[bytes] = []
            group: list[tuple[ChunkInfo, bool]] = []
            while i < len(batch) and (not group or pos < self.max_segment_bytes):
                p = batch[i]
                raw = chunk_bytes(p.first, p.timestamp, [m.encode() for m in p.msgs])
                info = ChunkInfo(pos, p.first, p.timestamp, len(p.msgs), pos + len(raw))
                data.append(raw)
                entries.append(encode_index_entry(info))
                group.append((info, rolled and not group))
                pos = info.end
                i += 1
            try:
                writer.pwrite(self._seg_fd, b"".join(data), start)
                writer.pwrite(self._idx_fd, b"".join(entries),
                              FILE_HEADER_SIZE + self._cur_chunks * INDEX_ENTRY_SIZE)
                if self.fsync != "never":
                    writer.fsync(self._seg_fd)
            except OSError as exc:
                self._cut_back(start)
                raise _WriteFailed(done, exc) from exc
            self._cur_size = pos
            self._cur_chunks += len(group)
            done.extend(group)
        return done

    def _cut_back(self, size: int) -> None:
        """A write failed (ENOSPC, EIO): the segment and its index end where they did."""
        try:
            os.ftruncate(self._seg_fd, size)
            os.ftruncate(self._idx_fd, FILE_HEADER_SIZE + self._cur_chunks * INDEX_ENTRY_SIZE)
        except OSError as exc:
            log.error("stream truncate failed", stream=self.name, error=str(exc))

    def _roll(self, first: int) -> None:
        """A new current segment (and index) starting at offset `first`; the old one is
        fsynced first, so every segment but the last is complete on disk."""
        if self._seg_fd >= 0:
            self.file_writer.fsync(self._seg_fd)
            self.file_writer.fsync(self._idx_fd)
            self._close_files(False)
        self._open_segment(first, FILE_HEADER_SIZE, 0, create=True)

    def _open_segment(self, first: int, size: int, chunks: int, *, create: bool) -> None:
        sync = self.fsync != "never"
        seg, idx = segment_path(self.directory, first), index_path(self.directory, first)
        if create:
            self._idx_fd = self.file_writer.create(idx, index_header(first), sync)
            self._seg_fd = self.file_writer.create(seg, segment_header(first), sync)
        else:
            self._seg_fd = os.open(seg, os.O_RDWR)
            self._idx_fd = os.open(idx, os.O_RDWR)
        self._cur_first, self._cur_size, self._cur_chunks = first, size, chunks

    def _committed_chunks(self, batch: list[_Pending], done: list[tuple[ChunkInfo, bool]]
                          ) -> None:
        """On the loop: written chunks become readable."""
        if not done:
            return
        rolled = False
        for (info, new_segment), p in zip(done, batch, strict=False):
            if new_segment or not self.segments:
                self.segments.append(StreamSegment(info.offset, FILE_HEADER_SIZE,
                                                   info.offset, info.timestamp))
                rolled = True
            seg = self.segments[-1]
            if not seg.chunks:
                seg.first_time = info.timestamp
            seg.size, seg.end_offset = info.end, info.offset + info.messages
            seg.last_time, seg.last_chunk = info.timestamp, info.offset
            seg.chunks += 1
            self.tail.append((info.offset, p.msgs))
            self._tail_size += p.size
        self.committed = self._settled = self.segments[-1].end_offset
        self.last_chunk = self.segments[-1].last_chunk
        while len(self.tail) > 1 and self._tail_size > self.tail_bytes:
            _, msgs = self.tail.popleft()
            self._tail_size -= sum(len(m.body) for m in msgs)
        if rolled:
            self.apply_retention()
        if self.on_commit is not None:
            self.on_commit(self.committed)

    def _failed(self, batch: list[_Pending], error: OSError) -> None:
        if not batch:
            return
        self.write_failures += 1
        log.error("stream write failed", stream=self.name, messages=sum(len(p.msgs)
                  for p in batch), error=str(error), enospc=error.errno == errno.ENOSPC)
        self._settled = batch[-1].first + len(batch[-1].msgs)
        if self.on_failed is not None:
            # their offsets stay unused: a later chunk starts after them (readers skip gaps)
            self.on_failed(batch[0].first, batch[-1].first + len(batch[-1].msgs))

    # -- retention ---------------------------------------------------------------------------
    def apply_retention(self, now_ms: int | None = None) -> int:
        """Drop whole segments from the head while the stream is over x-max-length-bytes or
        their newest message is older than x-max-age; never the segment being written.
        Returns how many went."""
        segs = self.segments
        dropped = 0
        if self.max_bytes is None and self.max_age_ms is None:
            return 0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        total = sum(s.size for s in segs)
        while len(segs) > 1:
            head = segs[0]
            too_big = self.max_bytes is not None and total > self.max_bytes
            too_old = self.max_age_ms is not None and head.last_time < now - self.max_age_ms
            if not (too_big or too_old):
                break
            segs.pop(0)
            total -= head.size
            dropped += 1
            for path in (segment_path(self.directory, head.first),
                         index_path(self.directory, head.first)):
                path.unlink(missing_ok=True)  # open readers keep reading it till they leave
        if dropped:
            log.info("stream segments dropped", stream=self.name, segments=dropped,
                     first_offset=self.first_offset)
        return dropped

    def _arm_retention(self) -> None:
        """x-max-age also ends segments of a stream nobody writes to (RabbitMQ looks only when
        a segment rolls)."""
        if self.max_age_ms is None or self._closing:
            return
        delay = min(max(self.max_age_ms / 10_000, 1.0), 60.0)
        self._retention_timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self.apply_retention()
        self._arm_retention()

    def set_limits(self, max_bytes: int | None, max_age_ms: int | None,
                   max_segment_bytes: int) -> None:
        """A policy changed the retention: applied from now on."""
        rearm = max_age_ms != self.max_age_ms
        self.max_bytes, self.max_age_ms = max_bytes, max_age_ms
        self.max_segment_bytes = max_segment_bytes
        if rearm:
            if self._retention_timer is not None:
                self._retention_timer.cancel()
                self._retention_timer = None
            self._arm_retention()
        self.apply_retention()

    # -- what readers and the management API ask --------------------------------------------
    @property
    def first_offset(self) -> int:
        return self.segments[0].first if self.segments else self.committed

    @property
    def bytes_on_disk(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def messages(self) -> int:
        """Messages the stream holds (offsets lost to a failed write are counted too)."""
        return self.committed - self.first_offset

    def segment_for(self, offset: int) -> int:
        """Index in `segments` of the segment holding `offset` (clamped to the first)."""
        segs = self.segments
        lo, hi = 0, len(segs)
        while lo < hi:
            mid = (lo + hi) // 2
            if segs[mid].first <= offset:
                lo = mid + 1
            else:
                hi = mid
        return max(lo - 1, 0)

    def stats(self) -> dict[str, Any]:
        return {"first_offset": self.first_offset, "last_offset": self.committed - 1,
                "committed_offset": self.committed, "segments": len(self.segments),
                "bytes": self.bytes_on_disk, "messages": self.messages,
                "pending_chunks": len(self._pending), "write_failures": self.write_failures}



def remove_orphan_streams(root: Path, keep: list[Path]) -> list[Path]:
    """Delete the stream directories under `root` no durable stream owns (deleted during a
    crash, or renamed aside by a delete that did not finish). Returns what went."""
    kept = {p.resolve() for p in keep}
    removed = []
    try:
        found = sorted(p for p in root.iterdir() if p.is_dir())
    except FileNotFoundError:
        return []
    for directory in found:
        if directory.resolve() not in kept:
            shutil.rmtree(directory, ignore_errors=True)
            log.warning("stream orphan removed", directory=str(directory))
            removed.append(directory)
    return removed
