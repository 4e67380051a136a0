"""A stream queue (`x-queue-type: stream`, RabbitMQ's rabbit_stream_queue over AMQP 0-9-1): an
append-only log (broker/store/stream_log.py) that any number of consumers read, each from its
own offset, without taking anything away.

No task of its own: a publish batch is appended at once (StreamLog.append never awaits) and
one chunk per batch is written by the log's flusher. Publishers get their credit back at once
while the log keeps up, and only as their chunks are committed once more than
UNWRITTEN_BYTES wait to be written (so they slow to the disk's pace and the RAM held for them
stays bounded). When chunks are committed (durable), the log calls back: confirms go to the
publishing channels, and consumers are served. A consumer is a StreamReader at its position;
its prefetch is its credit, and an ack only gives credit back (RabbitMQ's streams: settle =
credit). Every delivery carries its offset in the `x-stream-offset` header, stamped on the
message once, when it is appended."""

from __future__ import annotations

import asyncio
import datetime
import struct
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog

from broker.flow.credit_flow import DEFAULT_CREDIT, CreditFlow
from broker.message import Message
from broker.protocol.constants import NOT_IMPLEMENTED, PRECONDITION_FAILED
from broker.protocol.errors import ChannelError, ConnectionError_
from broker.protocol.properties import append_header
from broker.queue.arguments import QueueArgs, amqp_type
from broker.queue.consumer import check_exclusive_use
from broker.queue.policy_args import AppliedPolicies, effective_arguments
from broker.store.stream_log import DEFAULT_SEGMENT_BYTES
from broker.store.stream_reader import StreamReader, start_offset

if TYPE_CHECKING:
    from broker.queue.consumer import Consumer
    from broker.queue.contract import PublishingChannel
    from broker.store.stream_log import StreamLog
    from broker.vhost import VHost

__all__ = ["StreamQueue", "check_stream_consume", "max_age_ms", "not_supported",
           "stream_offset"]

log = structlog.get_logger("hare.queue")

DELIVERY_BATCH = 1000  # deliveries per consumer per pass before yielding to the loop
# Bodies appended and not yet written above which publishers get their credit back only as
# their chunks are committed: they slow to the disk's pace, and the RAM a stream holds for
# them stays bounded (credit flow, docs/FLOW.md).
UNWRITTEN_BYTES = 16 << 20
_OFFSET_HEADER = b"x-stream-offset"
_LONG = struct.Struct(">q")
# x-max-age units, as RabbitMQ's rabbit_amqqueue:check_max_age
_UNIT_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000,
            "m": 60_000, "s": 1000}


def max_age_ms(value: str) -> int | None:
    """An x-max-age value ("7D", "12h", ...) in milliseconds; None if it is not one."""
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or unit not in _UNIT_MS or int(digits) == 0:
        return None
    return int(digits) * _UNIT_MS[unit]


def stream_offset(arguments: dict[str, Any] | None, queue: str, vhost: str) -> object:
    """basic.consume's x-stream-offset, checked: "first", "last", "next" (the default), an
    offset, a datetime, or seconds back from now (an interval as x-max-age writes it: "1h").
    RabbitMQ 3.10.8 closes the connection with 541 INTERNAL_ERROR for anything else (a crash);
    Hare says what is wrong, 406 on the channel."""
    value = (arguments or {}).get("x-stream-offset")
    if value is None:
        return "next"
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return value
        ms = max_age_ms(value)
        if ms is not None:
            return ms / 1000.0
    elif isinstance(value, datetime.datetime) or (
            isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ChannelError(
        PRECONDITION_FAILED,
        f"invalid arg 'x-stream-offset' for queue '{queue}' in vhost '{vhost}': "
        f"{{invalid_offset_arg,{amqp_type(value)}}} (first, last, next, an offset, a "
        "timestamp or an interval such as 1h)")


def check_stream_consume(queue: str, vhost: str, *, no_ack: bool, prefetch: int,
                         global_prefetch: int, arguments: dict[str, Any] | None) -> None:
    """What RabbitMQ 3.10.8 refuses at basic.consume on a stream, in its order, before
    consume-ok goes out (on the consumer's node, whichever node the stream lives on)."""
    where = f"queue '{queue}' in vhost '{vhost}'"
    if arguments and "x-priority" in arguments:
        raise ChannelError(
            PRECONDITION_FAILED,
            f"invalid arg 'x-priority' for {where} of queue type rabbit_stream_queue")
    if not prefetch:
        raise ChannelError(PRECONDITION_FAILED,
                           f"consumer prefetch count is not set for '{where}'")
    if no_ack:
        raise ConnectionError_(
            NOT_IMPLEMENTED, f"automatic acknowledgement not supported by stream queues {where}")
    if global_prefetch:
        raise ConnectionError_(NOT_IMPLEMENTED, f"{where} does not support global qos")
    stream_offset(arguments, queue, vhost)


def not_supported(what: str, queue: str, vhost: str) -> ConnectionError_:
    """RabbitMQ's answer to what a stream does not do (basic.get, purge, nack, reject)."""
    return ConnectionError_(NOT_IMPLEMENTED, f"{what} not supported by stream queues queue "
                            f"'{queue}' in vhost '{vhost}'")


def _credit(vhost: VHost) -> tuple[int, int]:
    node = vhost.node
    if node is None:
        return DEFAULT_CREDIT
    s = node.settings
    return s.credit_flow_initial_credit, s.credit_flow_more_credit_after


class StreamQueue:
    def __init__(
        self,
        vhost: VHost,
        name: str,
        *,
        durable: bool = True,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.home = vhost.node.name if vhost.node is not None else ""
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments: dict[str, Any] = dict(arguments or {})
        self.args = QueueArgs(self.arguments)
        self.log: StreamLog | None = None  # set by Durable.attach_stream before start()
        self.consumers: deque[Consumer] = deque()
        self._readers: dict[Consumer, StreamReader] = {}
        self.deleted = False
        self.credit_flow = CreditFlow(self, *_credit(vhost))
        self.store_peers: tuple[Any, ...] = ()
        # publishes appended, not yet committed: (offset after them, channel, count, seqs)
        self._unconfirmed: deque[tuple[int, PublishingChannel | None, int, list[int]]] = deque()
        self._senders: set[PublishingChannel] = set()
        self._deliver_scheduled = False
        self.published = 0
        self.delivered = 0
        self.acked = 0
        self.redelivered = 0

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        assert self.log is not None, "a stream needs its log (Durable.attach_stream)"
        self.log.on_commit = self._committed
        self.log.on_failed = self._write_failed
        self._apply_limits()

    def _apply_limits(self) -> None:
        """Retention and segment size from the arguments and the policies: of an argument
        and a policy key, the smaller wins (rabbit_stream_queue's make_stream_conf)."""
        assert self.log is not None
        policy = self.args.applied.effective
        ages = [max_age_ms(v) for v in (self.arguments.get("x-max-age"),
                                        policy.get("max-age")) if isinstance(v, str)]
        segments = [v for v in (self.arguments.get("x-stream-max-segment-size-bytes"),
                                policy.get("stream-max-segment-size-bytes"))
                    if isinstance(v, int) and v > 0]
        self.log.set_limits(
            self.args.max_length_bytes,  # already the smaller of argument and policy
            min((a for a in ages if a), default=None),
            min(segments, default=DEFAULT_SEGMENT_BYTES))

    def set_policies(self, applied: AppliedPolicies) -> None:
        self.args = QueueArgs(effective_arguments(self.arguments, applied.effective), applied)
        if self.log is not None and not self.deleted:
            self._apply_limits()

    def stop(self) -> None:
        """The stream is deleted: its log goes with it, and publishes it had not committed
        are confirmed (the queue is gone, as RabbitMQ confirms to a deleted queue)."""
        unconfirmed = list(self._unconfirmed)
        self.shutdown()
        by_channel: dict[PublishingChannel, list[int]] = {}
        for _, ch, _, seqs in unconfirmed:
            if ch is not None and seqs:
                by_channel.setdefault(ch, []).extend(seqs)
        for ch, seqs in by_channel.items():
            ch.queue_confirmed(self, seqs, [])
        if self.log is not None:
            self.log.delete()

    def shutdown(self) -> None:
        """The broker stops (or the stream is deleted): no more deliveries; what was appended
        is still written by the log's close (Durable.stop)."""
        if self.deleted:
            return
        self.deleted = True
        for consumer in list(self._readers):
            self._readers.pop(consumer).close()
        self._unconfirmed.clear()
        for ch in self._senders:
            ch.credit_flow.peer_down(self)
        self._senders.clear()

    def close(self) -> None:
        """Clean broker shutdown: Durable.stop awaits the log's close."""

    # -- publishing -------------------------------------------------------------------------
    def post_publishes(self, channel: PublishingChannel | None,
                       items: list[tuple[Message, int]]) -> None:
        """Append at once: one chunk per batch. Confirms and credit wait for the commit."""
        if self.deleted:
            if channel is not None:
                self.credit_flow.ack_many(channel, len(items))
                channel.queue_confirmed(self, [s for _, s in items if s], [])
            return
        slog = self.log
        assert slog is not None
        offset = slog.next_offset
        stamped = []
        seqs = []
        for msg, seq in items:
            stamped.append(Message(msg.exchange, msg.routing_key,
                                   append_header(msg.props, _OFFSET_HEADER,
                                                 b"L" + _LONG.pack(offset)),
                                   msg.body, msg.msg_id, msg._address))
            offset += 1
            if seq:
                seqs.append(seq)
        slog.append(stamped)
        self.published += len(items)
        held = len(items)
        if channel is not None:
            self._senders.add(channel)
            if slog.unwritten_bytes <= UNWRITTEN_BYTES:
                # the disk keeps up: credit back now, as a classic queue after its turn
                self.credit_flow.ack_many(channel, held)
                held = 0
        self._unconfirmed.append((offset, channel, held, seqs))

    def _committed(self, committed: int) -> None:
        """The log committed everything below `committed`: confirm, grant credit, deliver."""
        self._settle_publishes(committed, failed=False)
        self._deliver()

    def _write_failed(self, first: int, end: int) -> None:
        self._settle_publishes(end, failed=True)

    def _settle_publishes(self, upto: int, *, failed: bool) -> None:
        pending = self._unconfirmed
        confirms: dict[PublishingChannel, list[int]] = {}
        ack_many = self.credit_flow.ack_many
        while pending and pending[0][0] <= upto:
            _, ch, n, seqs = pending.popleft()
            if ch is None:
                continue
            ack_many(ch, n)
            if seqs:
                got = confirms.get(ch)
                if got is None:
                    confirms[ch] = seqs
                else:
                    got.extend(seqs)
        for ch, seqs in confirms.items():
            if failed:
                ch.queue_confirmed(self, [], seqs)
            else:
                ch.queue_confirmed(self, seqs, [])

    # -- consumers --------------------------------------------------------------------------
    def check_consume(self, *, no_ack: bool, prefetch: int, global_prefetch: int,
                      arguments: dict[str, Any] | None) -> None:
        check_stream_consume(self.name, self.vhost.name, no_ack=no_ack, prefetch=prefetch,
                             global_prefetch=global_prefetch, arguments=arguments)

    async def admit_consumer(self, consumer: Consumer) -> None:
        check_exclusive_use(self, consumer.exclusive)

    def add_consumer(self, consumer: Consumer) -> None:
        assert self.log is not None
        spec = stream_offset(consumer.arguments, self.name, self.vhost.name)
        self.consumers.append(consumer)
        self._readers[consumer] = StreamReader(self.log, start_offset(self.log, spec))
        self.wake()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        reader = self._readers.pop(consumer, None)
        if reader is not None:
            reader.close()

    def consumer_offset(self, consumer: Consumer) -> int | None:
        reader = self._readers.get(consumer)
        return None if reader is None else reader.next

    def consumer_activity(self, consumer: Consumer) -> tuple[bool, str]:
        return True, "up"

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def consumer_waiting(self) -> None:
        """(docs/FLOW.md, busy queues) A stream holds no publisher credit back for consumers:
        readers never take anything away, so there is no backlog to favour."""

    def wake(self) -> None:
        """Consumer capacity changed: a delivery pass at the next loop turn (coalesced)."""
        if not self._deliver_scheduled and not self.deleted:
            self._deliver_scheduled = True
            asyncio.get_running_loop().call_soon(self._on_wake)

    def _on_wake(self) -> None:
        self._deliver_scheduled = False
        self._deliver()

    def _deliver(self) -> None:
        """Each consumer gets what it has credit for (and its writer takes), from its own
        position; at most DELIVERY_BATCH each per pass, then the loop goes round."""
        more = False
        for c in self.consumers:
            reader = self._readers[c]
            if not reader.available():
                continue
            room = c.room(DELIVERY_BATCH)
            if not room:
                continue
            deliver = c.channel.deliver
            writer = c.channel.writer
            given = 0
            for offset, msg in reader.read(room):
                deliver(c, self, (offset, msg, False, 0.0))
                given += 1
                if writer.full:  # past 1 MiB: the rest once it is written (on_resume wakes)
                    reader.rewind(offset + 1)
                    break
            self.delivered += given
            if given == DELIVERY_BATCH and reader.available():
                more = True
        if more:
            self.wake()

    # -- settling ---------------------------------------------------------------------------
    def ack(self, seqs: list[int]) -> None:
        """Acks only give credit back (the channel has counted them off its consumer)."""
        self.acked += len(seqs)
        if not self.deleted:
            self._deliver()

    def reject(self, seqs: list[int], requeue: bool) -> None:
        raise not_supported("basic.nack and basic.reject", self.name, self.vhost.name)

    def requeue(self, seqs: list[int]) -> None:
        """A closing channel's unacked deliveries: nothing to put back in a log."""

    async def get(self, ack_required: bool) -> None:
        raise not_supported("basic.get", self.name, self.vhost.name)

    async def purge(self) -> int:
        raise not_supported("queue.purge", self.name, self.vhost.name)

    async def counts(self) -> tuple[int, int]:
        return self.message_count, self.consumer_count

    def recover(self) -> int:
        return 0

    def touch(self) -> None:
        """Streams have no x-expires."""

    def publish_now(self, channel: PublishingChannel, items: list[tuple[Message, int]]) -> None:
        self.post_publishes(channel, items)

    def drain(self) -> None:
        """No mailbox: a publish is in the log as soon as it is posted."""

    def rate(self) -> float:
        return 0.0

    def set_ram_target(self, target: int | None) -> None:
        """A stream keeps no messages in RAM beyond its log's bounded tail."""

    # -- introspection ----------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return self.log.messages if self.log is not None else 0

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def info(self) -> dict[str, Any]:
        stats = self.log.stats() if self.log is not None else {}
        messages = int(stats.get("messages", 0))
        return {
            "name": self.name,
            "vhost": self.vhost.name,
            "durable": self.durable,
            "auto_delete": self.auto_delete,
            "exclusive": False,
            "arguments": self.arguments,
            "type": "stream",
            "messages": messages,
            "messages_ready": messages,
            "messages_unacknowledged": 0,
            "consumers": len(self.consumers),
            "message_bytes_ready": 0,
            "published": self.published,
            "delivered": self.delivered,
            "acked": self.acked,
            "first_offset": stats.get("first_offset", 0),
            "last_offset": stats.get("last_offset", -1),
            "committed_offset": stats.get("committed_offset", 0),
            "segments": stats.get("segments", 0),
            "stream_bytes": stats.get("bytes", 0),
        }

    def __repr__(self) -> str:
        return f"<StreamQueue {self.vhost.name}/{self.name}>"

