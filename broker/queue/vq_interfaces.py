"""What the variable queue needs from the message store and the queue index, and no more.

The real ones live in broker/store/ (msg_store.MsgStore, queue_index.QueueIndex); the variable
queue only sees these protocols, so it can be tested with small in-memory stand-ins."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol

__all__ = ["BodyStore", "Index", "IndexEntry"]


class IndexEntry(NamedTuple):
    """One un-acked index entry. `payload` is the encoded message when it is embedded in the
    index (small messages), None when the body is in a message store."""

    seq_id: int
    msg_id: int
    payload: bytes | None
    delivered: bool


class BodyStore(Protocol):
    """A message store: bodies by msg_id, reference-counted by the store itself (one write
    per queue that holds the message, one remove per queue that is done with it)."""

    def write(self, msg_id: int, data: bytes, client: object | None) -> None: ...
    def read(self, msg_id: int) -> bytes: ...
    def remove(self, msg_id: int) -> None: ...


class Index(Protocol):
    """A queue index: positions (seq_id -> msg_id), optionally with the message embedded."""

    def publish(self, seq_id: int, msg_id: int, payload: bytes | None) -> None: ...
    def read(self, start_seq: int, end_seq: int) -> list[IndexEntry]:
        """Un-acked entries with start_seq <= seq_id < end_seq (end exclusive), ascending."""
        ...

    def ack(self, seq_ids: Iterable[int]) -> None: ...
    def should_embed(self, size: int) -> bool: ...
