"""The queue task (RabbitMQ's rabbit_amqqueue_process).

Channels post publish batches to the queue's mailbox; the task takes everything queued in one
wake-up, enqueues it, confirms the batch to each publishing channel with one call, then delivers
round-robin to consumers within their prefetch. Operations a channel asks of it (basic.get,
purge, consume, ack, requeue) first drain the mailbox so they see every publish that came before
them; what the channel may call is written in broker/queue/contract.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog
from mypy_extensions import mypyc_attr

from broker.flow.credit_flow import DEFAULT_CREDIT, CreditFlow
from broker.flow.loop_ticks import TICKS
from broker.flow.mailbox import Mailbox
from broker.flow.memory_pressure import RateMeter
from broker.message import Message
from broker.protocol.properties import short_string
from broker.queue import dead_letter as dlx
from broker.queue.arguments import QueueArgs
from broker.queue.consumer import Consumer, check_exclusive_use
from broker.queue.durability import QueueDurability
from broker.queue.policy_args import AppliedPolicies, effective_arguments
from broker.queue.priority_queue import PriorityQueue
from broker.queue.variable_queue import Entry, VariableQueue

if TYPE_CHECKING:
    from broker.queue.contract import PublishingChannel
    from broker.vhost import VHost

__all__ = ["AMQQueue"]

log = structlog.get_logger("hare.queue")

_WAKE = ("wake",)
DELIVERY_BATCH = 1000  # deliveries per queue wake-up before yielding to the loop
# Ready messages above which a queue whose consumers are waiting on it is busy: it then grants
# its publishers credit only as fast as it delivers (see _grant_credit).
BUSY_BACKLOG = 2 * DELIVERY_BATCH
# How long a queue stays busy after a consumer last waited on it: a fast consumer that stalls
# for a moment (its process descheduled) still holds its publishers back meanwhile.
BUSY_HOLD_S = 0.25


class _QueueCredit(CreditFlow):
    """A queue's credit flow, with the credit it holds back from busy publishers (see
    AMQQueue._grant_credit): a sender that goes (`peer_down`) is owed none of it."""

    __slots__ = ("held",)

    def __init__(self, owner: object, initial_credit: int, more_credit_after: int) -> None:
        super().__init__(owner, initial_credit, more_credit_after)
        self.held: dict[Any, int] = {}

    def peer_down(self, peer: Any) -> None:
        self.held.pop(peer, None)
        super().peer_down(peer)


def _priority(consumer: Consumer) -> int:
    return consumer.priority


def _credit(vhost: VHost) -> tuple[int, int]:
    node = vhost.node
    if node is None:
        return DEFAULT_CREDIT
    s = node.settings
    return s.credit_flow_initial_credit, s.credit_flow_more_credit_after


# compiled by mypyc (broker/compiled.py); subclassed by interpreted queue kinds
@mypyc_attr(allow_interpreted_subclasses=True)
class AMQQueue:
    def __init__(
        self,
        vhost: VHost,
        name: str,
        *,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.home = vhost.node.name if vhost.node is not None else ""  # its node's name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments: dict[str, Any] = dict(arguments or {})
        self.args = QueueArgs(self.arguments)
        # the policies that apply (set by the vhost) and their merged definition
        # set by Durable.attach before start(): the paging backing queue (a PriorityQueue of
        # them with x-max-priority) and its disk side
        self.bq: VariableQueue | PriorityQueue = None  # type: ignore[assignment]
        self.durability: QueueDurability | None = None
        self._rate = RateMeter()
        # every consumer, in the order they came; a plain queue delivers round-robin over it
        self.consumers: deque[Consumer] = deque()
        # consumer priorities or single active consumer: who may receive, as round-robin
        # groups, highest priority first (None: deliver over `consumers`)
        self._groups: list[deque[Consumer]] | None = None
        self.active_consumer: Consumer | None = None  # x-single-active-consumer's
        self.mailbox = Mailbox()
        self.deleted = False
        self._had_consumer = False
        self._wake_pending = False
        self._task: asyncio.Task[None] | None = None
        self._ttl_timer: asyncio.TimerHandle | None = None
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._now = 0.0  # monotonic time at the start of the current batch
        self._ttl_dirty = False
        # counters for management / metrics
        self.credit_flow = _QueueCredit(self, *_credit(vhost))
        self._senders: set[PublishingChannel] = set()  # channels holding credit towards us
        # publishes enqueued but not yet credited back to their sender (while busy)
        self._held: dict[PublishingChannel, int] = self.credit_flow.held
        self._delivered_mark = 0  # `delivered` at the last credit decision
        self._waited_at = -BUSY_HOLD_S  # monotonic time a consumer last waited on us
        self._hold_timer: asyncio.TimerHandle | None = None  # re-examines held credit
        self.store_peers: tuple[Any, ...] = ()  # message stores we spend credit towards
        self.published = 0
        self.delivered = 0
        self.acked = 0
        self.redelivered = 0

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self.args.queue_type != self.args.kind:
            # applications declare stream queues unconditionally; say loudly that this one is
            # not a stream
            log.warning("queue type not available, the queue is a classic queue",
                        queue=self.name, vhost=self.vhost.name, requested=self.args.queue_type,
                        actual=self.args.kind)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"queue:{self.name}")
        self._arm_expiry()
        if self.args.lazy and self.bq is not None:
            self.set_ram_target(None)

    def set_policies(self, applied: AppliedPolicies) -> None:
        """The policies that apply changed: resolve the arguments again and apply what
        RabbitMQ applies at once (a new expiry clock, a lower max-length, lazy mode); a new
        message-ttl only concerns messages published from now on, as RabbitMQ's."""
        old = self.args
        new = QueueArgs(effective_arguments(self.arguments, applied.effective), applied)
        self.args = new
        if self._task is None or self.deleted:
            return  # not started: start() arms what the arguments ask for
        self.drain()
        if new.expires_ms != old.expires_ms:
            if new.expires_ms is None and self._expiry_timer is not None:
                self._expiry_timer.cancel()
                self._expiry_timer = None
            self._arm_expiry()
        limited = new.max_length is not None or new.max_length_bytes is not None
        if limited and new.overflow == "drop-head":
            self._drop_overflow()
        if new.lazy != old.lazy:
            # lazy: 0 from now on; back to default: no limit until the memory monitor's
            # next sample under pressure sets one
            self.set_ram_target(None)
        if self.durability is not None:
            self.durability.end_batch()

    async def _run(self) -> None:
        mailbox = self.mailbox
        while not self.deleted:
            batch = await mailbox.get()
            try:
                self._process(batch)
            except Exception:  # a bug must not silently kill the queue
                log.exception("queue task error", queue=self.name)
            if self._wake_pending:
                # we asked for another turn (delivery budget used up, credit held back):
                # it comes after the loop has gone round, writers flushed and readers read
                await asyncio.sleep(0)

    def stop(self) -> None:
        """The queue is deleted: its durable state goes too."""
        self._settle_posted(confirm=True)
        self.shutdown()
        if self.durability is not None:
            self.bq.purge()
            self.bq.drop_pending()
            self.durability.delete()
            self.durability = None

    def shutdown(self) -> None:
        """The broker stops: keep the durable state (clean index close happens in close())."""
        self.deleted = True
        self._settle_posted(confirm=False)
        for ch in self._senders:
            ch.credit_flow.peer_down(self)
        self._senders.clear()
        self._held.clear()
        for peer in self.store_peers:
            peer.credit_flow.peer_down(self)
        for timer in (self._ttl_timer, self._expiry_timer, self._hold_timer):
            if timer is not None:
                timer.cancel()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()

    def _settle_posted(self, *, confirm: bool) -> None:
        """Publishes posted to the mailbox that the task will never take (the queue stops
        before its next turn) get their answer now, or their publishers wait forever:
        confirmed for a deleted queue (as RabbitMQ confirms a publish whose queue went
        normally), nacked otherwise (a quorum leader stepping down: the publisher sends them
        again, to the new leader)."""
        by_channel: dict[PublishingChannel, list[int]] = {}
        for item in self.mailbox.take():
            if item[0] == "pubs" and item[1] is not None:
                seqs = by_channel.setdefault(item[1], [])
                seqs.extend(seq for _, seq in item[2] if seq)
        for ch, seqs in by_channel.items():
            if seqs:
                ch.queue_confirmed(self, seqs if confirm else [], [] if confirm else seqs)

    # -- mailbox ----------------------------------------------------------------------------
    def post_publishes(self, channel: PublishingChannel | None,
                       items: list[tuple[Message, int]]) -> None:
        self.mailbox.put(("pubs", channel, items))

    def publish_now(self, channel: PublishingChannel, items: list[tuple[Message, int]]) -> None:
        """Taken now; a task waiting on an empty mailbox is not woken for it, so it spends no
        empty turn in the next iteration ahead of the writers' flush of these deliveries."""
        self.mailbox.put_quiet(("pubs", channel, items))
        self.drain()  # takes it with anything queued before it, in order

    def wake(self) -> None:
        """Consumer capacity changed: try delivering again (coalesced)."""
        if not self._wake_pending and not self.deleted:
            self._wake_pending = True
            self.mailbox.put(_WAKE)

    def drain(self) -> None:
        """Process what is in the mailbox now, for an operation that must see it."""
        batch = self.mailbox.take()
        if batch:
            self._process(batch)

    def _process(self, batch: list[Any]) -> None:
        self._wake_pending = False
        self._now = time.monotonic()
        for item in batch:
            if item[0] == "pubs":
                self._enqueue(item[1], item[2])
        self._deliver()
        self._end_turn()
        if self._held:
            self._grant_credit()

    def _end_turn(self) -> None:
        if self.durability is not None:
            self.durability.end_batch()
        if self._ttl_dirty:
            self._ttl_dirty = False
            self._arm_ttl()

    # -- credit to publishing channels ------------------------------------------------------
    def _grant_credit(self) -> None:
        """Credit for the publishes enqueued so far goes back to their senders, after the
        queue has had its chance to deliver (end of a turn, and after an ack's refill). A
        queue is busy while BUSY_BACKLOG messages are ready and a consumer waited on it in
        the last BUSY_HOLD_S (it acked its latest deliveries within PROMPT_TICKS loop
        iterations: it is served at the pace of the broker's loop, not its own). Then it
        favours delivery, as RabbitMQ's queue process does, and grants only as many as it
        delivered since the last decision, so its publishers (credit flow carries it up to
        their sockets) slow to the rate its consumers are served; what it keeps back it pays
        with later deliveries, or all of it once the hold has passed. Otherwise it grants
        all: for consumers that are slow themselves, or none, a queue is a buffer."""
        held = self._held
        delivered = self.delivered - self._delivered_mark
        self._delivered_mark = self.delivered
        ack_many = self.credit_flow.ack_many
        until = self._waited_at + BUSY_HOLD_S
        busy = (
            self.consumers
            and len(self.bq) >= BUSY_BACKLOG
            and self._now < until
            and not self.deleted
        )
        if not busy:
            for ch, n in held.items():
                ack_many(ch, n)
            held.clear()
            return
        for ch in list(held):
            if not delivered:
                break
            n = held[ch]
            if n > delivered:
                held[ch] = n - delivered
                ack_many(ch, delivered)
                break
            del held[ch]
            ack_many(ch, n)
            delivered -= n
        if held and self._hold_timer is None:  # nothing delivered by then: pay it all
            loop = asyncio.get_running_loop()
            self._hold_timer = loop.call_at(loop.time() + until - self._now, self._hold_over)

    def _hold_over(self) -> None:
        self._hold_timer = None
        if self._held and not self.deleted:
            self.wake()

    def consumer_waiting(self) -> None:
        """A consumer acked all it had been sent at once: it is waiting on this queue."""
        self._waited_at = time.monotonic()

    # -- publish ----------------------------------------------------------------------------
    def _enqueue(self, channel: PublishingChannel | None,
                 items: list[tuple[Message, int]]) -> None:
        if channel is not None:  # credited back after the delivery pass: _grant_credit
            held = self._held
            held[channel] = held.get(channel, 0) + len(items)
            self._senders.add(channel)
        if self.deleted:
            return
        bq = self.bq
        args = self.args
        ttl = args.ttl_ms
        now = self._now
        confirms: list[int] = []
        rejected: list[int] = []
        reject_publish = args.overflow in ("reject-publish", "reject-publish-dlx")
        durability = self.durability
        publish = bq.publish
        published = 0
        for msg, seq in items:
            if reject_publish and self._full(len(msg.body)):
                if seq:
                    rejected.append(seq)
                if args.overflow == "reject-publish-dlx":
                    self._dead_letter(msg, dlx.MAXLEN)
                continue
            # Message.has_expiration inline: this runs for every message
            props = msg.props
            if ttl is not None or (len(props) >= 2 and props[0] & 0x01):
                publish(msg, self._expiry_for(msg, ttl, now))
            else:
                publish(msg, 0.0)
            published += 1
            if seq:
                if durability is not None and durability.persistent and msg.persistent:
                    assert channel is not None
                    durability.track(msg, channel, seq)  # confirmed once on disk
                else:
                    confirms.append(seq)
        self.published += published
        limited = args.max_length is not None or args.max_length_bytes is not None
        if limited and not reject_publish:
            self._drop_overflow()
        if channel is not None and (confirms or rejected):
            channel.queue_confirmed(self, confirms, rejected)

    def _expiry_for(self, msg: Message, ttl: int | None, now: float) -> float:
        """When a message published now expires (0.0: never); the TTL timer is re-armed at
        the end of the turn when it does."""
        best = ttl
        if msg.has_expiration:
            try:  # read from the raw block: a queued message keeps nothing decoded
                per_msg = int(short_string(msg.props, "expiration") or "")
            except ValueError:
                per_msg = None
            if per_msg is not None and (best is None or per_msg < best):
                best = per_msg
        if best is None:
            return 0.0
        self._ttl_dirty = True
        # ttl 0 means "deliver now or never": a consumer in this batch gets it, else it expires
        return now + best / 1000.0

    def _full(self, incoming: int) -> bool:
        a = self.args
        if a.max_length is not None and len(self.bq) >= a.max_length:
            return True
        limit = a.max_length_bytes
        return limit is not None and self.bq.bytes_ready + incoming > limit

    def _drop_overflow(self) -> None:
        a = self.args
        dropped: list[Entry] = []
        while self.bq and (
            (a.max_length is not None and len(self.bq) > a.max_length)
            or (a.max_length_bytes is not None and self.bq.bytes_ready > a.max_length_bytes)
        ):
            entry = self.bq.fetch(False)
            if entry is None:
                break
            dropped.append(entry)
        # max-length drops them either way (a message that cannot be dead-lettered too: keeping
        # it would break the limit), as without a dead-letter exchange
        for entry in dropped:
            self._dead_letter(entry[1], dlx.MAXLEN)

    # -- TTL and x-expires ------------------------------------------------------------------
    def _arm_ttl(self) -> None:
        """Expire messages at the head, and schedule the next head expiry."""
        if self._ttl_timer is not None:
            self._ttl_timer.cancel()
            self._ttl_timer = None
        head = self.bq.peek()
        if head is None or not head[3]:
            return
        now = time.monotonic()
        expired = False
        while head is not None and head[3] and head[3] <= now:
            entry = self.bq.fetch(True)
            if entry is None:
                break
            expired = True
            if self._dead_letter(entry[1], dlx.EXPIRED, entry[0]):
                self.bq.ack((entry[0],))
            else:  # it stays at the head, no longer to expire
                self.bq.restore((entry[0],))
            head = self.bq.peek()
        if expired and self.durability is not None:
            self.durability.end_batch()
        if head is not None and head[3]:
            loop = asyncio.get_running_loop()
            self._ttl_timer = loop.call_at(
                loop.time() + max(0.0, head[3] - now), self._on_ttl_timer
            )

    def _on_ttl_timer(self) -> None:
        self._ttl_timer = None
        if not self.deleted:
            self._arm_ttl()

    def _arm_expiry(self) -> None:
        """x-expires: delete the queue after it has gone unused for that long."""
        if self.args.expires_ms is None or self.deleted:
            return
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        self._expiry_timer = asyncio.get_running_loop().call_later(
            self.args.expires_ms / 1000.0, self._on_expiry
        )

    def touch(self) -> None:
        """The queue was used (declare, get, consume): restart its x-expires clock."""
        if self.args.expires_ms is not None:
            self._arm_expiry()

    def _on_expiry(self) -> None:
        self._expiry_timer = None
        if self.consumers or self.deleted:
            return
        log.info("queue expired", queue=self.name, vhost=self.vhost.name)
        self.vhost.delete_queue(self)

    # -- dead-lettering ---------------------------------------------------------------------
    def _dead_letter(self, msg: Message, reason: str, seq: int = -1) -> bool:
        """Dead-letter `msg` (or let it go: no dead-letter exchange). False when that failed:
        the caller keeps the message where it was, as RabbitMQ would not lose it either. A
        stored message always decodes (the channel checks each publish), so this is for
        messages stored before that check, and for bugs: logged once, never raised. `seq`:
        its place in this queue, when it is still pending there (the caller acks it next)."""
        exchange = self.args.dlx
        if exchange is None:
            return True
        try:
            out = dlx.dead_letter(msg, self.name, reason, exchange, self.args.dlrk)
            self.vhost.publish_internal(out)
        except Exception as exc:  # whatever it is, the message must not go
            log.error(
                "dead-lettering failed, message kept",
                queue=self.name,
                vhost=self.vhost.name,
                reason=reason,
                error=repr(exc)[:200],
            )
            return False
        return True

    # -- delivery ---------------------------------------------------------------------------
    def _deliver(self) -> None:
        if not self.bq:
            return
        groups = self._groups
        if groups is None:  # no consumer priorities, no single active consumer: the hot path
            if self.consumers:
                self._deliver_to(self.consumers, DELIVERY_BATCH)
            return
        budget = DELIVERY_BATCH
        for group in groups:  # highest priority first; a lower one only gets what they can't
            budget = self._deliver_to(group, budget)
            if budget < 0 or not self.bq:
                break

    def _deliver_to(self, consumers: deque[Consumer], budget: int) -> int:
        """Round-robin over `consumers` while one can take a message. Returns the budget left
        (negative: used up, a wake-up is queued)."""
        bq = self.bq
        n = len(consumers)
        TICKS.read()  # deliveries note their loop iteration (Consumer.tick)
        if n == 1:
            return self._deliver_alone(consumers[0], budget)
        idle = 0
        now = self._now
        durability = self.durability
        if durability is not None and not durability.persistent:
            durability = None  # it records deliveries of durable queues only
        while bq and idle < n:
            budget -= 1
            if budget < 0:  # let the writers flush and other queues run, then go on
                self.wake()
                break
            c = consumers[0]
            if not c.can_take():
                consumers.rotate(-1)
                idle += 1
                continue
            entry = bq.fetch(not c.no_ack)
            if entry is None:  # nothing readable was left
                break
            # an expired message leaves, unless it cannot be dead-lettered: then it is
            # delivered as if it had not expired, rather than lost
            if entry[3] and entry[3] < now and self._dead_letter(entry[1], dlx.EXPIRED,
                                                                 entry[0]):
                if not c.no_ack:
                    bq.ack((entry[0],))
                continue
            if durability is not None and not c.no_ack and entry[1].persistent:
                durability.delivered(entry[0])
            c.channel.deliver(c, self, entry)
            self.delivered += 1
            if entry[2]:
                self.redelivered += 1
            consumers.rotate(-1)
            idle = 0
        return budget

    def _deliver_alone(self, c: Consumer, budget: int) -> int:
        """_deliver_to for one consumer (the commonest case, and every single active
        consumer): nobody to take turns with, so what it may take is asked once
        (`Consumer.room`) and counted down. Returns the budget left, as _deliver_to."""
        room = c.room(budget)
        if not room:
            return budget
        bq = self.bq
        ch = c.channel
        writer = ch.writer
        deliver = ch.deliver
        ack_required = not c.no_ack
        now = self._now
        durability = self.durability
        if durability is not None and not (durability.persistent and ack_required):
            durability = None  # it records acked deliveries of durable queues only
        spent = given = 0
        while bq and given < room and spent < budget:
            if writer.full:  # past 1 MiB: the rest once it is written (on_resume wakes us)
                break
            spent += 1
            entry = bq.fetch(ack_required)
            if entry is None:  # nothing readable was left
                break
            # an expired message leaves, unless it cannot be dead-lettered (see _deliver_to)
            if entry[3] and entry[3] < now and self._dead_letter(entry[1], dlx.EXPIRED,
                                                                 entry[0]):
                if ack_required:
                    bq.ack((entry[0],))
                continue
            if durability is not None and entry[1].persistent:
                durability.delivered(entry[0])
            deliver(c, self, entry)
            given += 1
            if entry[2]:
                self.redelivered += 1
        self.delivered += given
        if spent == budget and bq:  # let the writers flush and other queues run, then go on
            self.wake()
            return -1
        return budget - spent

    # -- operations a channel awaits (broker/queue/contract.py) -----------------------------
    async def get(self, ack_required: bool) -> tuple[Entry, int] | None:
        return self._fetch(ack_required)

    async def purge(self) -> int:
        self.drain()
        count = self.bq.purge()
        self.wake()
        return count

    async def counts(self) -> tuple[int, int]:
        return self.message_count, self.consumer_count

    def _fetch(self, ack_required: bool) -> tuple[Entry, int] | None:
        """basic.get, answered at once."""
        self.drain()
        self.touch()
        while True:
            entry = self.bq.fetch(ack_required)
            if entry is None:
                return None
            expired = entry[3] and entry[3] < time.monotonic()
            if expired and self._dead_letter(entry[1], dlx.EXPIRED, entry[0]):  # _deliver_to
                if ack_required:
                    self.bq.ack((entry[0],))
                continue
            self.delivered += 1
            if self.durability is not None:
                if ack_required and entry[1].persistent:
                    self.durability.delivered(entry[0])
                self.wake()  # the index records go out with the next batch
            return entry, len(self.bq)

    def ack(self, seqs: Iterable[int]) -> None:
        """The consumers' capacity freed by an ack is used at once: the next deliveries go
        out in this loop iteration, not after a wake-up of the queue task."""
        self.acked += len(self.bq.ack(seqs))
        if self.deleted:
            return
        self._now = time.monotonic()
        self._deliver()
        self._end_turn()
        if self._held:
            self._grant_credit()

    def reject(self, seqs: list[int], requeue: bool) -> None:
        if requeue:
            self.bq.requeue(seqs)
            self._ttl_dirty = True  # a requeued message may have expired meanwhile: drop it
        else:
            self._discard(seqs, dlx.REJECTED)
        self.wake()

    def _discard(self, seqs: list[int], reason: str) -> None:
        """Pending messages leave the queue, dead-lettered for `reason` (or dropped)."""
        kept = [seq for seq, msg in self.bq.pending_messages(seqs)
                if not self._dead_letter(msg, reason, seq)]
        gone = set(kept)
        self.bq.ack([s for s in seqs if s not in gone] if gone else seqs)
        if kept:  # could not be dead-lettered: back in the queue, as for requeue=true
            self.bq.requeue(kept)

    def requeue(self, seqs: list[int]) -> None:
        if seqs and not self.deleted:
            self.bq.requeue(seqs)
            self._ttl_dirty = True  # as RabbitMQ: expired requeued messages go at once
            self.wake()

    def recover(self) -> int:
        """Load a durable queue's messages from its index (at start, before any client)."""
        if self.durability is None:
            return 0
        total = 0
        for count, start, end, size in self.durability.recover():
            self.bq.recover(count, start, end, size)
            total += count
        return total

    def check_consume(self, *, no_ack: bool, prefetch: int, global_prefetch: int,
                      arguments: dict[str, Any] | None) -> None:
        """A classic queue takes every consumer the channel's own checks let through."""

    async def admit_consumer(self, consumer: Consumer) -> None:
        check_exclusive_use(self, consumer.exclusive)

    def add_consumer(self, consumer: Consumer) -> None:
        self.drain()
        self.consumers.append(consumer)
        self._had_consumer = True
        if self.args.single_active:
            if self.active_consumer is None:
                self._activate(consumer)
        elif consumer.priority or self._groups is not None:
            self._add_to_group(consumer)
        self.touch()
        self.wake()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if self.args.single_active:
            if consumer is self.active_consumer:
                # the next one takes over: highest x-priority, then the longest waiting
                nxt = max(self.consumers, key=_priority, default=None)
                self._activate(nxt)
                self.wake()
        elif self._groups is not None:
            self._remove_from_group(consumer)
        if not self.consumers:
            self.touch()
            if self.auto_delete and self._had_consumer and not self.deleted:
                self.vhost.delete_queue(self)

    def _activate(self, consumer: Consumer | None) -> None:
        """x-single-active-consumer: only `consumer` receives (one group of one)."""
        self.active_consumer = consumer
        self._groups = [deque((consumer,))] if consumer is not None else []

    def _add_to_group(self, consumer: Consumer) -> None:
        """Consumer priorities: one round-robin group per x-priority, highest first. Plain
        queues keep `_groups` None and deliver round-robin over `consumers`."""
        if self._groups is None:  # the first prioritised consumer: group the others too
            self._groups = []
            for c in self.consumers:
                if c is not consumer:
                    self._add_to_group(c)
        groups = self._groups
        for i, group in enumerate(groups):
            p = group[0].priority
            if p == consumer.priority:
                group.append(consumer)
                return
            if p < consumer.priority:
                groups.insert(i, deque((consumer,)))
                return
        groups.append(deque((consumer,)))

    def _remove_from_group(self, consumer: Consumer) -> None:
        groups = self._groups
        assert groups is not None
        for i, group in enumerate(groups):
            if group[0].priority == consumer.priority:
                group.remove(consumer)
                if not group:
                    del groups[i]
                break
        if not any(g[0].priority for g in groups):
            self._groups = None  # only priority 0 left: back to the plain path

    def consumer_activity(self, consumer: Consumer) -> tuple[bool, str]:
        """(active, activity_status) as RabbitMQ's management API shows a consumer."""
        if not self.args.single_active:
            return True, "up"
        if consumer is self.active_consumer:
            return True, "single_active"
        return False, "waiting"

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def rate(self) -> float:
        """Messages in + out per second, smoothed (what the memory monitor shares RAM by)."""
        return self._rate.update(self.bq.in_count + self.bq.out_count, time.monotonic())

    def set_ram_target(self, target: int | None) -> None:
        """How many ready messages may keep their body in RAM (None: all); the variable
        queue pages out the rest now."""
        if self.args.lazy:
            target = 0  # queue-mode lazy: every body goes to disk as it arrives
        if self.deleted or target == self.bq.target_ram_count:
            return
        self.bq.set_target_ram_count(target)
        if self.durability is not None:
            self.durability.end_batch()

    def close(self) -> None:
        """Clean broker shutdown: flush and close the index so the next start is fast."""
        if self.durability is not None:
            self.durability.close()

    # -- introspection ----------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        self.drain()
        return len(self.bq)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def info(self) -> dict[str, Any]:
        ready = len(self.bq)
        unacked = self.bq.pending_count
        return {
            "name": self.name,
            "vhost": self.vhost.name,
            "durable": self.durable,
            "auto_delete": self.auto_delete,
            "exclusive": self.exclusive_owner is not None,
            "arguments": self.arguments,
            "messages": ready + unacked,
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
            "consumers": len(self.consumers),
            "message_bytes_ready": self.bq.bytes_ready,
            "published": self.published,
            "delivered": self.delivered,
            "acked": self.acked,
        }

    def __repr__(self) -> str:
        return f"<AMQQueue {self.vhost.name}/{self.name}>"
