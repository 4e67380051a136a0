"""The message store (rabbit_msg_store): message bodies by msg_id in append-only segment files,
shared by all queues of a node, reference counted, garbage collected by combining files.

Who owns what: everything here lives on the event loop thread. Worker threads (run_in_executor)
only do disk work - writing a batch to the current file and fsyncing it, a compaction's copy and
rewrite of two non-current files, the recovery scan - and hand results back to the loop, which
is the only place the index and file summary change. See docs/STORAGE.md."""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import os
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from broker.store import compaction
from broker.store.msg_store_index import (
    FAILED,
    PENDING,
    REMOVED,
    FileSummary,
    MsgLocation,
    write_snapshot,
)
from broker.store.msg_store_recovery import (
    CLEAN_MARKER,
    QUARANTINE_DIR,
    SNAPSHOT,
    RecoveryReport,
    quarantine,
    recover,
    wipe,
)
from broker.store.quarantine import MESSAGE_PREFIX, quarantine_record, quarantined_messages
from broker.store.segment import (
    FILE_HEADER_SIZE,
    RECORD_HEADER_SIZE,
    CorruptRecord,
    FileWriter,
    decode_record,
    encode_file_header,
    encode_record_header,
    fsync_dir,
    segment_name,
)

__all__ = ["FSYNC_POLICIES", "MessageUnreadable", "MsgStore", "RecoveryReport", "StoreClient"]

FSYNC_POLICIES = ("always", "batch", "never")
_MAX_CHUNK = 8 * 1024 * 1024  # bytes per pwrite + fsync: bounds the join and confirm latency
_GC_RECHECK_DIVISOR = 16  # no pair found: look again once garbage grew by limit/16 bytes


class StoreClient(Protocol):
    def msgs_durable(self, msg_ids: list[int]) -> None: ...  # batched, called on the event loop
    def msgs_failed(self, msg_ids: list[int], error: OSError) -> None: ...


class MessageUnreadable(KeyError):
    """The message was stored but its record is damaged or its file unreadable; it is dropped
    from the store (a KeyError, so callers treat it as a message that is gone)."""


class _State(Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


# one accepted write: (msg_id, location, writer to confirm, is it the first copy)
_Entry = tuple[int, MsgLocation, StoreClient | None, bool]
_T = TypeVar("_T")


class MsgStore:
    def __init__(
        self,
        directory: Path,
        *,
        name: str = "persistent",
        transient: bool = False,
        file_size_limit: int = 16 * 1024 * 1024,
        gc_garbage_fraction: float = 0.5,
        gc_min_files: int = 3,
        fsync: str = "batch",
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {FSYNC_POLICIES}, not {fsync!r}")
        self.directory = Path(directory)
        self.name = name
        self.transient = transient
        self.file_size_limit = file_size_limit
        self.gc_garbage_fraction = gc_garbage_fraction
        self.gc_min_files = gc_min_files
        # The transient store is wiped at every start: fsyncing it would buy nothing.
        self.fsync = "never" if transient else fsync
        self.file_writer = FileWriter()  # the disk seam; tests swap it to inject ENOSPC
        self._log = structlog.get_logger("hare.msg_store").bind(store=name)
        self._state = _State.NEW
        self._index: dict[int, MsgLocation] = {}
        self._summary: dict[int, FileSummary] = {}
        self._cache: dict[int, bytes] = {}  # bodies pending or in the current file
        self._cur_ids: list[int] = []  # ids written to the current file: evicted on roll
        self._pending: list[_Entry] = []
        self._sync_waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._cur_file = 0
        self._cur_fd = -1
        self._cur_size = 0
        self._next_file = 1
        self._need_roll = False
        self._read_fds: dict[int, int] = {}
        self._unsynced: set[int] = set()  # files written but not fsynced (fsync="never")
        self._total_bytes = 0  # sum of file_size over the summary
        self._valid_bytes = 0  # sum of valid_total_size over the summary
        self._moving: tuple[int, int, dict[int, bytes]] | None = None  # file, prefix end, bodies
        self._stuck = False  # a compaction could not finish: no clean marker at stop
        # Disk jobs run on the store's own threads (one flushing, one compacting at most), and
        # are tracked as concurrent futures: cancelling an awaiting task does not stop a thread.
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_flight: set[concurrent.futures.Future[Any]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._gc_task: asyncio.Task[None] | None = None
        self._gc_next_check = 0  # garbage bytes at which _gc_check next looks for a pair
        self._counters = {
            "quarantined": 0,
            "quarantined_messages": 0,
            "corrupt_records": 0,
            "write_failures": 0,
            "compactions": 0,
            "cancelled_writes": 0,
        }

    # -- life cycle --------------------------------------------------------------------------
    async def start(self, refs: Callable[[], dict[int, int]] | None = None) -> RecoveryReport:
        """Wipe (transient) or recover (persistent). `refs` is called only on a dirty start and
        returns {msg_id: reference count} for every message the queues still hold; messages on
        disk that it does not name become garbage. Without it every message found is kept with
        one reference. A clean start trusts the snapshot's counts and does not call it."""
        if self._state is not _State.NEW:
            raise RuntimeError(f"store {self.name} already started")
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix=f"msg_store_{self.name}")
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.transient:
            await self._in_thread(wipe, self.directory)
            report = RecoveryReport(clean=True, wiped=True)
            next_file = 1
        else:
            rec = await self._in_thread(recover, self.directory, self.file_writer, self._log)
            self._index, self._summary, report, next_file = (
                rec.index, rec.summary, rec.report, rec.next_file)
            if not report.clean:
                self._apply_refs(refs() if refs is not None else None, report)
        quarantine_dir = self.directory / QUARANTINE_DIR
        if quarantine_dir.is_dir():
            self._counters["quarantined"] = sum(
                1 for p in quarantine_dir.iterdir() if not p.name.startswith(MESSAGE_PREFIX))
            self._counters["quarantined_messages"] = len(quarantined_messages(self.directory))
        self._counters["corrupt_records"] = report.corrupt_records
        self._next_file = next_file
        self._total_bytes = sum(s.file_size for s in self._summary.values())
        self._valid_bytes = sum(s.valid_total_size for s in self._summary.values())
        last = max(self._summary, default=None)
        for number, s in list(self._summary.items()):
            if s.valid_total_size == 0 and number != last:
                self._delete_file(number)
        if last is not None and self._summary[last].file_size < self.file_size_limit:
            self._cur_file, self._cur_size = last, self._summary[last].file_size
            self._cur_fd = os.open(self.directory / segment_name(last), os.O_RDWR)
        else:
            self._cur_file = last or 0  # so the new file is linked on its right
            await self._roll()
        report.messages, report.files = len(self._index), len(self._summary)
        self._state = _State.RUNNING
        self._flusher = asyncio.create_task(self._run_flusher(), name=f"msg_store_{self.name}")
        self._log.info("msg_store_started", clean=report.clean, messages=report.messages,
                       files=report.files)
        self._gc_check()
        return report

    def _apply_refs(self, counts: dict[int, int] | None, report: RecoveryReport) -> None:
        if counts is None:
            return
        for msg_id, loc in list(self._index.items()):
            n = counts.get(msg_id, 0)
            if n > 0:
                loc.ref_count = n
                continue
            del self._index[msg_id]
            self._summary[loc.file].valid_total_size -= loc.total_size
            report.unreferenced += 1
        report.missing = sum(1 for m, n in counts.items() if n > 0 and m not in self._index)
        if report.missing:
            self._log.error("messages_missing", count=report.missing)

    async def stop(self) -> None:
        """Clean shutdown: finish writes and compaction, fsync, write the snapshot and the
        clean marker (persistent store), close every file."""
        if self._state is not _State.RUNNING:
            return
        self._state = _State.STOPPING
        if self._gc_task is not None:
            await self._gc_task  # it stops after the compaction under way
        self._wake.set()
        if self._flusher is not None:
            await self._flusher
        try:
            await self._fsync_unsynced()
            if not self.transient and not self._stuck:
                # Copies taken on the loop: a late remove() must not change them mid-write.
                await self._in_thread(self._write_clean_shutdown, dict(self._index),
                                      dict(self._summary))
        finally:  # without a marker, the next start is a dirty one: nothing is lost
            self._close_all()
            self._state = _State.STOPPED
        self._log.info("msg_store_stopped", messages=len(self._index))

    async def close_dirty(self) -> None:
        """Stop as a crash would: writes not yet flushed are dropped, no snapshot or marker is
        written. A disk job already running in a thread is let finish (threads cannot be
        killed). For crash tests and for giving up after a fatal error."""
        if self._state not in (_State.RUNNING, _State.STOPPING):
            return
        self._state = _State.STOPPING
        for task in (self._gc_task, self._flusher):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        for job in list(self._in_flight):  # a thread may still be using our descriptors
            try:
                await asyncio.wrap_future(job)
            except Exception:
                pass
        self._close_all()
        self._state = _State.STOPPED

    def _in_thread(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """Run blocking disk work on the store's threads, tracked for close_dirty."""
        assert self._executor is not None
        job = self._executor.submit(fn, *args)
        self._in_flight.add(job)
        job.add_done_callback(self._in_flight.discard)
        return asyncio.wrap_future(job)

    def _write_clean_shutdown(
        self, index: dict[int, MsgLocation], summary: dict[int, FileSummary]
    ) -> None:
        write_snapshot(self.directory / SNAPSHOT, index, summary)
        fd = os.open(self.directory / CLEAN_MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.fsync(fd)
        os.close(fd)
        fsync_dir(self.directory)

    def _close_all(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)  # idle by now: every job was awaited
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        if self._cur_fd >= 0:
            os.close(self._cur_fd)
            self._cur_fd = -1
        for fut in self._sync_waiters:
            if not fut.done():
                fut.set_exception(RuntimeError(f"store {self.name} closed"))
        self._sync_waiters.clear()

    # -- the client side: no awaits, no I/O except a read's pread ------------------------------
    def write(self, msg_id: int, data: bytes, client: StoreClient | None) -> None:
        """Accept a body; the client hears msgs_durable (or msgs_failed) once it is safe. A
        second write of a known id only adds a reference."""
        if self._state is not _State.RUNNING:
            raise RuntimeError(f"store {self.name} is not running")
        loc = self._index.get(msg_id)
        if loc is None:
            loc = MsgLocation(1, PENDING, 0, RECORD_HEADER_SIZE + len(data))
            self._index[msg_id] = loc
            self._cache[msg_id] = data
            self._pending.append((msg_id, loc, client, True))
        else:
            loc.ref_count += 1
            if client is None:
                return
            self._pending.append((msg_id, loc, client, False))
        self._wake.set()

    def remove(self, msg_id: int) -> None:
        """Drop one reference; at zero the record becomes a hole (or its write is cancelled if
        it has not happened yet). Unknown ids are ignored: removes are idempotent."""
        self._remove(msg_id)
        self._gc_check()

    def remove_many(self, msg_ids: Iterable[int]) -> None:
        for msg_id in msg_ids:
            self._remove(msg_id)
        self._gc_check()

    def _remove(self, msg_id: int) -> None:
        loc = self._index.get(msg_id)
        if loc is None:
            return
        loc.ref_count -= 1
        if loc.ref_count > 0:
            return
        del self._index[msg_id]
        self._cache.pop(msg_id, None)
        if loc.file == PENDING:  # still flying: never write it (its writers are still confirmed)
            loc.file = REMOVED
            self._counters["cancelled_writes"] += 1
            return
        s = self._summary[loc.file]
        s.valid_total_size -= loc.total_size
        self._valid_bytes -= loc.total_size
        if s.valid_total_size == 0 and loc.file != self._cur_file and not s.locked:
            self._delete_file(loc.file)

    def contains(self, msg_id: int) -> bool:
        return msg_id in self._index

    def read(self, msg_id: int, owner: tuple[str, str] = ("", "")) -> bytes:
        """The body of a stored message: from the current-file cache, from a compaction's
        in-memory copy, or by pread. KeyError if unknown; MessageUnreadable if damaged (the
        record is then set aside, see broker/store/quarantine.py; `owner` is the (vhost,
        queue) that read it, for the record's description)."""
        data = self._cache.get(msg_id)
        if data is not None:
            return data
        loc = self._index[msg_id]
        moving = self._moving
        if moving is not None and loc.file == moving[0] and loc.offset >= moving[1]:
            data = moving[2].get(msg_id)
            if data is not None:
                return data
        try:
            buf = os.pread(self._read_fd(loc.file), loc.total_size, loc.offset)
        except OSError as e:
            self._quarantine_live(loc.file, e)
            raise MessageUnreadable(msg_id) from e
        try:
            return decode_record(buf, msg_id)
        except CorruptRecord as e:
            self._set_aside(msg_id, loc, buf, str(e), owner)
            raise MessageUnreadable(msg_id) from e

    def _set_aside(self, msg_id: int, loc: MsgLocation, record: bytes, error: str,
                   owner: tuple[str, str]) -> None:
        """A damaged record found at read: kept in quarantine/, logged once, forgotten (every
        queue that refers to it goes on with its next message)."""
        self._counters["corrupt_records"] += 1
        self._counters["quarantined_messages"] += 1
        where = {"store": self.name, "segment": segment_name(loc.file), "offset": loc.offset,
                 "vhost": owner[0], "queue": owner[1], "error": error}
        try:
            quarantine_record(self.directory, msg_id, record, **where)
        except OSError as exc:
            where["quarantine_error"] = str(exc)
        self._log.error("message_quarantined", msg_id=f"{msg_id:032x}", **where)
        self._forget(msg_id, loc)

    def quarantined_messages(self) -> list[dict[str, Any]]:
        """What was set aside in this store's quarantine/ (broker/store/quarantine.py)."""
        return quarantined_messages(self.directory)

    def stats(self) -> dict[str, int]:
        return {
            "files": len(self._summary),
            "bytes": self._total_bytes,
            "valid_bytes": self._valid_bytes,
            "garbage_bytes": self._total_bytes - self._valid_bytes,
            "messages": len(self._index),
            "pending_writes": len(self._pending),
            "cache_messages": len(self._cache),
            "current_file": self._cur_file,
            **self._counters,
        }

    async def sync(self) -> None:
        """Return once everything written so far is durable (fsynced, whatever the policy)."""
        if self._state is not _State.RUNNING:
            raise RuntimeError(f"store {self.name} is not running")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sync_waiters.append(fut)
        self._wake.set()
        await fut

    # -- the flusher: batches, group commit, confirms ---------------------------------------------
    async def _run_flusher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            waiters, self._sync_waiters = self._sync_waiters, []
            try:
                if batch:
                    await self._flush(batch)
                if waiters:
                    await self._fsync_unsynced()
            except OSError as e:
                for fut in waiters:
                    if not fut.done():
                        fut.set_exception(e)
            except Exception:  # a bug must not stop every later write from being confirmed
                self._log.exception("flusher_failed")
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
            if self._state is _State.STOPPING and not self._pending:
                return

    async def _flush(self, batch: list[_Entry]) -> None:
        i, n = 0, len(batch)
        limit = self.file_size_limit
        while i < n:
            if self._cur_size >= limit or self._need_roll:
                try:
                    await self._roll()
                except OSError as e:
                    self._log.error("roll_failed", error=str(e))
                    self._fail_unwritten(batch[i:])
                    self._settle(batch[i:], e)
                    return
            file, start = self._cur_file, self._cur_size
            pos = start
            parts: list[bytes] = []
            written: list[tuple[int, MsgLocation]] = []
            j = i
            while j < n:
                msg_id, loc, _, is_new = batch[j]
                if is_new and loc.file == PENDING:
                    if written and (pos >= limit or pos - start >= _MAX_CHUNK):
                        break  # the rest goes to a new file, or to the next write + fsync
                    data = self._cache[msg_id]
                    parts.append(encode_record_header(msg_id, data))
                    parts.append(data)
                    loc.file, loc.offset = file, pos
                    pos += loc.total_size
                    written.append((msg_id, loc))
                    self._cur_ids.append(msg_id)
                j += 1
            error: OSError | None = None
            if written:
                s = self._summary[file]
                s.valid_total_size += pos - start
                s.file_size = pos
                self._valid_bytes += pos - start
                self._total_bytes += pos - start
                self._cur_size = pos
                try:
                    await self._in_thread(self._write_chunk, self._cur_fd, parts, start)
                except OSError as e:
                    error = e
                    self._revert_chunk(written, file, start, e)
                else:
                    if self.fsync == "never":
                        self._unsynced.add(file)
            self._settle(batch[i:j], error)
            i = j

    def _write_chunk(self, fd: int, parts: list[bytes], offset: int) -> None:
        """In a worker thread: one pwrite (and one fsync) for a batch; with fsync="always" a
        write and fsync per record."""
        writer = self.file_writer
        if self.fsync == "always":
            for k in range(0, len(parts), 2):
                record = parts[k] + parts[k + 1]
                writer.pwrite(fd, record, offset)
                writer.fsync(fd)
                offset += len(record)
            return
        writer.pwrite(fd, b"".join(parts), offset)
        if self.fsync == "batch":
            writer.fsync(fd)

    def _revert_chunk(
        self, written: list[tuple[int, MsgLocation]], file: int, start: int, error: OSError
    ) -> None:
        """A batch write failed: cut the file back to where the batch began (bytes durable
        before it are untouched) and forget the batch's messages."""
        self._counters["write_failures"] += 1
        self._log.error("write_failed", file=file, offset=start, messages=len(written),
                        error=str(error), enospc=error.errno == errno.ENOSPC)
        try:
            os.ftruncate(self._cur_fd, start)
        except OSError as e:
            self._log.error("truncate_failed", file=file, error=str(e))
            self._need_roll = True  # do not append after bytes we could not cut off
        s = self._summary[file]
        for msg_id, loc in written:
            if self._index.get(msg_id) is loc:
                del self._index[msg_id]
                self._cache.pop(msg_id, None)
                s.valid_total_size -= loc.total_size
                self._valid_bytes -= loc.total_size
            loc.file = FAILED
        self._total_bytes -= s.file_size - start
        s.file_size = self._cur_size = start

    def _fail_unwritten(self, entries: list[_Entry]) -> None:
        for msg_id, loc, _, is_new in entries:
            if is_new and loc.file == PENDING:
                if self._index.get(msg_id) is loc:
                    del self._index[msg_id]
                self._cache.pop(msg_id, None)
                loc.file = FAILED

    def _settle(self, entries: list[_Entry], error: OSError | None) -> None:
        """Tell each writer, once per batch, which of its messages are durable or failed."""
        ok: dict[int, tuple[StoreClient, list[int]]] = {}
        bad: dict[int, tuple[StoreClient, list[int]]] = {}
        for msg_id, loc, client, _ in entries:
            if client is None:
                continue
            into = bad if loc.file == FAILED else ok
            slot = into.get(id(client))
            if slot is None:
                into[id(client)] = (client, [msg_id])
            else:
                slot[1].append(msg_id)
        for client, ids in ok.values():
            try:
                client.msgs_durable(ids)
            except Exception:
                self._log.exception("client_callback_failed")
        err = error or OSError(errno.EIO, "write failed")
        for client, ids in bad.values():
            try:
                client.msgs_failed(ids, err)
            except Exception:
                self._log.exception("client_callback_failed")

    async def _fsync_unsynced(self) -> None:
        files, self._unsynced = self._unsynced, set()
        for number in files:
            if number in self._summary:
                fd = self._cur_fd if number == self._cur_file else self._read_fd(number)
                await self._in_thread(self.file_writer.fsync, fd)

    async def _roll(self) -> None:
        """Start a new current file on the right of the old one."""
        number = self._next_file
        path = self.directory / segment_name(number)
        fd = await self._in_thread(
            self.file_writer.create, path, encode_file_header(number), self.fsync != "never"
        )
        self._next_file = number + 1
        old = self._cur_file
        if self._cur_fd >= 0:
            os.close(self._cur_fd)
        self._cur_fd, self._cur_file, self._cur_size = fd, number, FILE_HEADER_SIZE
        self._need_roll = False
        s = FileSummary(0, FILE_HEADER_SIZE)
        self._summary[number] = s
        self._total_bytes += FILE_HEADER_SIZE
        if old in self._summary:
            s.left = old
            self._summary[old].right = number
        # The old file's writes are complete: its bodies are read from disk from now on. (An id
        # removed and written again since is pending under a new location: keep that body.)
        index, cache = self._index, self._cache
        for msg_id in self._cur_ids:
            loc = index.get(msg_id)
            if loc is None or loc.file != PENDING:
                cache.pop(msg_id, None)
        self._cur_ids = []
        if old in self._summary and self._summary[old].valid_total_size == 0:
            self._delete_file(old)
        self._gc_next_check = 0

    # -- files ---------------------------------------------------------------------------------
    def _read_fd(self, number: int) -> int:
        fd = self._read_fds.get(number)
        if fd is None:
            fd = self._read_fds[number] = os.open(
                self.directory / segment_name(number), os.O_RDONLY)
        return fd

    def _delete_file(self, number: int) -> None:
        s = self._summary.pop(number)
        self._total_bytes -= s.file_size
        self._valid_bytes -= s.valid_total_size
        if s.left is not None and s.left in self._summary:
            self._summary[s.left].right = s.right
        if s.right is not None and s.right in self._summary:
            self._summary[s.right].left = s.left
        fd = self._read_fds.pop(number, None)
        if fd is not None:
            os.close(fd)
        self._unsynced.discard(number)
        self._gc_next_check = 0  # new neighbours: a pair may fit now
        try:
            (self.directory / segment_name(number)).unlink()
        except FileNotFoundError:
            pass

    def _forget(self, msg_id: int, loc: MsgLocation) -> None:
        """Drop a message whatever its references (its data is gone)."""
        if self._index.get(msg_id) is loc:
            del self._index[msg_id]
        s = self._summary.get(loc.file)
        if s is not None:
            s.valid_total_size -= loc.total_size
            self._valid_bytes -= loc.total_size

    def _quarantine_live(self, number: int, error: OSError) -> None:
        """A file became unreadable while running: move it aside, drop its messages, carry
        on with everything else."""
        if number not in self._summary:
            return
        self._log.error("segment_quarantined", file=segment_name(number), error=str(error))
        lost = [(m, loc) for m, loc in self._index.items() if loc.file == number]
        for msg_id, loc in lost:
            self._forget(msg_id, loc)
        self._summary[number].valid_total_size = 0
        path = self.directory / segment_name(number)
        fd = self._read_fds.pop(number, None)
        if fd is not None:
            os.close(fd)
        try:
            quarantine(self.directory, path)
        except OSError as e:
            self._log.error("quarantine_failed", file=path.name, error=str(e))
        s = self._summary.pop(number)
        self._total_bytes -= s.file_size
        if s.left in self._summary:
            self._summary[s.left].right = s.right
        if s.right in self._summary:
            self._summary[s.right].left = s.left
        if number == self._cur_file:
            self._need_roll = True
        self._counters["quarantined"] += 1

    # -- garbage collection ----------------------------------------------------------------------
    def _gc_wanted(self) -> bool:
        total = self._total_bytes
        return (
            len(self._summary) >= self.gc_min_files
            and total > 0
            and (total - self._valid_bytes) / total > self.gc_garbage_fraction
        )

    def _gc_check(self) -> None:
        if (
            self._gc_task is not None
            or self._state is not _State.RUNNING
            or self._total_bytes - self._valid_bytes < self._gc_next_check
            or not self._gc_wanted()
        ):
            return
        if self._pick_pair() is None:
            self._gc_backoff()
            return
        self._gc_task = asyncio.create_task(self._gc_loop(), name=f"msg_store_gc_{self.name}")

    def _gc_backoff(self) -> None:
        """Nothing to combine (or it failed): picking again costs a pass over the files, so
        wait until some more garbage has built up."""
        garbage = self._total_bytes - self._valid_bytes
        self._gc_next_check = garbage + self.file_size_limit // _GC_RECHECK_DIVISOR

    def _pick_pair(self) -> tuple[int, int] | None:
        return compaction.pick_pair(self._summary, self._cur_file, self.file_size_limit)

    async def _gc_loop(self) -> None:
        try:
            while self._state is _State.RUNNING and self._gc_wanted():
                pair = self._pick_pair()
                if pair is None or not await self._compact(*pair):
                    self._gc_backoff()
                    return
        finally:
            self._gc_task = None

    async def gc_idle(self) -> None:
        """Wait until no compaction is running (for tests and orderly shutdown)."""
        while self._gc_task is not None:
            await asyncio.shield(self._gc_task)

    async def _compact(self, left: int, right: int) -> bool:
        ls, rs = self._summary[left], self._summary[right]
        ls.locked = rs.locked = True
        ls.readers += 1
        rs.readers += 1
        try:
            plan = await self._in_thread(
                compaction.prepare, self.directory, left, right, self._index, self.file_writer)
        except Exception as e:  # OSError (full disk) or a bug: leave both files as they are
            self._log.error("compaction_failed", left=left, right=right, error=str(e))
            # The left file is untouched, so a leftover copy must not be "redone" at a later
            # start over whatever the left file holds by then.
            compaction.compaction_path(self.directory, left).unlink(missing_ok=True)
            ls.locked = rs.locked = False
            for number, s in ((left, ls), (right, rs)):
                if s.valid_total_size == 0 and number in self._summary:
                    self._delete_file(number)
            return False
        finally:
            ls.readers -= 1
            rs.readers -= 1
        self._moving = (left, plan.prefix_end, plan.moving)
        try:
            await self._in_thread(compaction.apply, self.directory, plan, self.file_writer)
        except Exception as e:
            # Reads keep working (moved bodies from memory, the right file is untouched); the
            # complete .hcmp lets the next start finish the job.
            self._log.error("compaction_stuck", left=left, right=right, error=str(e))
            self._stuck = True
            return False
        self._commit(plan, ls, rs)
        return True

    def _commit(self, plan: compaction.CompactionPlan, ls: FileSummary, rs: FileSummary) -> None:
        left, right = plan.left, plan.right
        index = self._index
        for msg_id, loc, old_file, old_offset, new_offset in plan.moved:
            if loc.file == old_file and loc.offset == old_offset and index.get(msg_id) is loc:
                loc.file, loc.offset = left, new_offset
        for msg_id, loc in plan.lost:
            self._forget(msg_id, loc)
        self._counters["corrupt_records"] += len(plan.lost)
        ls.valid_total_size += rs.valid_total_size
        self._total_bytes += plan.final_size - ls.file_size
        ls.file_size = plan.final_size
        rs.valid_total_size = 0
        self._delete_file(right)
        self._moving = None
        ls.locked = False
        self._counters["compactions"] += 1
        self._log.info("compacted", left=left, right=right, size=plan.final_size,
                       moved=len(plan.moved))
        if ls.valid_total_size == 0 and left != self._cur_file:
            self._delete_file(left)

    def __repr__(self) -> str:
        return f"<MsgStore {self.name} {self._state.value} {len(self._index)} msgs>"
