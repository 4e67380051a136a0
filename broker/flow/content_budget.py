"""Credit for message bodies still arriving, node-wide.

A reader holds a message's body frames until the last one comes (as RabbitMQ's reader does), and
nothing downstream sees them before that: neither credit flow (which counts whole messages) nor
paging. A client that announces a large body and never finishes it, on many channels of many
connections, would hold memory that no alarm can give back. So every reader reports the bytes it
holds for incomplete messages here, and is told whether it may read on:

- while the node's total is at most `limit`, everyone reads;
- above it, a reader holding more than an even share (limit / number of holders) stops reading
  its socket, until the total falls or its share grows;
- the reader holding the most goes on while it holds at most `largest` (max(limit,
  max_message_size)): a message in progress can always complete, even alone bigger than the whole
  budget, and free its bytes; no one connection can hold more than that, however many channels
  it interleaves.

A client sending ordinary messages holds a few frames at most, well inside its share, and is
never stopped by a client that hoards. At most limit + largest + one socket read per holder is
held, whatever the number of connections and channels. What can wait for ever is a connection
interleaving more than `largest` bytes of incomplete messages while others hold the rest of the
budget and never finish theirs."""

from __future__ import annotations

from typing import Protocol

__all__ = ["ContentBudget", "ContentHolder"]


class ContentHolder(Protocol):
    content_held: int  # bytes of incomplete message bodies this holder keeps

    def content_budget_freed(self) -> None:
        """Bytes were freed elsewhere: a holder that stopped reading may read again."""


class ContentBudget:
    __slots__ = ("_holders", "_waiting", "largest", "limit", "total")

    def __init__(self, limit: int, max_message_size: int = 0) -> None:
        if limit < 1:
            raise ValueError(f"content budget must be positive: {limit}")
        self.limit = limit
        self.largest = max(limit, max_message_size)
        self.total = 0
        self._holders: set[ContentHolder] = set()
        self._waiting: set[ContentHolder] = set()

    @property
    def holders(self) -> int:
        return len(self._holders)

    def add(self, holder: ContentHolder, n: int) -> None:
        """`holder` now keeps `n` more bytes (fewer when negative)."""
        held = holder.content_held + n
        holder.content_held = held
        self.total += n
        if held:
            self._holders.add(holder)
        else:
            self._holders.discard(holder)
        if n < 0 and self._waiting:
            self._wake()

    def over(self, holder: ContentHolder) -> bool:
        """Must `holder` stop reading? (See the module's rules.)"""
        if self.total <= self.limit:
            return False
        held = holder.content_held
        if held * len(self._holders) <= self.limit:
            return False
        # one holder goes on, the one with most bytes (the first found among equals); it grows,
        # so it stays the one until its message completes
        return held >= self.largest or holder is not max(self._holders, key=_held)

    def wait(self, holder: ContentHolder) -> bool:
        """`holder` stopped reading because it is over: tell it when bytes are freed. False if
        it was waiting already."""
        if holder in self._waiting:
            return False
        self._waiting.add(holder)
        return True

    def forget(self, holder: ContentHolder) -> None:
        """`holder` is gone (connection closed): everything it kept is freed."""
        self._waiting.discard(holder)
        if holder.content_held:
            self.add(holder, -holder.content_held)

    def _wake(self) -> None:
        for holder in [h for h in self._waiting if not self.over(h)]:
            self._waiting.discard(holder)
            holder.content_budget_freed()


def _held(holder: ContentHolder) -> int:
    return holder.content_held
