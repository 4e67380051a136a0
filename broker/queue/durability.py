"""The disk side of a queue: its queue index (created lazily for transient queues), the
publisher confirms that wait on the disk, and recovery after a restart.

The variable queue writes bodies and index records (persistent messages at publish, transient
ones when paged) and removes them when messages go. This class adds what confirms need: index
records are flushed to the OS after each queue batch and fsynced in a worker thread (one fsync
covers every batch that arrived meanwhile: group commit); the store reports its own fsyncs
through `msgs_durable`. A confirm goes out when every part of its message is safe."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import structlog

from broker.flow.credit_flow import CreditFlow
from broker.message import Message
from broker.queue.priority_queue import LEVEL_SHIFT
from broker.store.queue_index import IndexEntry, QueueIndex

if TYPE_CHECKING:
    from broker.queue.amqqueue import AMQQueue
    from broker.queue.contract import PublishingChannel
    from broker.store.msg_store import MsgStore

__all__ = ["LazyIndex", "QueueDurability", "StoreLink", "StorePeer"]

log = structlog.get_logger("hare.queue")


class LazyIndex:
    """A QueueIndex made on first write: most transient queues never page, and then never
    touch the disk at all."""

    __slots__ = ("_factory", "_index", "embed_below")

    def __init__(self, factory: Callable[[], QueueIndex], embed_below: int) -> None:
        self._factory = factory
        self._index: QueueIndex | None = None
        self.embed_below = embed_below

    @property
    def index(self) -> QueueIndex:
        if self._index is None:
            self._index = self._factory()
        return self._index

    @property
    def created(self) -> bool:
        return self._index is not None

    def should_embed(self, size: int) -> bool:
        return size < self.embed_below

    def publish(self, seq_id: int, msg_id: int, payload: bytes | None) -> None:
        self.index.publish(seq_id, msg_id, payload)

    def read(self, start_seq: int, end_seq: int) -> Sequence[IndexEntry]:
        return self._index.read(start_seq, end_seq) if self._index is not None else []

    def ack(self, seq_ids: Iterable[int]) -> None:
        if self._index is not None:
            self._index.ack(seq_ids)

    def deliver(self, seq_ids: Iterable[int]) -> None:
        if self._index is not None:
            self._index.deliver(seq_ids)

    def flush(self) -> None:
        if self._index is not None:
            self._index.flush()

    def sync(self) -> None:
        if self._index is not None:
            self._index.sync()

    def close(self) -> None:
        if self._index is not None:
            self._index.close()

    def delete(self) -> None:
        if self._index is not None:
            self._index.delete()


class StorePeer:
    """A message store's side of credit flow: one per store, shared by its queues."""

    __slots__ = ("credit_flow", "name")

    def __init__(self, name: str, initial_credit: int, more_credit_after: int) -> None:
        self.name = name
        self.credit_flow = CreditFlow(self, initial_credit, more_credit_after)


class StoreLink:
    """The queue -> msg_store link, as the variable queue sees a store: every write spends a
    credit of the queue's; the store's report on the write (msgs_durable, once per batch)
    grants it back. A store that falls behind blocks the queue, whose grants to channels are
    then deferred, and so on up to the reader's socket."""

    __slots__ = ("client", "owner", "peer", "queue", "store")

    def __init__(self, queue: AMQQueue, store: MsgStore, peer: StorePeer,
                 client: QueueDurability | None) -> None:
        self.queue = queue
        self.store = store
        self.peer = peer
        self.client = client  # told about persistent writes (confirms)
        self.owner = (queue.vhost.name, queue.name)  # named by a record set aside

    def write(self, msg_id: int, data: bytes, client: object | None) -> None:
        self.queue.credit_flow.send(self.peer)
        self.store.write(msg_id, data, self)
        if self.client is not None:
            self.client.stored_this_batch.add(msg_id)  # its confirm waits for the store too

    def read(self, msg_id: int) -> bytes:
        return self.store.read(msg_id, self.owner)

    def remove(self, msg_id: int) -> None:
        self.store.remove(msg_id)

    def msgs_durable(self, msg_ids: list[int]) -> None:
        self.peer.credit_flow.ack_many(self.queue, len(msg_ids))
        if self.client is not None:
            self.client.msgs_durable(msg_ids)  # it ignores ids that were only paged out

    def msgs_failed(self, msg_ids: list[int], error: OSError) -> None:
        self.peer.credit_flow.ack_many(self.queue, len(msg_ids))
        if self.client is not None:
            self.client.msgs_failed(msg_ids, error)


class _Pending:
    """A confirm waiting for `needs` more parts (index fsync, store fsync) to be durable."""

    __slots__ = ("channel", "cseq", "needs")

    def __init__(self, channel: PublishingChannel, cseq: int, needs: int) -> None:
        self.channel = channel
        self.cseq = cseq
        self.needs = needs


class QueueDurability:
    """One per queue. `persistent` is True for a durable queue, whose persistent messages
    are confirmed only once on disk and come back after a restart."""

    def __init__(
        self,
        queue: AMQQueue,
        index: LazyIndex,
        store: MsgStore,
        *,
        persistent: bool,
        fsync: str = "batch",
    ) -> None:
        self.queue = queue
        self.index = index
        self.store = store
        self.persistent = persistent
        self.fsync = fsync
        self._by_msg: dict[int, _Pending] = {}
        # bodies the variable queue just wrote to the store (not embedded in the index); the
        # next track() of that message takes its id out. Told by StoreLink, so the embedding
        # rule lives in one place (VariableQueue._write_body).
        self.stored_this_batch: set[int] = set()
        self._batch: list[_Pending] = []
        self._sync_waiting: list[list[_Pending]] = []
        self._syncing = False
        self._delivered: list[int] = []

    # -- confirms ---------------------------------------------------------------------------
    def track(self, msg: Message, channel: PublishingChannel, cseq: int) -> None:
        """A persistent message the variable queue just wrote: confirm it once it is safe."""
        needs = 1  # the index record
        if msg.msg_id in self.stored_this_batch:
            self.stored_this_batch.discard(msg.msg_id)
            needs = 2  # and the body in the store
        p = _Pending(channel, cseq, needs)
        if needs == 2:
            self._by_msg[msg.msg_id] = p
        self._batch.append(p)

    def end_batch(self) -> None:
        """After a queue batch: index records to the OS, then a (grouped) fsync."""
        self.stored_this_batch.clear()  # messages published without a confirm leave ids here
        if self._delivered:
            self.index.deliver(self._delivered)
            self._delivered = []
        self.index.flush()
        batch = self._batch
        if not batch:
            return
        self._batch = []
        if self.fsync == "never":
            self._index_done(batch)
            return
        self._sync_waiting.append(batch)
        self._kick_sync()

    def _kick_sync(self) -> None:
        if self._syncing or not self._sync_waiting:
            return
        self._syncing = True
        batches, self._sync_waiting = self._sync_waiting, []
        fut = asyncio.get_running_loop().run_in_executor(None, self.index.sync)
        fut.add_done_callback(lambda f: self._synced(batches, f))

    def _synced(self, batches: list[list[_Pending]], fut: asyncio.Future[None]) -> None:
        self._syncing = False
        exc = fut.exception()
        if exc is not None:
            log.error("queue index fsync failed", queue=self.queue.name, error=str(exc))
            for batch in batches:
                self._fail(batch)
        else:
            for batch in batches:
                self._index_done(batch)
        self._kick_sync()

    def _index_done(self, batch: list[_Pending]) -> None:
        ready = [p for p in batch if _settle(p)]
        if ready:
            self._confirm(ready)

    # StoreClient
    def msgs_durable(self, msg_ids: list[int]) -> None:
        by_msg = self._by_msg
        ready = []
        for msg_id in msg_ids:
            p = by_msg.pop(msg_id, None)
            if p is not None and _settle(p):
                ready.append(p)
        if ready:
            self._confirm(ready)

    def msgs_failed(self, msg_ids: list[int], error: OSError) -> None:
        log.error("message store write failed", queue=self.queue.name, error=str(error),
                  messages=len(msg_ids))
        self._fail([p for p in (self._by_msg.pop(m, None) for m in msg_ids) if p is not None])

    def _confirm(self, ready: list[_Pending]) -> None:
        by_channel: dict[PublishingChannel, list[int]] = {}
        for p in ready:
            by_channel.setdefault(p.channel, []).append(p.cseq)
        for ch, seqs in by_channel.items():
            ch.queue_confirmed(self.queue, seqs, [])

    def _fail(self, pending: list[_Pending]) -> None:
        by_channel: dict[PublishingChannel, list[int]] = {}
        for p in pending:
            if p.needs > 0:
                p.needs = -1  # never confirmed positively later
                by_channel.setdefault(p.channel, []).append(p.cseq)
        for ch, seqs in by_channel.items():
            ch.queue_confirmed(self.queue, [], seqs)

    # -- the rest of a message's life ---------------------------------------------------------
    def delivered(self, seq: int) -> None:
        """Recorded so that a restart marks it redelivered."""
        if self.persistent:
            self._delivered.append(seq)

    def recover(self) -> list[tuple[int, int, int, int]]:
        """Read the index back: what the queue holds, as (count, first seq, next seq,
        estimated bytes) per range of seq_ids (one for a plain queue; one per priority level
        that holds messages, `seq_id >> LEVEL_SHIFT`, for a priority queue), ascending; the
        range the index's next seq_id falls in is always there. Entries whose body is gone
        (transient messages paged before a crash: the transient store is wiped at start) are
        dropped."""
        entries = self.index.index.recover()
        dropped = [e.seq_id for e in entries
                   if e.payload is None and not self.store.contains(e.msg_id)]
        if dropped:
            self.index.ack(dropped)
            log.info("transient messages dropped at recovery", queue=self.queue.name,
                     count=len(dropped))
        gone = set(dropped)
        high = self.index.index.bounds()[1]
        top = max(high - 1, 0) >> LEVEL_SHIFT
        levels: dict[int, list[IndexEntry]] = {top: []}
        for e in entries:
            if e.seq_id not in gone:
                levels.setdefault(e.seq_id >> LEVEL_SHIFT, []).append(e)
        out = []
        for level, kept in sorted(levels.items()):
            end = kept[-1].seq_id + 1 if kept else level << LEVEL_SHIFT
            if level == top:
                end = max(end, high)  # never reuse a seq_id the index has seen
            # embedded sizes only: reading store sizes would cost a lookup per message
            size = sum(len(e.payload) for e in kept if e.payload is not None)
            out.append((len(kept), kept[0].seq_id if kept else end, end, size))
        return out

    def delete(self) -> None:
        self.index.delete()

    def close(self) -> None:
        self.end_batch()
        self.index.close()


def _settle(p: _Pending) -> bool:
    if p.needs <= 0:
        return False
    p.needs -= 1
    return p.needs == 0
