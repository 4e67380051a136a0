"""The variable queue: RabbitMQ's rabbit_variable_queue as a plain synchronous class.

A queue's ready messages, oldest first, sit in five parts::

    head  q4 | q3 | delta | q2 | q1  tail
          alpha  beta  (disk)  beta  alpha

  alpha  message and position in RAM                          (q1, q4)
  beta   position in RAM, body on disk (store or index)        (q2, q3)
  delta  position and body on disk; RAM holds only a seq range and a count

Publishing appends to q4 while q3 is empty, else to q1 (q3 holding anything means older
messages were paged, so a new one must queue behind them). Under memory pressure
`reduce_memory_use` turns alphas into betas (q1's oldest into q2 -- or q3 when delta is empty
-- then q4's newest into the front of q3) and, once betas pile up, whole index segments of them
into delta (q3 from its rear, never its first segment, then q2 from its front). Fetching takes
q4's head, else reads q3's head back into q4; when q3 runs dry it is refilled one index
segment at a time from delta, and when delta is empty q2 joins q3's rear; with q3, delta and
q2 all empty, q1 becomes q4. Order is FIFO by seq_id throughout, requeues included.

Invariants: q3 empty => q1, q2 and delta empty; q2 non-empty => delta non-empty; every part is
sorted by seq_id and all of q4 < q3 < delta < q2 < q1.

Disk: a persistent message (durable queue, delivery_mode 2) is written at publish: embedded in
the index when `index.should_embed(size)`, else to `store` plus an index entry. A transient one
touches disk only when paged: its body goes to `transient_store`, and its index entry is written
when it enters delta. Fetch returns (seq_id, message, redelivered, expires_at); the message stays
pending until `ack` (which removes its disk copies) or `requeue`."""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from broker.message import Message
from broker.queue.vq_interfaces import BodyStore, Index

__all__ = ["Entry", "VQStats", "VariableQueue"]

Entry = tuple[int, Message, bool, float]
"""(seq_id, message, redelivered, expires_at): the same shape as ram_queue.RamQueue's."""

DEFAULT_SEGMENT_ENTRIES = 16384  # rabbit_queue_index's segment size
DEFAULT_IO_BATCH_SIZE = 2048  # betas -> delta only in batches at least this big


class _Status:
    """One message's place and where its copies are (RabbitMQ's msg_status)."""

    __slots__ = (
        "delivered",
        "embedded",
        "expires_at",
        "in_store",
        "msg",
        "msg_id",
        "on_index",
        "persistent",
        "seq_id",
        "size",
    )

    def __init__(
        self,
        seq_id: int,
        msg_id: int,
        msg: Message | None,
        size: int,
        persistent: bool,
        delivered: bool,
        expires_at: float,
    ) -> None:
        self.seq_id = seq_id
        self.msg_id = msg_id
        self.msg = msg  # None: the body is on disk only
        self.size = size  # body bytes; -1 until read back when loaded from delta
        self.persistent = persistent
        self.delivered = delivered
        self.expires_at = expires_at
        self.in_store = False  # body written to a BodyStore
        self.on_index = False  # index entry written
        self.embedded = False  # body inside the index entry


@dataclass(frozen=True, slots=True)
class VQStats:
    q1: int
    q2: int
    delta: int
    q3: int
    q4: int
    len: int
    ram_msg_count: int
    ram_bytes: int
    pending_acks: int
    target_ram_count: int | None


# compiled by mypyc (broker/compiled.py); subclassed by interpreted queue kinds
@mypyc_attr(allow_interpreted_subclasses=True)
class VariableQueue:
    """Ready messages in RAM or on disk, in FIFO order, plus the pending-ack table.

    `store` holds persistent bodies, `transient_store` (default: `store`) transient ones.
    A non-durable queue treats every message as transient. `client` is passed to the store
    writes of persistent messages (the store's handle for confirms; transient writes pass None).
    seq_ids start at `seq_base`.
    Nothing here awaits: the queue task calls it."""

    def __init__(
        self,
        store: BodyStore,
        index: Index,
        *,
        transient_store: BodyStore | None = None,
        durable: bool = True,
        client: object | None = None,
        segment_entries: int = DEFAULT_SEGMENT_ENTRIES,
        io_batch_size: int = DEFAULT_IO_BATCH_SIZE,
        embed_transient: bool = False,
        seq_base: int = 0,
    ) -> None:
        if segment_entries < 1 or io_batch_size < 1:
            raise ValueError("segment_entries and io_batch_size must be positive")
        self._store = store
        self._transient_store = transient_store if transient_store is not None else store
        self._index = index
        self._durable = durable
        self._client = client
        # A queue whose index is wiped at start (a non-durable queue) may embed transient
        # bodies too: in delta they then cost ~10 bytes of RAM each and no store entry.
        self._embed_transient = embed_transient
        self._segment = segment_entries
        self._io_batch = io_batch_size
        self._q1: deque[_Status] = deque()
        self._q2: deque[_Status] = deque()
        self._q3: deque[_Status] = deque()
        self._q4: deque[_Status] = deque()
        # delta: the un-acked index entries with _delta_start <= seq_id < _delta_end
        self._delta_start = 0
        self._delta_end = 0
        self._delta_count = 0
        # what the index cannot hold for delta entries, kept only when not the default:
        # seq_id -> (delivered, expires_at, persistent)
        self._delta_extra: dict[int, tuple[bool, float, bool]] = {}
        self._pending: dict[int, _Status] = {}
        # where this queue's seq_ids start: the levels of a priority queue share one index,
        # each in a range of its own (broker/queue/priority_queue.py)
        self._next_seq = seq_base
        self._len = 0
        self._bytes = 0  # body bytes of all ready messages, wherever they are
        self._ram = 0  # alphas: ready messages whose body is in RAM
        self._ram_bytes = 0
        self._target: int | None = None
        # monotonic counters, for the message rate the memory monitor shares RAM by
        self.in_count = 0  # published + requeued
        self.out_count = 0  # fetched
        # bodies that could not be read back (damaged on disk, set aside and logged by the
        # store): the message leaves the queue and the next one is read instead
        self.unreadable = 0

    # -- sizes --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    @property
    def bytes_ready(self) -> int:
        return self._bytes

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def ram_msg_count(self) -> int:
        return self._ram

    @property
    def target_ram_count(self) -> int | None:
        return self._target

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def stats(self) -> VQStats:
        return VQStats(
            len(self._q1),
            len(self._q2),
            self._delta_count,
            len(self._q3),
            len(self._q4),
            self._len,
            self._ram,
            self._ram_bytes,
            len(self._pending),
            self._target,
        )

    def seq_layout(self) -> dict[str, list[int]]:
        """seq_ids per part (delta as its [start, end) range) -- for tests and debugging."""
        return {
            "q4": [s.seq_id for s in self._q4],
            "q3": [s.seq_id for s in self._q3],
            "delta": list(range(self._delta_start, self._delta_end)) if self._delta_count else [],
            "q2": [s.seq_id for s in self._q2],
            "q1": [s.seq_id for s in self._q1],
        }

    def recover(self, count: int, start: int, end: int, bytes_ready: int = 0) -> None:
        """After a restart: `count` un-acked index entries with start <= seq_id < end, all in
        delta (nothing read into RAM until fetched, as rabbit_variable_queue's init)."""
        if self._len or self._pending:
            raise RuntimeError("recover() on a queue that is in use")
        self._next_seq = max(self._next_seq, end)
        if count:
            self._delta_start, self._delta_end, self._delta_count = start, end, count
            self._len = count
            self._bytes = bytes_ready
            self._refill_q3()  # keeps "q3 empty => delta empty": the head segment as betas

    # -- publish and fetch --------------------------------------------------------------------
    def publish(self, msg: Message, expires_at: float = 0.0, redelivered: bool = False) -> int:
        """Append `msg`; returns its seq_id. Persistent messages are written to disk now."""
        seq = self._next_seq
        self._next_seq = seq + 1
        size = len(msg.body)
        st = _Status(
            seq, msg.msg_id, msg, size, self._durable and msg.persistent, redelivered, expires_at
        )
        if st.persistent:
            self._write_body(st)
            if not st.on_index:
                self._index.publish(seq, st.msg_id, None)
                st.on_index = True
        (self._q1 if self._q3 else self._q4).append(st)
        self._len += 1
        self.in_count += 1
        self._bytes += size
        self._ram += 1
        self._ram_bytes += size
        if self._target is not None and self._ram > self._target:
            self.reduce_memory_use()
        return seq

    def peek(self) -> Entry | None:
        """The head without taking it (its body is read back into RAM if it was paged)."""
        if not self._q4:
            if not self._q3:
                return None
            self._read_back_head()
            if not self._q4:
                return None
        st = self._q4[0]
        assert st.msg is not None
        return (st.seq_id, st.msg, st.delivered, st.expires_at)

    def fetch(self, ack_required: bool = True) -> Entry | None:
        """Take the head. With ack_required it stays pending until ack or requeue; without,
        it is gone (disk copies removed) at once."""
        if not self._q4:
            if not self._q3:
                return None
            self._read_back_head()
            if not self._q4:
                return None
        st = self._q4.popleft()
        msg = st.msg
        assert msg is not None
        self._len -= 1
        self.out_count += 1
        self._bytes = max(0, self._bytes - st.size)  # recovered sizes are estimates
        self._ram -= 1
        self._ram_bytes -= st.size
        if ack_required:
            self._pending[st.seq_id] = st
        else:
            self._forget((st,))
        return (st.seq_id, msg, st.delivered, st.expires_at)

    def ack(self, seq_ids: Iterable[int]) -> list[Message]:
        """Done with these pending messages: drop them and their disk copies."""
        pop = self._pending.pop
        msgs: list[Message] = []
        acked: list[int] = []
        for s in seq_ids:  # _forget's work in the same pass: this runs for every ack
            st = pop(s, None)
            if st is None:
                continue
            if st.on_index:
                acked.append(st.seq_id)
            if st.in_store:
                self._store_for(st).remove(st.msg_id)
            if st.msg is not None:
                msgs.append(st.msg)
        if acked:
            self._index.ack(acked)
        return msgs

    def drop_pending(self) -> list[Message]:
        """Ack everything pending (queue deletion)."""
        return self.ack(list(self._pending))

    def pending_messages(self, seq_ids: Iterable[int]) -> list[tuple[int, Message]]:
        """(seq_id, message) of these pending messages, left pending."""
        pending = self._pending
        out = []
        for seq in seq_ids:
            st = pending.get(seq)
            if st is not None and st.msg is not None:
                out.append((seq, st.msg))
        return out

    def requeue(self, seq_ids: Iterable[int]) -> int:
        """Put pending messages back in seq order among the ready ones (so at the head, behind
        any older requeued ones), marked redelivered. Returns how many went back."""
        return self._put_back(seq_ids, True)

    def restore(self, seq_ids: Iterable[int]) -> int:
        """Put pending messages back where they were, not marked redelivered and no longer to
        expire: messages the queue took to expire or dead-letter and could not."""
        return self._put_back(seq_ids, False)

    def _put_back(self, seq_ids: Iterable[int], redelivered: bool) -> int:
        pending = self._pending
        back = sorted(
            (st for st in (pending.pop(s, None) for s in seq_ids) if st is not None),
            key=_seq,
        )
        if not back:
            return 0
        self.in_count += len(back)
        for st in back:
            if redelivered:
                st.delivered = True
            else:
                st.expires_at = 0.0
            self._len += 1
            self._bytes += st.size
        # Older than q3's head: alphas in q4. Older than delta: betas in q3. Else delta (a
        # pending seq_id is older than everything in delta, so in practice never).
        q3_head = self._q3[0].seq_id if self._q3 else None
        delta_head = self._delta_start if self._delta_count else None
        to_q4 = [st for st in back if q3_head is None or st.seq_id < q3_head]
        to_q3 = [st for st in back[len(to_q4) :] if delta_head is None or st.seq_id < delta_head]
        to_delta = back[len(to_q4) + len(to_q3) :]
        for st in to_q4:
            self._ram += 1
            self._ram_bytes += st.size
        _merge_front(self._q4, to_q4)
        for st in to_q3:
            self._write_body(st)
            st.msg = None
        _merge_front(self._q3, to_q3)
        for st in to_delta:
            self._write_body(st)
            self._enter_delta(st)
            self._delta_start = min(self._delta_start, st.seq_id)
        if self._target is not None and self._ram > self._target:
            self.reduce_memory_use()
        return len(back)

    def purge(self) -> int:
        """Drop every ready message (pending ones stay); returns how many."""
        n = self._len
        doomed: list[_Status] = []
        for q in (self._q1, self._q2, self._q3, self._q4):
            doomed.extend(q)
            q.clear()
        self._forget(doomed)
        self._purge_delta()
        self._len = self._bytes = self._ram = self._ram_bytes = 0
        return n

    # -- memory -------------------------------------------------------------------------------
    def set_target_ram_count(self, n: int | None) -> None:
        """How many ready messages may keep their body in RAM (None: no limit)."""
        if n is not None and n < 0:
            raise ValueError(f"target_ram_count must not be negative: {n}")
        self._target = n
        self.reduce_memory_use()

    def reduce_memory_use(self) -> None:
        """Page out to meet the target: alphas to betas for the excess, then betas to delta
        when more than an I/O batch of them exceeds the permitted beta count."""
        target = self._target
        if target is None:
            return
        if self._ram > target:
            self.push_alphas_to_betas(self._ram - target)
        excess = len(self._q2) + len(self._q3) - self._permitted_beta_count()
        if excess >= self._io_batch:
            self.push_betas_to_deltas(excess)

    def push_alphas_to_betas(self, quota: int) -> int:
        """q1's oldest, then q4's newest, lose their bodies; returns the quota left."""
        return self.push_q4_to_q3(self.push_q1_to_betas(quota))

    def push_q1_to_betas(self, quota: int) -> int:
        """Up to `quota` of q1's oldest become betas at q2's rear (q3's when delta is empty)."""
        q1 = self._q1
        to = self._q2 if self._delta_count else self._q3
        while quota > 0 and q1:
            st = q1.popleft()
            self._drop_body(st)
            to.append(st)
            quota -= 1
        return quota

    def push_q4_to_q3(self, quota: int) -> int:
        """Up to `quota` of q4's newest become betas at q3's front."""
        q4, q3 = self._q4, self._q3
        while quota > 0 and q4:
            st = q4.pop()
            self._drop_body(st)
            q3.appendleft(st)
            quota -= 1
        return quota

    def push_betas_to_deltas(self, quota: int) -> int:
        """Up to `quota` betas go to delta: q3's newest first, keeping q3's first index segment
        (so its head is always at hand), then q2's oldest. Returns the quota left."""
        q3, q2 = self._q3, self._q2
        if q3:
            limit = self._next_boundary(q3[0].seq_id)
            while quota > 0 and q3[-1].seq_id >= limit:
                st = q3.pop()
                self._enter_delta(st)
                self._delta_start = st.seq_id
                quota -= 1
        while quota > 0 and q2:
            st = q2.popleft()
            self._enter_delta(st)
            quota -= 1
        return quota

    # -- internals ----------------------------------------------------------------------------
    def _next_boundary(self, seq_id: int) -> int:
        return (seq_id // self._segment + 1) * self._segment

    def _permitted_beta_count(self) -> int:
        """rabbit_variable_queue's permitted_beta_count: how many betas may stay in RAM."""
        if self._len == 0:
            return 1 << 62
        target = self._target or 0
        if target == 0:
            return min(len(self._q3), self._segment)
        beta_delta = self._len - len(self._q1) - len(self._q4)
        return max(self._segment, beta_delta - beta_delta * beta_delta // (beta_delta + target))

    def _store_for(self, st: _Status) -> BodyStore:
        return self._store if st.persistent else self._transient_store

    def _write_body(self, st: _Status) -> None:
        """Make sure the body is on disk: persistent small ones in the index, else a store."""
        if st.in_store or st.embedded:
            return
        assert st.msg is not None
        data = st.msg.encode()
        if (st.persistent or self._embed_transient) and self._index.should_embed(len(data)):
            # transient bodies go into a durable queue's index never: recovery would bring
            # them back
            self._index.publish(st.seq_id, st.msg_id, data)
            st.on_index = st.embedded = True
        else:
            # only persistent writes are confirmed by the store; a transient message was
            # confirmed when it was enqueued, paging it must not confirm it again
            client = self._client if st.persistent else None
            self._store_for(st).write(st.msg_id, data, client)
            st.in_store = True

    def _drop_body(self, st: _Status) -> None:
        """alpha -> beta."""
        self._write_body(st)
        st.msg = None
        self._ram -= 1
        self._ram_bytes -= st.size

    def _enter_delta(self, st: _Status) -> None:
        """beta -> delta: the caller moves _delta_start or (here) _delta_end around it."""
        if not st.on_index:
            self._index.publish(st.seq_id, st.msg_id, None)
            st.on_index = True
        if st.delivered or st.expires_at or st.persistent != self._durable:
            self._delta_extra[st.seq_id] = (st.delivered, st.expires_at, st.persistent)
        if self._delta_count == 0:
            self._delta_start = st.seq_id
        self._delta_end = max(self._delta_end, st.seq_id + 1)
        self._delta_count += 1

    def _read_back_head(self) -> None:
        """q3's head -> q4's rear (q4 is empty) with its body read from disk. A body that
        cannot be read (the store found its record damaged and set it aside) is skipped: that
        message leaves the queue, `unreadable` counts it, and the next one is read. q4 stays
        empty only when nothing readable was left."""
        while self._q3:
            st = self._q3.popleft()
            try:
                msg = self._read_body(st)
            except (LookupError, ValueError, struct.error):
                self._unreadable(st)
            else:
                st.msg = msg
                if st.size < 0:  # loaded from delta: the index does not know sizes
                    st.size = len(msg.body)
                self._ram += 1
                self._ram_bytes += st.size
                self._q4.append(st)
                if not self._q3:
                    self._refill_q3()
                return
            if not self._q3:
                self._refill_q3()

    def _read_body(self, st: _Status) -> Message:
        data: bytes | None
        if st.in_store:
            data = self._store_for(st).read(st.msg_id)
        else:
            entries = self._index.read(st.seq_id, st.seq_id + 1)
            data = entries[0].payload if entries else None
            if data is None:
                raise LookupError(f"seq_id {st.seq_id} is missing from the queue index")
        return Message.decode(data, st.msg_id)

    def _unreadable(self, st: _Status) -> None:
        """A ready message whose body is gone: it leaves the queue (its index entry is acked;
        the store has already dropped the body, and set the damaged record aside)."""
        self._len -= 1
        self._bytes = max(0, self._bytes - max(0, st.size))
        if st.on_index:
            self._index.ack([st.seq_id])
        self.unreadable += 1

    def _refill_q3(self) -> None:
        """q3 ran dry: load delta a segment at a time; delta empty -> q2 joins q3; all of q3,
        delta and q2 empty -> q1 becomes q4 (maybe_deltas_to_betas and fetch_from_q3)."""
        q3 = self._q3
        while self._delta_count and not q3:
            start = self._delta_start
            stop = min(self._next_boundary(start), self._delta_end)
            self._delta_start = stop
            for e in self._index.read(start, stop):
                if e.seq_id in self._pending:
                    continue
                extra = self._delta_extra.pop(e.seq_id, None)
                delivered, expires_at, persistent = extra or (False, 0.0, self._durable)
                st = _Status(
                    e.seq_id, e.msg_id, None, -1, persistent, delivered or e.delivered, expires_at
                )
                st.on_index = True
                st.embedded = e.payload is not None
                st.in_store = not st.embedded
                q3.append(st)
                self._delta_count -= 1
            if stop >= self._delta_end:
                self._delta_count = 0  # the index had fewer entries than we counted
        if self._delta_count == 0:
            self._delta_start = self._delta_end = 0
            self._delta_extra.clear()
            q3.extend(self._q2)
            self._q2.clear()
        if not q3:
            self._q4.extend(self._q1)
            self._q1.clear()

    def _forget(self, statuses: Iterable[_Status]) -> None:
        """Remove the disk copies of messages that are gone for good."""
        acked: list[int] = []
        for st in statuses:
            if st.on_index:
                acked.append(st.seq_id)
            if st.in_store:
                self._store_for(st).remove(st.msg_id)
        if acked:
            self._index.ack(acked)

    def _purge_delta(self) -> None:
        start, end = self._delta_start, self._delta_end
        while self._delta_count and start < end:
            stop = min(self._next_boundary(start), end)
            acked: list[int] = []
            for e in self._index.read(start, stop):
                if e.seq_id in self._pending:
                    continue
                acked.append(e.seq_id)
                if e.payload is None:
                    extra = self._delta_extra.get(e.seq_id)
                    persistent = extra[2] if extra else self._durable
                    (self._store if persistent else self._transient_store).remove(e.msg_id)
            if acked:
                self._index.ack(acked)
            start = stop
        self._delta_start = self._delta_end = self._delta_count = 0
        self._delta_extra.clear()


def _seq(st: _Status) -> int:
    return st.seq_id


def _merge_front(q: deque[_Status], items: list[_Status]) -> None:
    """Merge sorted `items` into sorted `q`; they belong near its front."""
    if not items:
        return
    top = items[-1].seq_id
    ahead: list[_Status] = []
    while q and q[0].seq_id < top:
        ahead.append(q.popleft())
    merged = sorted(ahead + items, key=_seq) if ahead else items
    q.extendleft(reversed(merged))
