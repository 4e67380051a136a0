"""Priority queues (x-max-priority): RabbitMQ's rabbit_priority_queue over the variable queue.

One `VariableQueue` per priority level, each its own q1..q4/delta chain, so paging stays what
it is for a plain queue: every level pages its own messages in FIFO order, and the number of
bodies in RAM is bounded by the sum of the levels' targets (the queue's target, shared out
below). Levels are made on first use: a queue declared with x-max-priority 255 that only ever
sees priorities 0 and 5 holds two.

A message's level is its `priority` property, capped at the queue's maximum (absent: 0).
Fetching takes the head of the highest non-empty level, so delivery is highest priority first
and FIFO within a priority, requeues included (a requeued message goes back into its level in
seq order).

seq_ids: the levels share the queue's one index and its disk side (confirms, fsync, recovery),
each in a range of its own: level p numbers from `p << LEVEL_SHIFT`. A seq_id therefore says
its level (`seq_id >> LEVEL_SHIFT`), and the channel and the queue ack, reject and requeue by
seq_id as for any queue. 2**48 seq_ids a level: 89 years at 100,000 messages a second."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from broker.message import Message, parse_priority
from broker.queue.variable_queue import Entry, VariableQueue

__all__ = ["LEVEL_SHIFT", "PriorityQueue"]

LEVEL_SHIFT = 48


class PriorityQueue:
    """The variable queue's interface (what AMQQueue uses) over one VariableQueue a level.
    `make(seq_base)` builds a level's queue."""

    def __init__(self, max_priority: int, make: Callable[[int], VariableQueue]) -> None:
        if not 1 <= max_priority <= 255:
            raise ValueError(f"max_priority must be 1..255: {max_priority}")
        self.max_priority = max_priority
        self._make = make
        self._levels: dict[int, VariableQueue] = {}
        self._order: list[VariableQueue] = []  # the levels made so far, highest first
        self._rank: dict[int, int] = {}  # level -> its index in _order
        # every level in _order before this index is empty: fetch starts looking here
        self._head = 0
        self._len = 0  # ready messages over all levels (asked once per delivery)
        self._target: int | None = None

    def _level(self, level: int) -> VariableQueue:
        """The level's queue, made on first use; marks it as maybe holding messages."""
        vq = self._levels.get(level)
        if vq is None:
            vq = self._levels[level] = self._make(level << LEVEL_SHIFT)
            ranked = sorted(self._levels, reverse=True)
            self._order = [self._levels[p] for p in ranked]
            self._rank = {p: i for i, p in enumerate(ranked)}
            self._head = 0
            if self._target is not None:
                self._share_target()
        rank = self._rank[level]
        if rank < self._head:
            self._head = rank
        return vq

    def _first(self) -> VariableQueue | None:
        """The highest level that holds a ready message."""
        order = self._order
        i = self._head
        n = len(order)
        while i < n:
            vq = order[i]
            if vq:
                self._head = i
                return vq
            i += 1
        self._head = n
        return None

    # -- sizes --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    @property
    def bytes_ready(self) -> int:
        return sum(vq.bytes_ready for vq in self._order)

    @property
    def pending_count(self) -> int:
        return sum(vq.pending_count for vq in self._order)

    @property
    def ram_msg_count(self) -> int:
        return sum(vq.ram_msg_count for vq in self._order)

    @property
    def target_ram_count(self) -> int | None:
        return self._target

    @property
    def in_count(self) -> int:
        return sum(vq.in_count for vq in self._order)

    @property
    def out_count(self) -> int:
        return sum(vq.out_count for vq in self._order)

    def levels(self) -> dict[int, VariableQueue]:
        """The levels made so far, by priority (for tests and debugging)."""
        return dict(self._levels)

    # -- the variable queue's operations ------------------------------------------------------
    def recover(self, count: int, start: int, end: int, bytes_ready: int = 0) -> None:
        """One level's share of the index after a restart (see QueueDurability.recover)."""
        self._level(start >> LEVEL_SHIFT).recover(count, start, end, bytes_ready)
        self._len += count

    def publish(self, msg: Message, expires_at: float = 0.0, redelivered: bool = False) -> int:
        level = parse_priority(msg.props)
        if level > self.max_priority:
            level = self.max_priority
        vq = self._levels.get(level)
        if vq is None:
            vq = self._level(level)
        else:  # _level's bookkeeping, inline: this is once a message
            rank = self._rank[level]
            if rank < self._head:
                self._head = rank
        self._len += 1
        return vq.publish(msg, expires_at, redelivered)

    def peek(self) -> Entry | None:
        while True:
            vq = self._first()
            if vq is None:
                return None
            before = len(vq)  # a level may skip unreadable bodies on the way
            entry = vq.peek()
            self._len -= before - len(vq)
            if entry is not None:
                return entry

    def fetch(self, ack_required: bool = True) -> Entry | None:
        while True:
            vq = self._first()
            if vq is None:
                return None
            before = len(vq)  # a level may skip unreadable bodies on the way
            entry = vq.fetch(ack_required)
            self._len -= before - len(vq)
            if entry is not None:
                return entry

    def ack(self, seq_ids: Iterable[int]) -> list[Message]:
        out: list[Message] = []
        for level, seqs in _by_level(seq_ids).items():
            vq = self._levels.get(level)
            if vq is not None:
                out.extend(vq.ack(seqs))
        return out

    def drop_pending(self) -> list[Message]:
        out: list[Message] = []
        for vq in self._order:
            out.extend(vq.drop_pending())
        return out

    def pending_messages(self, seq_ids: Iterable[int]) -> list[tuple[int, Message]]:
        out: list[tuple[int, Message]] = []
        for level, seqs in _by_level(seq_ids).items():
            vq = self._levels.get(level)
            if vq is not None:
                out.extend(vq.pending_messages(seqs))
        return out

    def requeue(self, seq_ids: Iterable[int]) -> int:
        back = 0
        for level, seqs in _by_level(seq_ids).items():
            if level in self._levels:
                back += self._level(level).requeue(seqs)
        self._len += back
        return back

    def restore(self, seq_ids: Iterable[int]) -> int:
        back = 0
        for level, seqs in _by_level(seq_ids).items():
            if level in self._levels:
                back += self._level(level).restore(seqs)
        self._len += back
        return back

    def purge(self) -> int:
        n = sum(vq.purge() for vq in self._order)
        self._len = 0
        return n

    # -- memory -------------------------------------------------------------------------------
    def set_target_ram_count(self, n: int | None) -> None:
        """The queue's RAM target, shared out highest level first: each level may keep as
        many bodies as it holds now, what is left goes to the highest level (new messages
        there are the next to go out). Shared again whenever a level is made."""
        if n is not None and n < 0:
            raise ValueError(f"target_ram_count must not be negative: {n}")
        self._target = n
        self._share_target()

    def _share_target(self) -> None:
        n = self._target
        if n is None:
            for vq in self._order:
                vq.set_target_ram_count(None)
            return
        shares = []
        left = n
        for vq in self._order:
            share = min(left, len(vq))
            shares.append(share)
            left -= share
        if shares:
            shares[0] += left
        for vq, share in zip(self._order, shares, strict=True):
            vq.set_target_ram_count(share)


def _by_level(seq_ids: Iterable[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for seq in seq_ids:
        level = seq >> LEVEL_SHIFT
        seqs = out.get(level)
        if seqs is None:
            out[level] = [seq]
        else:
            seqs.append(seq)
    return out
