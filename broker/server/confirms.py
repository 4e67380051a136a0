"""Publisher confirms as a plain ledger, as RabbitMQ's rabbit_confirms: no I/O, no loop.

A publish in confirm mode is recorded with the number of queues it went to, `pending[seq] =
queues` (a plain store: the publish path pays no call for it); each queue settles it once
(confirm, reject, or lost when its node is gone). Once every queue has settled it, it is
confirmed if at least one queue confirmed it and none rejected it; a rejection, or every queue
lost, nacks it. A lost queue can be told after another queue already confirmed the publish (a
queue confirms a transient message as it takes it), so the ledger remembers, for a publish still
waited on, that some queue has it (`_reached`; only publishes routed to several queues get there).
`take` answers what to send: the nacks, and the acks with whether one basic.ack multiple=true
may cover a run of them. The channel encodes and sends the frames."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["Confirms"]


class Confirms:
    __slots__ = ("_acks", "_nacks", "_reached", "pending")

    def __init__(self) -> None:
        self.pending: OrderedDict[int, int] = OrderedDict()  # seq -> queues yet to settle it
        self._acks: list[int] = []
        self._nacks: list[int] = []
        self._reached: set[int] = set()  # pending publishes some queue has confirmed

    def __len__(self) -> int:
        """Publishes not yet settled (management's messages_unconfirmed)."""
        return len(self.pending)

    def settled(self, seq: int, ok: bool) -> None:
        """A publish that reached no queue: answered at once."""
        (self._acks if ok else self._nacks).append(seq)

    def confirm(self, seqs: list[int]) -> None:
        """One queue has these (a seq it does not hold, or already settled, is ignored)."""
        pending = self.pending
        reached = self._reached
        for seq in seqs:
            left = pending.get(seq)
            if left is None:
                continue
            if left == 1:
                del pending[seq]
                self._acks.append(seq)
                if reached:
                    reached.discard(seq)
            else:
                pending[seq] = left - 1
                reached.add(seq)

    def reject(self, seqs: list[int]) -> None:
        """A queue refused these: nacked whatever the other queues do."""
        for seq in seqs:
            if self.pending.pop(seq, None) is not None:
                self._nacks.append(seq)
                self._reached.discard(seq)

    def lost(self, seq: int) -> None:
        """A queue that will never answer: if it was the last one waited for, confirmed when
        another queue has it and nacked when none has; else the others decide."""
        left = self.pending.get(seq)
        if left == 1:
            del self.pending[seq]
            if seq in self._reached:
                self._reached.remove(seq)
                self._acks.append(seq)
            else:
                self._nacks.append(seq)
        elif left is not None:
            self.pending[seq] = left - 1

    def take(self) -> tuple[list[int], list[tuple[int, bool]]]:
        """(nacks, acks as (seq, multiple)), in seq order, and forget them. Acks below every
        pending seq go as one multiple ack of the highest; the rest one by one."""
        nacks, self._nacks = sorted(self._nacks), []
        acks, self._acks = self._acks, []
        if not acks:
            return nacks, []
        acks.sort()
        low = next(iter(self.pending)) if self.pending else None
        below = acks if low is None else [a for a in acks if a < low]
        out = [(below[-1], len(below) > 1)] if below else []
        out += [(a, False) for a in acks[len(below):]]
        return nacks, out
