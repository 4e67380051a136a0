"""The durable half of a durable queue: its queue index and its share of the persistent
message store, and the publisher confirms that wait on them.

A persistent message is recorded in the index (embedded there when small) and, when large,
written to the store. Its confirm goes out once every part is safe under the fsync policy:
index records are flushed to the OS after each queue batch and fsynced in a worker thread
(one fsync covers every batch that arrived meanwhile: group commit); the store reports its own
fsyncs through `msgs_durable`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

import structlog

from broker.message import Message

if TYPE_CHECKING:
    from broker.queue.amqqueue import AMQQueue
    from broker.server.channel import Channel
    from broker.store.msg_store import MsgStore
    from broker.store.queue_index import IndexEntry, QueueIndex

__all__ = ["QueueDurability"]

log = structlog.get_logger("hare.queue")


class _Pending:
    """A confirm waiting for `needs` more parts (index fsync, store fsync) to be durable."""

    __slots__ = ("channel", "cseq", "needs")

    def __init__(self, channel: Channel, cseq: int, needs: int) -> None:
        self.channel = channel
        self.cseq = cseq
        self.needs = needs


class QueueDurability:
    def __init__(
        self, queue: AMQQueue, index: QueueIndex, store: MsgStore, fsync: str = "batch"
    ) -> None:
        self.queue = queue
        self.index = index
        self.store = store
        self.fsync = fsync
        self.in_store: set[int] = set()  # msg ids this queue holds a store reference for
        self._by_msg: dict[int, _Pending] = {}
        self._batch: list[_Pending] = []
        self._sync_waiting: list[list[_Pending]] = []
        self._syncing = False
        self._delivered: list[int] = []

    # -- publish ----------------------------------------------------------------------------
    def persist(self, seq: int, msg: Message, channel: Channel | None, cseq: int) -> None:
        data = msg.encode()
        needs = 1  # the index record
        if self.index.should_embed(len(data)):
            self.index.publish(seq, msg.msg_id, data)
        else:
            self.store.write(msg.msg_id, data, self)
            self.in_store.add(msg.msg_id)
            self.index.publish(seq, msg.msg_id, None)
            needs = 2
        if cseq and channel is not None:
            p = _Pending(channel, cseq, needs)
            if needs == 2:
                self._by_msg[msg.msg_id] = p
            self._batch.append(p)

    def end_batch(self) -> None:
        """After a queue batch: index records to the OS, then a (grouped) fsync."""
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

    # -- StoreClient ------------------------------------------------------------------------
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
        failed = [p for p in (self._by_msg.pop(m, None) for m in msg_ids) if p is not None]
        self._fail(failed)

    def _confirm(self, ready: list[_Pending]) -> None:
        by_channel: dict[Channel, list[int]] = {}
        for p in ready:
            by_channel.setdefault(p.channel, []).append(p.cseq)
        for ch, seqs in by_channel.items():
            ch.queue_confirmed(self.queue, seqs, [])

    def _fail(self, pending: list[_Pending]) -> None:
        by_channel: dict[Channel, list[int]] = {}
        for p in pending:
            if p.needs > 0:
                p.needs = -1  # never confirm it positively later
                by_channel.setdefault(p.channel, []).append(p.cseq)
        for ch, seqs in by_channel.items():
            ch.queue_confirmed(self.queue, [], seqs)

    # -- the rest of a message's life ---------------------------------------------------------
    def delivered(self, seq: int) -> None:
        self._delivered.append(seq)

    def gone(self, seqs: list[int], msgs: Iterable[Message]) -> None:
        """Messages left the queue for good (acked, dropped, expired, purged)."""
        self.index.ack(seqs)
        in_store = self.in_store
        if in_store:
            for m in msgs:
                if m.msg_id in in_store:
                    in_store.discard(m.msg_id)
                    self.store.remove(m.msg_id)

    def recover(self) -> list[tuple[IndexEntry, Message]]:
        """The queue's messages after a restart, in order; unreadable ones are skipped."""
        out = []
        for entry in self.index.recover():
            try:
                if entry.payload is not None:
                    msg = Message.decode(entry.payload, entry.msg_id)
                else:
                    msg = Message.decode(self.store.read(entry.msg_id), entry.msg_id)
                    self.in_store.add(entry.msg_id)
            except (KeyError, ValueError, UnicodeDecodeError) as exc:
                log.error("message lost in recovery", queue=self.queue.name,
                          seq=entry.seq_id, error=repr(exc))
                self.index.ack([entry.seq_id])
                continue
            out.append((entry, msg))
        return out

    def delete(self) -> None:
        for msg_id in self.in_store:
            self.store.remove(msg_id)
        self.in_store.clear()
        self.index.delete()

    def close(self) -> None:
        self.end_batch()
        self.index.close()


def _settle(p: _Pending) -> bool:
    if p.needs <= 0:
        return False
    p.needs -= 1
    return p.needs == 0
