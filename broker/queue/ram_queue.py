"""The in-RAM backing queue: ready messages in FIFO order plus the pending-ack table.

It has the backing-queue shape of RabbitMQ's rabbit_backing_queue (publish, fetch, ack,
requeue, purge) so the variable queue, which pages to disk, can take its place."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from broker.message import Message

__all__ = ["Entry", "RamQueue"]

# (seq_id, message, redelivered, expires_at) — a tuple: cheapest record CPython has.
Entry = tuple[int, Message, bool, float]


class RamQueue:
    __slots__ = ("bytes_ready", "next_seq", "pending", "ready")

    def __init__(self) -> None:
        self.ready: deque[Entry] = deque()
        self.pending: dict[int, Entry] = {}
        self.next_seq = 1
        self.bytes_ready = 0

    def __len__(self) -> int:
        return len(self.ready)

    @property
    def pending_count(self) -> int:
        return len(self.pending)

    def publish(self, msg: Message, expires_at: float = 0.0, redelivered: bool = False) -> int:
        seq = self.next_seq
        self.next_seq = seq + 1
        self.ready.append((seq, msg, redelivered, expires_at))
        self.bytes_ready += len(msg.body)
        return seq

    def peek(self) -> Entry | None:
        return self.ready[0] if self.ready else None

    def fetch(self, ack_required: bool) -> Entry | None:
        if not self.ready:
            return None
        entry = self.ready.popleft()
        self.bytes_ready -= len(entry[1].body)
        if ack_required:
            self.pending[entry[0]] = entry
        return entry

    def ack(self, seqs: Iterable[int]) -> list[Entry]:
        pending = self.pending
        out = []
        for seq in seqs:
            entry = pending.pop(seq, None)
            if entry is not None:
                out.append(entry)
        return out

    def requeue(self, seqs: Iterable[int]) -> int:
        """Put pending messages back at the head, in their original order, marked redelivered."""
        pending = self.pending
        back = sorted(
            (
                (e[0], e[1], True, e[3])
                for e in (pending.pop(s, None) for s in seqs)
                if e is not None
            ),
            key=lambda e: e[0],
        )
        if not back:
            return 0
        ready = self.ready
        # Ready messages older than a requeued one (earlier requeues) keep their place.
        ahead: list[Entry] = []
        top = back[-1][0]
        while ready and ready[0][0] < top:
            ahead.append(ready.popleft())
        merged = sorted(ahead + back, key=lambda e: e[0]) if ahead else back
        ready.extendleft(reversed(merged))
        self.bytes_ready += sum(len(e[1].body) for e in back)
        return len(back)

    def purge(self) -> list[Entry]:
        entries = list(self.ready)
        self.ready.clear()
        self.bytes_ready = 0
        return entries

    def recovered(self, seq: int, msg: Message, redelivered: bool) -> None:
        """A message read back from the queue index at start, in seq order."""
        self.ready.append((seq, msg, redelivered, 0.0))
        self.bytes_ready += len(msg.body)
        self.next_seq = max(self.next_seq, seq + 1)
