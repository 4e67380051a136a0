"""What the variable queue needs from the message store and the queue index, and no more.

The real ones live in broker/store/ (msg_store.MsgStore, queue_index.QueueIndex); the variable
queue only sees these protocols, so it can be tested with small in-memory stand-ins."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

__all__ = ["BodyStore", "Index", "IndexEntry", "IndexEntryLike"]


class IndexEntryLike(Protocol):
    """What `Index.read` must return per entry (store.queue_index.IndexEntry is one)."""

    @property
    def seq_id(self) -> int: ...
    @property
    def msg_id(self) -> int: ...
    @property
    def payload(self) -> bytes | None: ...
    @property
    def delivered(self) -> bool: ...


class IndexEntry(NamedTuple):
    """An IndexEntryLike as a plain record (for in-memory indexes). `payload` is the encoded
    message when it is embedded in the index (small messages), None when the body is in a
    message store."""

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
    def read(self, start_seq: int, end_seq: int) -> Sequence[IndexEntryLike]:
        """Un-acked entries with start_seq <= seq_id < end_seq (end exclusive), ascending."""
        ...

    def ack(self, seq_ids: Iterable[int]) -> None: ...
    def should_embed(self, size: int) -> bool: ...
