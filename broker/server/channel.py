"""The channel task (RabbitMQ's rabbit_channel): dispatch, publishing and routing, consumers
and delivery, acks, confirms and transactions. The publish and delivery hot paths stay here
together; the exchange.* and queue.* methods are in channel_methods.py, and the two tables
are plain ledgers: unacked.py (delivery tags) and confirms.py (publish seqs).

The reader posts assembled commands to the mailbox; the task takes them in batches. Publishes
of one batch are grouped per queue and handed to each queue's mailbox once. Queues call
`deliver` and `queue_confirmed` directly (plain calls, no await): the tag counter, the unacked
ledger and the confirms ledger are mutated only by this class's methods."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import structlog
from pamqp import commands

from broker.access import Pending
from broker.flow.credit_flow import CreditFlow
from broker.flow.loop_ticks import TICKS
from broker.flow.mailbox import Mailbox
from broker.message import Message
from broker.protocol import frames
from broker.protocol.channel_state import (
    ChannelAction,
    ChannelInput,
    ChannelState,
    channel_step,
)
from broker.protocol.command_assembler import ACK_INDEX
from broker.protocol.connection_state import ConnectionState
from broker.protocol.constants import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    INTERNAL_ERROR,
    NO_ROUTE,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    SYNTAX_ERROR,
)
from broker.protocol.errors import AMQPError, ChannelError, ConnectionError_
from broker.protocol.frames import DELIVER_TAG, FRAME_END_BYTE, FRAME_PUBLISH
from broker.protocol.properties import (
    MalformedProperties,
    TableTooDeep,
    check_properties,
    rewrite_properties,
)
from broker.queue.arguments import consumer_priority
from broker.queue.consumer import Consumer
from broker.routing.router import may_have_cc, routing_keys
from broker.server import channel_methods
from broker.server.confirms import Confirms
from broker.server.direct_reply import REPLY_PREFIX, REPLY_QUEUE, may_reply_to
from broker.server.unacked import Unacked

if TYPE_CHECKING:
    from broker.queue.contract import QueueType
    from broker.queue.variable_queue import Entry
    from broker.routing.exchange import Exchange
    from broker.server.reader import Reader

__all__ = ["Channel"]

log = structlog.get_logger("hare.channel")

_ACK_PREFIX = ACK_INDEX.to_bytes(4, "big")
_CLOSE_PREFIX = (0x00140000 | 40).to_bytes(4, "big")
_CLOSE_OK_PREFIX = (0x00140000 | 41).to_bytes(4, "big")
_OPEN_PREFIX = (0x00140000 | 10).to_bytes(4, "big")
# told apart by identity: typed as a tuple of any length so that mypyc keeps it one boxed
# object (a fixed-length tuple is unboxed and boxed anew at each use)
_STOP: tuple[str, ...] = ("stop",)
_OPEN = ChannelState.OPEN


class Channel:
    def __init__(self, number: int, reader: Reader) -> None:
        self.number = number
        self.reader = reader
        self.writer = reader.writer
        self.vhost = reader.vhost
        # the vhost's tables, bound once: a VHost never rebinds them, and reading them off this
        # (compiled) object costs a few instructions where the VHost's __dict__ costs a lookup
        self._exchanges = reader.vhost.exchanges
        self._queues = reader.vhost.queues
        self._default_exchange = reader.vhost.default_exchange
        self.cluster = reader.node.cluster  # metadata changes wait for it (docs/CLUSTER.md)
        self.user = reader.user
        assert reader.principal is not None
        self.principal = reader.principal
        self.auth = reader.node.auth
        self.frame_max = reader.frame_max
        self.mailbox = Mailbox()
        self.state = _OPEN  # see broker/protocol/channel_state.py
        # publishing
        self.confirm = False
        self.publish_seq = 0
        self.confirms = Confirms()
        self._confirm_flush_scheduled = False
        self._batch: dict[QueueType, list[tuple[Message, int]]] = {}
        self._mandatory: dict[Message, int] = {}  # this batch's mandatory publishes: queues
        # exchanges this channel may publish to (write permission, not internal), by name;
        # kept as the object checked so a deleted-and-redeclared exchange is checked again.
        # Dropped when the backend's permissions generation moves (checked once a batch), so
        # a narrowed permission holds from the next publish.
        self._write_ok: dict[str, Exchange] = {}
        self._topic_write: dict[str, Exchange] = {}  # of those, topic exchanges with key checks
        self._perm_gen = self.principal.backend.generation
        self.tx = False
        self._tx_publishes: list[tuple[Exchange, Message, bool]] = []
        self._tx_acks: list[tuple[str, int, bool, bool]] = []
        # consuming
        self.consumers: dict[str, Consumer] = {}
        # direct reply-to: (consumer tag, the tag as a shortstr, reply name) while consuming
        # from amq.rabbitmq.reply-to
        self.reply_consumer: tuple[str, bytes, str] | None = None
        self.unacked: Unacked[tuple[QueueType, int, Consumer | None]] = Unacked()
        self.next_tag = 1
        self.prefetch_count = 0  # applies to consumers created after basic.qos(global=false)
        self.global_prefetch = 0
        self.consumer_unacked = 0  # unacked deliveries to consumers (what global prefetch limits)
        self.flow_active = True
        # credit flow: reader -> channel (we grant), channel -> queue (we spend)
        settings = reader.settings
        self.credit_flow = CreditFlow(
            self,
            settings.credit_flow_initial_credit,
            settings.credit_flow_more_credit_after,
        )
        self.published_since_alarm = False
        self._posted: set[QueueType] = set()  # queues we sent to: told when we go
        self.published = 0
        self.confirmed = 0  # basic.ack/nack sent to a confirm-mode publisher (metrics)
        self.returned = 0  # basic.return sent (metrics)
        self.last_queue = ""  # the queue last declared here: what an empty queue name means
        self._task: asyncio.Task[None] | None = None
        self._answering = False  # the loop waits on an auth backend (_after_answer)
        self._last_publish = b""  # the last basic.publish payload, and what it decoded to
        self._last_decoded: tuple[str, str, bool, bool, bytes] = ("", "", False, False, b"")
        # the last delivery's frames before the delivery tag and around the body (deliver)
        self._head = b""
        self._head_ctag = b""
        self._head_address_size = -1
        self._middle = b""
        self._middle_props = b""
        self._middle_size = -1

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"channel:{self.reader.name}:{self.number}"
        )

    async def _run(self) -> None:
        mailbox = self.mailbox
        while True:
            batch = await mailbox.get()
            self._permissions_current()
            publishes = 0
            for cmd in batch:
                if cmd is _STOP:
                    self._flush_batch()
                    self._terminate()
                    return
                try:
                    kind = cmd[0]
                    if kind == "content":
                        publishes += 1
                        if self.state is _OPEN:
                            self._publish(cmd[1], cmd[2], cmd[3])
                    elif kind == "resume":  # publish_now met an auth backend's question
                        publishes += 1
                        await self._after_answer(cmd[1], cmd[2])
                    elif self.state is not _OPEN:
                        if kind == "method":
                            self._not_open(cmd[1])
                    elif kind == "method":
                        waiting = self._method(cmd[1])
                        if waiting is not None:  # a metadata change the cluster must take
                            await waiting
                    elif kind == "cancelled":
                        await self._after_commit()
                        self._notify_cancel(cmd[1])
                    else:  # "error": what the reader refused (a content header too large)
                        raise cmd[1]
                except Pending as pending:
                    await self._after_answer(cmd, pending)
                except _WriterBusy:
                    await self._when_writable(cmd)
                except Exception as exc:
                    self._on_error(exc)
            self._flush_batch()
            if publishes:
                self.credit_flow.ack_many(self.reader, publishes)

    def _permissions_current(self) -> None:
        """Once per batch: the backend's permissions changed, so the publish checks cached
        per exchange and topic key are forgotten."""
        generation = self.principal.backend.generation
        if generation != self._perm_gen:
            self._perm_gen = generation
            self._write_ok.clear()
            self._topic_write.clear()

    async def _after_answer(self, cmd: tuple[Any, ...], pending: Pending) -> None:
        """An auth backend must be asked over the network (the rare path): what came before
        goes out first, then the same command runs again with the answer cached, until it
        needs nothing more. Per-channel order holds: the channel's loop waits here."""
        while True:
            self._flush_batch()
            await pending.wait()
            if self.state is not _OPEN:
                return
            try:
                if cmd[0] == "content":
                    self._publish(cmd[1], cmd[2], cmd[3])
                else:
                    waiting = self._method(cmd[1])
                    if waiting is not None:
                        await waiting
                return
            except Pending as again:
                pending = again
            except Exception as exc:
                self._on_error(exc)
                return

    async def _when_writable(self, cmd: tuple[Any, ...]) -> None:
        """A basic.get while the connection's writer is backed up (a client that does not read
        its socket): the channel waits, in order, until it drains, so pipelined gets cannot
        pull a queue into the writer's buffer (deliveries wait the same way, can_take)."""
        while True:
            self._flush_batch()
            await self.writer.wait_writable()
            if self.state is not _OPEN or self.reader.state >= ConnectionState.CLOSING:
                return
            try:
                waiting = self._method(cmd[1])
                if waiting is not None:
                    await waiting
                return
            except _WriterBusy:
                continue
            except Pending as pending:
                await self._after_answer(cmd, pending)
                return
            except Exception as exc:
                self._on_error(exc)
                return

    def _on_error(self, exc: Exception) -> None:
        """A soft error closes the channel, a hard one the connection; anything else is ours:
        logged, and 541 for this channel only."""
        self._flush_batch()
        if isinstance(exc, ChannelError):
            self._fail(exc)
        elif isinstance(exc, ConnectionError_):
            self.reader.connection_error(exc)
        else:
            log.exception("channel error", channel=self.number, conn=self.reader.name,
                          exc_info=exc)
            self._fail(ChannelError(INTERNAL_ERROR, f"internal error: {exc!r}"))

    def ack_now(self, cmd: tuple[Any, ...]) -> bool:
        """A basic.ack from the reader, handled at once when nothing waits before it (the
        mailbox is empty and the loop is not waiting on an auth backend's answer), so AMQP's
        per-channel order holds: the queue refills the consumer in the same loop iteration
        instead of two task hops later. Returns False when it must go through the mailbox."""
        if self.mailbox or self._answering or self.state is not _OPEN:
            return False
        try:
            self._method(cmd[1])
        except Exception as exc:  # an ack asks no auth backend: never Pending
            self._on_error(exc)
        return True

    def put_publishes(self, batch: list[tuple[int, int, Any]], i: int) -> int:
        """The reader's fast path (Reader._frames) for the whole publish at batch[i], on this
        channel, and the ones right behind it on this channel: their payloads go to the
        mailbox quietly (the reader spends their credit and wakes us once, at the chunk's
        end). Returns the index of the first frame left. A compiled loop: for a publisher's
        run of publishes the reader's interpreted loop goes round once, not once a publish."""
        put = self.mailbox.put_quiet
        number = self.number
        n = len(batch)
        put(batch[i][2])
        i += 1
        while i < n:
            frame = batch[i]
            if frame[0] != FRAME_PUBLISH or frame[1] != number:
                break
            put(frame[2])
            i += 1
        return i

    def publish_now(self) -> None:
        """The reader's chunk brought only publishes to a channel whose task is idle (it
        waits on an empty mailbox): they are handled here, in the reader's callback, as the
        task would handle them, so they reach their queues in this loop iteration instead of
        the next, and the queues take them at once (`QueueType.publish_now`) instead of an
        iteration later.
        A publish that must wait for an auth backend's answer goes back to the task with
        everything after it, in order."""
        batch = self.mailbox.take()
        self._permissions_current()
        done = 0
        for i, cmd in enumerate(batch):
            try:
                if self.state is _OPEN:
                    self._publish(cmd[1], cmd[2], cmd[3])
            except Pending as pending:
                self._flush_batch()
                self.mailbox.put(("resume", cmd, pending))
                for rest in batch[i + 1:]:
                    self.mailbox.put_quiet(rest)
                break
            except Exception as exc:
                self._on_error(exc)
            done += 1
        # their queues take them now too (no queue is mid-turn under a socket callback): the
        # deliveries go out at the next iteration's flush, one hop from the read
        self._flush_batch(now=True)
        if done:
            self.credit_flow.ack_many(self.reader, done)

    def stop(self) -> None:
        """The connection is going: process what was received, then release everything."""
        self.mailbox.put(_STOP)

    def _terminate(self) -> None:
        self.state = ChannelState.CLOSED
        try:
            self._release()
            for q in self._posted:
                q.credit_flow.peer_down(self)
            self._posted.clear()
        finally:  # the reader waits for this before it closes the connection
            self.reader.channel_terminated(self)
        self.reader.node.events.channel_closed.notify(self)  # its counters are final

    def _release(self) -> None:
        """Requeue unacked messages and cancel consumers (channel or connection closed)."""
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        self._stop_replies()
        by_queue: dict[QueueType, list[int]] = {}
        for queue, seq, _ in self.unacked.take_all():
            by_queue.setdefault(queue, []).append(seq)
        self.consumer_unacked = 0
        for queue, seqs in by_queue.items():
            queue.requeue(seqs)
        self._tx_publishes.clear()
        self._tx_acks.clear()

    def _fail(self, exc: AMQPError) -> None:
        """A soft error: channel.close to the client, resources released at once."""
        log.info(
            "channel error",
            conn=self.reader.name,
            channel=self.number,
            code=exc.code,
            text=exc.text,
        )
        action, self.state = channel_step(self.state, ChannelInput.ERROR)
        if action is not ChannelAction.SEND_CLOSE:
            return
        self.writer.send(
            frames.encode_method(
                self.number,
                commands.Channel.Close(
                    reply_code=exc.code,
                    reply_text=exc.reply_text[:255],
                    class_id=exc.method[0],
                    method_id=exc.method[1],
                ),
            )
        )
        self._release()

    def send(self, method: Any) -> None:
        self.writer.send(frames.encode_method(self.number, method))

    # -- handover (broker/server/placement.py, handover.py) ---------------------------------
    def busy(self) -> str | None:
        """Why this channel cannot be handed to another worker now (None: it can): what it
        holds would have to move with it (consumers, unacked deliveries, a transaction, a
        direct reply-to name) or it is still working (its mailbox, confirms owed)."""
        if self.consumers or self.reply_consumer is not None or self.unacked:
            return "consuming"
        if self.tx:
            return "transaction"
        if self.state is not _OPEN or self.mailbox or not self.mailbox.idle or self._answering:
            return "channel busy"
        if self.confirms.pending or self._confirm_flush_scheduled or self._batch:
            return "unconfirmed"
        return None

    def handover_state(self) -> dict[str, Any]:
        """What a new channel of the same number on another worker needs to go on as this
        one (its counters stay here: the management's totals keep them when it ends)."""
        return {
            "number": self.number, "confirm": self.confirm, "publish_seq": self.publish_seq,
            "next_tag": self.next_tag, "prefetch_count": self.prefetch_count,
            "global_prefetch": self.global_prefetch, "flow_active": self.flow_active,
            "last_queue": self.last_queue,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """The other side of `handover_state`, before the channel's first command."""
        self.confirm = bool(state["confirm"])
        self.publish_seq = int(state["publish_seq"])
        self.next_tag = int(state["next_tag"])
        self.prefetch_count = int(state["prefetch_count"])
        self.global_prefetch = int(state["global_prefetch"])
        self.flow_active = bool(state["flow_active"])
        self.last_queue = str(state["last_queue"])

    # -- dispatch ---------------------------------------------------------------------------
    def _method(self, payload: bytes) -> Awaitable[None] | None:
        """Run a method; the handlers of metadata changes are coroutines (a cluster waits for
        etcd there): they are returned for the task to await, in the mailbox's order."""
        if payload[:4] == _ACK_PREFIX:
            tag, multiple = frames.decode_ack(payload)
            try:
                self._on_ack(tag, multiple)
            except AMQPError as exc:
                exc.method = frames.ACK_ID
                raise
            return
        if self._batch:
            # publishes before this method must reach their queues first (basic.get, purge,
            # delete, declare counts see them, as RabbitMQ's channel -> queue message order)
            self._flush_batch()
        method = frames.decode_method(payload)
        handler = _HANDLERS.get(type(method))
        if handler is None:  # a known method that is not valid here (RabbitMQ: command_invalid)
            raise ConnectionError_(
                COMMAND_INVALID,
                f"unimplemented method {method.name}",
                _ids(method),
            )
        try:
            pending = handler(self, method)
        except AMQPError as exc:
            if exc.method == (0, 0):
                exc.method = _ids(method)
            raise
        return None if pending is None else _named(pending, _ids(method))

    # -- permissions ------------------------------------------------------------------------
    def check(self, kind: str, what: str, name: str) -> None:
        """`kind` configure, write or read on the exchange or queue `name` (403 if not)."""
        self.auth.check_resource(self.principal, self.vhost.name, what, name, kind)

    def check_topic(self, exchange: str, routing_key: str, permission: str) -> None:
        """Topic authorisation: a routing key on a topic exchange."""
        ex = self.vhost.exchanges.get(exchange)
        if ex is not None and ex.type == "topic":
            self.auth.check_topic(self.principal, self.vhost.name, exchange, routing_key,
                                  permission)

    def exchange_deleted(self, name: str) -> None:
        """A publish to `name` is checked again (a redeclared exchange may be internal)."""
        self._write_ok.pop(name, None)

    # -- channel ----------------------------------------------------------------------------
    def _channel_close(self, m: commands.Channel.Close) -> None:
        _, self.state = channel_step(self.state, ChannelInput.CLOSE)  # open: ACCEPT_CLOSE
        self._release()
        # the reader forgets the number before close-ok goes out: a channel.open sent on
        # receipt of close-ok must reach a new channel, not this one (RabbitMQ's handshake
        # between rabbit_channel and rabbit_reader)
        self.reader.channel_closed(self)
        self.send(commands.Channel.CloseOk())

    def _channel_close_ok(self, m: commands.Channel.CloseOk) -> None:
        channel_step(self.state, ChannelInput.CLOSE_OK)  # refused: no close of ours to answer

    def _not_open(self, payload: bytes) -> None:
        """A method reaching a closing or closed channel: only close and close-ok count."""
        head = payload[:4]
        if head == _CLOSE_PREFIX:
            event = ChannelInput.CLOSE
        elif head == _CLOSE_OK_PREFIX:
            event = ChannelInput.CLOSE_OK
        elif head == _OPEN_PREFIX:
            event = ChannelInput.OPEN
        else:
            event = ChannelInput.COMMAND
        action, self.state = channel_step(self.state, event)
        if action is ChannelAction.ANSWER_CLOSE:
            self.send(commands.Channel.CloseOk())

    def _channel_flow(self, m: commands.Channel.Flow) -> None:
        self.flow_active = bool(m.active)
        self.send(commands.Channel.FlowOk(active=self.flow_active))
        if self.flow_active:
            self.wake_queues()

    def _channel_open(self, m: commands.Channel.Open) -> None:
        channel_step(self.state, ChannelInput.OPEN)  # refused: this number is open

    def queue_name(self, name: str) -> str:
        """The spec's shortcut (and RabbitMQ's): an empty queue name is the channel's most
        recently declared queue."""
        if name:
            return name
        if not self.last_queue:
            raise ChannelError(NOT_FOUND, "no previously declared queue")
        return self.last_queue

    async def _queue_purge(self, m: commands.Queue.Purge) -> None:
        m.queue = self.queue_name(m.queue)
        self.check("read", "queue", m.queue)
        q = self.vhost.queue(m.queue, self.reader)
        count = await q.purge()
        if not m.nowait:
            self.send(commands.Queue.PurgeOk(message_count=count))

    # -- basic: qos, consume, cancel, get ---------------------------------------------------
    def _basic_qos(self, m: commands.Basic.Qos) -> None:
        if m.prefetch_size:
            raise ConnectionError_(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            self.global_prefetch = m.prefetch_count
        else:
            self.prefetch_count = m.prefetch_count
        self.send(commands.Basic.QosOk())
        self.wake_queues()

    async def _basic_consume(self, m: commands.Basic.Consume) -> None:
        limit = self.reader.settings.consumer_max_per_channel
        if limit and len(self.consumers) >= limit and m.consumer_tag not in self.consumers:
            # RabbitMQ's consumer_max_per_channel (3.12+): checked first, a hard error
            raise ConnectionError_(
                NOT_ALLOWED, f"reached maximum ({limit}) of consumers per channel"
            )
        m.queue = self.queue_name(m.queue)
        if m.queue == REPLY_QUEUE:
            self._consume_replies(m)
            return
        self.check("read", "queue", m.queue)
        q = self.vhost.queue(m.queue, self.reader)
        q.touch()  # x-expires restarts; a cluster's queue on a down node answers 404 here
        tag = m.consumer_tag or _server_tag()
        if tag in self.consumers:
            raise ConnectionError_(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        # the queue type's own rules (a stream's: prefetch, manual acks, x-stream-offset)
        q.check_consume(no_ack=m.no_ack, prefetch=self.prefetch_count,
                        global_prefetch=self.global_prefetch, arguments=m.arguments)
        priority = consumer_priority(m.arguments, q.name, self.vhost.name)
        consumer = Consumer(
            tag,
            self,
            q,
            no_ack=m.no_ack,
            exclusive=m.exclusive,
            prefetch=self.prefetch_count,
            arguments=m.arguments,
            priority=priority,
        )
        # exclusive use is the queue's home's to judge: a queue on another node answers over
        # the link (the channel waits, in order), a local one at once
        await q.admit_consumer(consumer)
        self.consumers[tag] = consumer
        if not m.nowait:
            self.send(commands.Basic.ConsumeOk(consumer_tag=tag))
        q.add_consumer(consumer)

    def _consume_replies(self, m: commands.Basic.Consume) -> None:
        """basic.consume from amq.rabbitmq.reply-to: no queue, just a reply name."""
        if not m.no_ack:
            raise ChannelError(PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        if self.reply_consumer is not None:
            raise ChannelError(PRECONDITION_FAILED, "reply consumer already set")
        tag = m.consumer_tag or _server_tag()
        if tag in self.consumers:
            raise ConnectionError_(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        name = self.reader.node.reply_registry.register(self)
        self.reply_consumer = (tag, frames.shortstr(tag), name)
        if not m.nowait:
            self.send(commands.Basic.ConsumeOk(consumer_tag=tag))

    def _stop_replies(self) -> None:
        if self.reply_consumer is not None:
            self.reader.node.reply_registry.unregister(self.reply_consumer[2])
            self.reply_consumer = None

    def deliver_reply(self, msg: Message) -> None:
        """A reply published to our reply name (by any channel): a delivery, no ack."""
        rc = self.reply_consumer
        if rc is None or self.state is not _OPEN:
            return
        tag = self.next_tag
        self.next_tag = tag + 1
        self.writer.send_many(
            frames.encode_deliver(
                self.number, rc[1], tag, False, msg.address, msg.props, msg.body, self.frame_max
            )
        )

    def _basic_cancel(self, m: commands.Basic.Cancel) -> Awaitable[None] | None:
        if self.reply_consumer is not None and m.consumer_tag == self.reply_consumer[0]:
            self._stop_replies()
        consumer = self.consumers.pop(m.consumer_tag, None)
        removed = None if consumer is None else consumer.queue.remove_consumer(consumer)
        if removed is not None:  # its home is elsewhere: cancel-ok once it is off there
            return self._cancel_ok_after(removed, m)
        if not m.nowait:
            self.send(commands.Basic.CancelOk(consumer_tag=m.consumer_tag))
        return None

    async def _cancel_ok_after(self, removed: Awaitable[None], m: commands.Basic.Cancel) -> None:
        await removed
        if not m.nowait:
            self.send(commands.Basic.CancelOk(consumer_tag=m.consumer_tag))

    def consumer_cancelled_by_queue(self, consumer: Consumer) -> None:
        """The queue went away (its consumers are already off it): tell the client through
        our mailbox, as the queue process messages RabbitMQ's channel. So the basic.cancel
        follows whatever the channel is answering now: a queue.delete on this channel gets
        its delete-ok first, as from RabbitMQ."""
        self.mailbox.put(("cancelled", consumer))

    async def _after_commit(self) -> None:
        """A queue deleted by a channel of ours is gone for the cluster when that channel
        answers delete-ok (it waits for the commit); our basic.cancel for its consumers
        waits for the same commit, so it comes after the delete-ok, as from RabbitMQ."""
        with contextlib.suppress(ChannelError):  # etcd unreachable: it goes anyway
            await self.cluster.commit()

    def _notify_cancel(self, consumer: Consumer) -> None:
        if self.consumers.get(consumer.tag) is not consumer:
            return  # the client cancelled it meanwhile
        del self.consumers[consumer.tag]
        if self.reader.client_capability("consumer_cancel_notify"):
            self.send(commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True))

    async def _basic_get(self, m: commands.Basic.Get) -> None:
        m.queue = self.queue_name(m.queue)
        self.check("read", "queue", m.queue)
        q = self.vhost.queue(m.queue, self.reader)
        if not self.writer.writable:
            raise _WriterBusy
        got = await q.get(not m.no_ack)
        if got is None:
            self.send(commands.Basic.GetEmpty())
            return
        (seq, msg, redelivered, _), remaining = got
        tag = self.next_tag
        self.next_tag = tag + 1
        if not m.no_ack:
            self.unacked[tag] = (q, seq, None)
        self.writer.note_queued(len(msg.body) + 64)
        self.writer.send_many(
            frames.encode_get_ok(
                self.number,
                tag,
                redelivered,
                msg.exchange,
                msg.routing_key,
                remaining,
                msg.props,
                msg.body,
                self.frame_max,
            )
        )

    # -- delivery (called by queues; Consumer.can_take says whether one may come) ----------
    def deliver(self, consumer: Consumer, queue: QueueType, entry: Entry) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        msg = entry[1]
        if not consumer.no_ack:
            self.unacked[tag] = (queue, entry[0], consumer)
            consumer.unacked += 1
            self.consumer_unacked += 1
            tick = TICKS.now  # the queue read the clock (so it runs) before delivering
            if consumer.tick != tick:
                consumer.tick = tick
                consumer.tick_tag = tag
        body = msg.body
        size = len(body)
        if not 0 < size <= self.frame_max - 8:  # no body, or several body frames
            self.writer.send_delivery(
                frames.encode_deliver(self.number, consumer.tag_sstr, tag, entry[2],
                                      msg.address, msg.props, body, self.frame_max),
                size,
            )
            return
        # what encode_deliver packs, less what the last delivery packed the same: a consumer's
        # tag and a publisher's exchange, key, properties (one object: the reader's cutter
        # shares it) and body size repeat, so only the delivery tag is packed per delivery
        address = msg.address
        ctag = consumer.tag_sstr
        if ctag is not self._head_ctag or len(address) != self._head_address_size:
            self._head = frames.deliver_head(self.number, ctag, len(address))
            self._head_ctag = ctag
            self._head_address_size = len(address)
        props = msg.props
        if props is not self._middle_props or size != self._middle_size:
            self._middle = frames.deliver_middle(self.number, props, size)
            self._middle_props = props
            self._middle_size = size
        self.writer.send_delivery(
            [self._head, DELIVER_TAG.pack(tag, 1 if entry[2] else 0), address, self._middle,
             body, FRAME_END_BYTE],
            size,
        )

    def wake_queues(self) -> None:
        for q in {c.queue for c in self.consumers.values()}:
            q.wake()

    # -- acks from the client ---------------------------------------------------------------
    def _settle(self, records: list[tuple[QueueType, int, Any]], action: str,
                requeue: bool) -> None:
        by_queue: dict[QueueType, list[int]] = {}
        freed = 0
        for queue, seq, consumer in records:
            if consumer is not None:
                consumer.unacked -= 1
                freed += 1
            lst = by_queue.get(queue)
            if lst is None:
                by_queue[queue] = [seq]
            else:
                lst.append(seq)
        self.consumer_unacked -= freed
        for queue, seqs in by_queue.items():
            if queue.deleted:
                continue
            if action == "ack":
                queue.ack(seqs)
            else:
                queue.reject(seqs, requeue)
        if freed and self.global_prefetch:
            self.wake_queues()

    def _on_ack(self, tag: int, multiple: bool) -> None:
        if self.tx:
            self.unacked.check(tag, multiple)
            self._tx_acks.append(("ack", tag, multiple, False))
            return
        records = self.unacked.take(tag, multiple)
        if not records:  # multiple with tag 0 and nothing outstanding: RabbitMQ says nothing
            return
        queue, _, consumer = records[-1]
        if consumer is not None and consumer.waiting_on_us(tag or self.next_tag, TICKS.read()):
            queue.consumer_waiting()
        self._settle(records, "ack", False)

    def _basic_ack(self, m: commands.Basic.Ack) -> None:
        self._on_ack(m.delivery_tag, m.multiple)

    def _basic_nack(self, m: commands.Basic.Nack) -> None:
        if self.tx:
            self.unacked.check(m.delivery_tag, m.multiple)
            self._tx_acks.append(("reject", m.delivery_tag, m.multiple, m.requeue))
            return
        self._settle(self.unacked.take(m.delivery_tag, m.multiple), "reject", m.requeue)

    def _basic_reject(self, m: commands.Basic.Reject) -> None:
        if self.tx:
            self.unacked.check(m.delivery_tag, False)
            self._tx_acks.append(("reject", m.delivery_tag, False, m.requeue))
            return
        self._settle(self.unacked.take(m.delivery_tag, False), "reject", m.requeue)

    def _basic_recover(self, m: commands.Basic.Recover) -> None:
        self._recover(m)
        self.send(commands.Basic.RecoverOk())

    def _basic_recover_async(self, m: commands.Basic.RecoverAsync) -> None:
        self._recover(m)

    def _recover(self, m: commands.Basic.Recover | commands.Basic.RecoverAsync) -> None:
        if not m.requeue:  # RabbitMQ: redelivery to the same consumer is not implemented
            raise ConnectionError_(NOT_IMPLEMENTED, "requeue=false")
        self._settle(self.unacked.take_all(), "reject", True)

    # -- publishing -------------------------------------------------------------------------
    def _publish(self, method: bytes, props: bytes, body: bytes) -> None:
        # a publisher repeats one exchange, key and flags: decode a method payload once
        if method == self._last_publish:
            exchange, routing_key, mandatory, immediate, address = self._last_decoded
        else:
            decoded = frames.decode_publish(method)
            exchange, routing_key, mandatory, immediate, address = decoded
            self._last_publish, self._last_decoded = method, decoded
        if immediate:
            raise ConnectionError_(NOT_IMPLEMENTED, "immediate=true", (60, 40))
        ex = self._exchanges.get(exchange)
        if ex is None or self._write_ok.get(exchange) is not ex:
            try:
                self.check("write", "exchange", exchange)
                ex = self.vhost.exchange(exchange)
            except AMQPError as exc:
                exc.method = (60, 40)
                raise
            if ex.internal:
                raise ChannelError(
                    ACCESS_REFUSED,
                    f"cannot publish to internal exchange '{exchange}' in vhost "
                    f"'{self.vhost.name}'",
                    (60, 40),
                )
            self._write_ok[exchange] = ex
            self._topic_write.pop(exchange, None)
            if ex.type == "topic" and self.auth.topic_checked(self.principal, self.vhost.name,
                                                              exchange):
                self._topic_write[exchange] = ex
        # the raw flags first: a block with more than a delivery mode and a priority must
        # decode (checked once, here); expiration, reply_to, user_id are then looked at
        flagged = len(props) >= 2 and (props[0] & 0xE7 or props[1])
        if flagged:
            _check_block(props)
        msg = Message(exchange, routing_key, props, body, 0, address)
        if self._topic_write and exchange in self._topic_write:
            self._check_topic_keys(msg)
        if flagged and (props[0] & 0x03 or props[1] & 0x10):
            msg = self._check_properties(msg)
        self.published += 1
        seq = 0
        if self.confirm:
            self.publish_seq += 1
            seq = self.publish_seq
        if self.tx:  # held until commit: the raw block only, as a queue keeps it
            msg.decoded = None
            self._tx_publishes.append((ex, msg, mandatory))
            return
        self._route(ex, msg, mandatory, seq)
        # queues keep the raw block only: whatever decoded it here (the checks above, the
        # headers exchange, CC) is done with it, and a 128 KiB table decodes to MiB
        msg.decoded = None

    def _check_topic_keys(self, msg: Message) -> None:
        """Write on every routing key the message will be routed by: its own and, as
        RabbitMQ 4.0.3+ does, those in its CC and BCC headers."""
        try:
            for key in routing_keys(msg):
                self.auth.check_topic(self.principal, self.vhost.name, msg.exchange, key,
                                      "write")
        except AMQPError as exc:
            exc.method = (60, 40)
            raise

    def _check_properties(self, msg: Message) -> Message:
        """RabbitMQ's check_user_id_header and check_expiration_header (406 on publish), and
        the direct reply-to rewrite of reply_to. Returns the message to route."""
        if may_reply_to(msg.props):
            msg = self._set_reply_to(msg)
        raw = msg.props
        if not (raw[0] & 0x01 or raw[1] & 0x10):
            return msg
        props = msg.properties
        user_id = props.user_id
        if (user_id is not None and user_id != self.user
                and "impersonator" not in self.principal.tags):
            raise ChannelError(
                PRECONDITION_FAILED,
                f"user_id property set to '{user_id}' but authenticated user was "
                f"'{self.user}'",
                (60, 40),
            )
        expiration = props.expiration
        if expiration is not None:
            text = expiration
            sign = text[:1] in ("-", "+")
            digits = len(text) - len(text[sign:].lstrip("0123456789")) if text else 0
            if digits <= int(sign):
                error = "no_integer"
            elif digits < len(text):
                error = f'{{leftover_string,"{text[digits:]}"}}'
            elif int(text) < 0:
                error = f"{{value_negative,{int(text)}}}"
            else:
                error = ""
            if error:
                raise ChannelError(
                    PRECONDITION_FAILED, f"invalid expiration '{expiration}': {error}", (60, 40)
                )
        return msg

    def _set_reply_to(self, msg: Message) -> Message:
        """reply_to = amq.rabbitmq.reply-to becomes this channel's reply name."""
        if msg.properties.reply_to != REPLY_QUEUE:
            return msg
        if self.reply_consumer is None:
            raise ChannelError(PRECONDITION_FAILED, "fast reply consumer does not exist",
                               (60, 40))
        return msg.with_props(
            rewrite_properties(msg.props, replace={"reply_to": self.reply_consumer[2]})
        )

    def _route(self, ex: Exchange, msg: Message, mandatory: bool, seq: int) -> None:
        cc = may_have_cc(msg.props)
        if ex is self._default_exchange and not cc:
            # the default exchange to an existing queue, the commonest publish: one lookup
            # into the batch, none of VHost.route's generality
            q = self._queues.get(msg.routing_key)
            if q is not None:
                items = self._batch.get(q)
                if items is None:
                    self._batch[q] = [(msg, seq)]
                else:
                    items.append((msg, seq))
                if seq:
                    self.confirms.pending[seq] = 1
                if mandatory:  # returned if the queue turns out unavailable
                    self._mandatory[msg] = 1
                return
            queues: Any = ()
        else:
            queues = self.vhost.route(ex, msg)
        if not queues:
            if msg.routing_key.startswith(REPLY_PREFIX) and ex is self._default_exchange:
                # a direct reply: handed to its channel, and still unroutable for the
                # publisher (mandatory returns it too), as RabbitMQ documents
                target = self.reader.node.reply_registry.lookup(msg.routing_key)
                if target is not None:
                    target.deliver_reply(msg)
                else:  # another node's (worker's) name: forwarded over the link
                    self.cluster.forward_reply(msg)
            if mandatory:
                self.returned += 1
                self.writer.send_many(
                    frames.encode_return(
                        self.number,
                        NO_ROUTE,
                        "NO_ROUTE",
                        msg.exchange,
                        msg.routing_key,
                        msg.props,
                        msg.body,
                        self.frame_max,
                    )
                )
            if seq:
                self.confirms.settled(seq, mandatory or not self.reader.unroutable_nack)
                self._schedule_confirms()
            return
        # raw-bytes test first: decoding every message's headers to look for BCC is not free
        if cc and "BCC" in msg.headers:
            msg = msg.with_props(rewrite_properties(msg.props, drop_headers=("BCC",)))
        batch = self._batch
        n = 0
        for q in queues:
            items = batch.get(q)
            if items is None:
                batch[q] = [(msg, seq)]
            else:
                items.append((msg, seq))
            n += 1
        if seq:
            self.confirms.pending[seq] = n
        if mandatory:  # returned if every queue it routed to turns out unavailable
            self._mandatory[msg] = n

    def _flush_batch(self, now: bool = False) -> None:
        batch = self._batch
        if batch:
            posted = self._posted
            send_many = self.credit_flow.send_many
            for q, items in batch.items():
                send_many(q, len(items))
                if now:
                    q.publish_now(self, items)
                else:
                    q.post_publishes(self, items)
                posted.add(q)
            batch.clear()
        if self._mandatory:
            self._mandatory.clear()

    def publishes_lost(self, queue: Any, items: list[tuple[Message, int]]) -> None:
        """A queue could not take messages routed to it (in a cluster: its home node is
        down), told while this batch is handed over, so before any queue confirmed it. A
        message no live queue took is returned when mandatory and nacked in confirm mode;
        one that reached another queue is confirmed by that one alone."""
        self.credit_flow.peer_down(queue)  # spent on a queue that will never grant it
        for msg, seq in items:
            left = self._mandatory.get(msg)
            if left is not None:
                self._mandatory[msg] = left - 1
                if left == 1:
                    self.returned += 1
                    self.writer.send_many(frames.encode_return(
                        self.number, NO_ROUTE, "NO_ROUTE", msg.exchange, msg.routing_key,
                        msg.props, msg.body, self.frame_max))
            if seq:
                self.confirms.lost(seq)
        self._schedule_confirms()

    # -- confirms ---------------------------------------------------------------------------
    def _confirm_select(self, m: commands.Confirm.Select) -> None:
        if self.tx:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirm = True
        if not m.nowait:
            self.send(commands.Confirm.SelectOk())

    def queue_confirmed(self, queue: QueueType, seqs: list[int], rejected: list[int]) -> None:
        if self.state is not _OPEN or not self.confirm:
            return
        self.confirms.confirm(seqs)
        if rejected:
            self.confirms.reject(rejected)
        self._schedule_confirms()

    def _schedule_confirms(self) -> None:
        if not self._confirm_flush_scheduled:
            self._confirm_flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_confirms)

    def _flush_confirms(self) -> None:
        self._confirm_flush_scheduled = False
        if self.state is not _OPEN:
            return
        nacks, acks = self.confirms.take()
        ch = self.number
        out = [frames.encode_basic_nack(ch, seq, False) for seq in nacks]
        out += [frames.encode_basic_ack(ch, seq, multiple) for seq, multiple in acks]
        if out:
            self.confirmed += len(out)
            self.writer.send_many(out)

    # -- transactions -----------------------------------------------------------------------
    def _tx_select(self, m: commands.Tx.Select) -> None:
        if self.confirm:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        self.tx = True
        self.send(commands.Tx.SelectOk())

    def _tx_commit(self, m: commands.Tx.Commit) -> None:
        if not self.tx:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional")
        publishes, self._tx_publishes = self._tx_publishes, []
        for ex, msg, mandatory in publishes:
            self._route(ex, msg, mandatory, 0)
            msg.decoded = None  # queues keep the raw block only
        acks, self._tx_acks = self._tx_acks, []
        for action, tag, multiple, requeue in acks:
            if multiple or tag in self.unacked:
                self._settle(self.unacked.take(tag, multiple), action, requeue)
        self._flush_batch()
        self.send(commands.Tx.CommitOk())

    def _tx_rollback(self, m: commands.Tx.Rollback) -> None:
        if not self.tx:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional")
        self._tx_publishes.clear()
        self._tx_acks.clear()
        self.send(commands.Tx.RollbackOk())

    # -- introspection ----------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "connection": self.reader.name,
            "user": self.user,
            "vhost": self.vhost.name,
            "confirm": self.confirm,
            "transactional": self.tx,
            "consumer_count": len(self.consumers),
            "messages_unacknowledged": len(self.unacked),
            "messages_unconfirmed": len(self.confirms),
            "prefetch_count": self.prefetch_count,
            "global_prefetch_count": self.global_prefetch,
        }


def _server_tag() -> str:
    """A consumer tag for a basic.consume that left it empty (RabbitMQ's amq.ctag-...)."""
    return "amq.ctag-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


async def _named(pending: Awaitable[None], ids: tuple[int, int]) -> None:
    """Await a handler; an AMQP error it raises names its method, as _method does."""
    try:
        await pending
    except AMQPError as exc:
        if exc.method == (0, 0):
            exc.method = ids
        raise


class _WriterBusy(Exception):
    """A basic.get must wait for the connection's writer to drain (Channel._when_writable)."""


def _check_block(props: bytes) -> None:
    """A publish's property block must decode, its tables nested at most MAX_TABLE_DEPTH deep:
    every later path (dead-lettering, headers exchange, management) can then read it."""
    try:
        check_properties(props)
    except TableTooDeep as exc:
        raise ChannelError(PRECONDITION_FAILED, f"headers table refused: {exc}", (60, 40)) from exc
    except MalformedProperties as exc:
        raise ConnectionError_(
            SYNTAX_ERROR, f"malformed content header properties: {exc}", (60, 40)
        ) from exc


def _ids(method: Any) -> tuple[int, int]:
    index = method.index
    return index >> 16, index & 0xFFFF


_HANDLERS: dict[type, Any] = {
    commands.Channel.Close: Channel._channel_close,
    commands.Channel.CloseOk: Channel._channel_close_ok,
    commands.Channel.Flow: Channel._channel_flow,
    commands.Channel.Open: Channel._channel_open,
    commands.Exchange.Declare: channel_methods.exchange_declare,
    commands.Exchange.Delete: channel_methods.exchange_delete,
    commands.Exchange.Bind: channel_methods.exchange_bind,
    commands.Exchange.Unbind: channel_methods.exchange_unbind,
    commands.Queue.Declare: channel_methods.queue_declare,
    commands.Queue.Bind: channel_methods.queue_bind,
    commands.Queue.Unbind: channel_methods.queue_unbind,
    commands.Queue.Purge: Channel._queue_purge,
    commands.Queue.Delete: channel_methods.queue_delete,
    commands.Basic.Qos: Channel._basic_qos,
    commands.Basic.Consume: Channel._basic_consume,
    commands.Basic.Cancel: Channel._basic_cancel,
    commands.Basic.Get: Channel._basic_get,
    commands.Basic.Ack: Channel._basic_ack,
    commands.Basic.Nack: Channel._basic_nack,
    commands.Basic.Reject: Channel._basic_reject,
    commands.Basic.Recover: Channel._basic_recover,
    commands.Basic.RecoverAsync: Channel._basic_recover_async,
    commands.Confirm.Select: Channel._confirm_select,
    commands.Tx.Select: Channel._tx_select,
    commands.Tx.Commit: Channel._tx_commit,
    commands.Tx.Rollback: Channel._tx_rollback,
}
