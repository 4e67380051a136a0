"""The quorum queue (RabbitMQ's rabbit_quorum_queue + rabbit_fifo): a durable queue whose
state is a replicated log, applied only once a majority of its members holds it.

The leader takes a publish in two steps. First it writes the message to its own member log
(broker/queue/quorum_log.py: a queue index, the store for large bodies) under a new seq_id
and, with followers, ships the turn's operations to them. Then, when a majority of members
(itself included) has that batch on disk - `commit_pos` - it applies it: max-length and
reject-publish, TTL, into the backing queue, confirms to the publishers, credit back to them,
deliveries. So a consumer never gets, and a publisher is never confirmed, what a majority does
not hold (docs/CLUSTER.md, "Replicated queues"). A single node is a queue of one member: the
majority is its own fsync, and the semantics are the same.

The rest is a classic queue's (AMQQueue): consumers, prefetch, single active consumer,
basic.get, TTL, dead-lettering, x-expires. What a quorum queue adds:
- every message is kept on disk whatever its delivery mode, and the backlog is paged from the
  index as for a durable classic queue (RabbitMQ's quorum queues held it all in memory before
  3.10);
- returns (nack/reject with requeue, a consumer's channel closing) count: redeliveries carry
  `x-delivery-count`, and past `x-delivery-limit` a message is dead-lettered with reason
  `delivery_limit` (or dropped);
- `x-dead-letter-strategy: at-least-once` (with `x-overflow: reject-publish`): a dead-lettered
  message leaves the log only once every queue it was routed to confirmed it."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker.flow.credit_flow import CreditFlow
from broker.message import Message
from broker.protocol.properties import rewrite_properties
from broker.queue import dead_letter as dlx
from broker.queue.amqqueue import AMQQueue
from broker.queue.policy_args import AppliedPolicies
from broker.queue.quorum_log import CHECKED_OUT, LogIndex, LogStore, MemberLog, Op
from broker.queue.variable_queue import Entry, VariableQueue, _Status

if TYPE_CHECKING:
    from broker.queue.contract import PublishingChannel
    from broker.vhost import VHost

__all__ = ["DELIVERY_LIMIT", "Followers", "QuorumQueue", "QuorumVariableQueue"]

log = structlog.get_logger("hare.quorum")

DELIVERY_LIMIT = "delivery_limit"  # the x-death reason past x-delivery-limit (RabbitMQ's)
GET_WAIT_S = 5.0  # basic.get waits this long for earlier publishes to commit
DLX_RETRY_S = 1.0  # at-least-once: a dead-lettered message not confirmed is sent again


def delivery_count_header(count: int) -> bytes:
    """x-delivery-count as RabbitMQ adds it: an AMQP long (signed 32 bits)."""
    return b"I" + count.to_bytes(4, "big", signed=True)


def with_delivery_count(msg: Message, count: int) -> Message:
    props = rewrite_properties(msg.props,
                               add_headers={"x-delivery-count": delivery_count_header(count)})
    return msg.with_props(props)


class QuorumVariableQueue(VariableQueue):
    """The leader's backing queue: messages come in already written by the member log (at
    commit), removals go through the log, and what it hands out says how often it was
    returned (`x-delivery-count`, redelivered only when returned: RabbitMQ's rule)."""

    def __init__(self, member: MemberLog, owner: tuple[str, str], segment_entries: int) -> None:
        self.log_index = LogIndex(member)
        super().__init__(LogStore(member.store, owner), self.log_index, durable=True,
                         segment_entries=segment_entries)
        self.log = member

    def append_written(self, seq: int, msg: Message, embedded: bool, expires_at: float) -> None:
        """Append a message the log has written (at its commit)."""
        size = len(msg.body)
        st = _Status(seq, msg.msg_id, msg, size, True, False, expires_at)
        st.on_index = True
        st.embedded = embedded
        st.in_store = not embedded
        (self._q1 if self._q3 else self._q4).append(st)
        if seq >= self._next_seq:
            self._next_seq = seq + 1
        self._len += 1
        self.in_count += 1
        self._bytes += size
        self._ram += 1
        self._ram_bytes += size
        if self._target is not None and self._ram > self._target:
            self.reduce_memory_use()

    def fetch(self, ack_required: bool = True) -> Entry | None:
        # taken as pending first: a no-ack fetch's removal would forget its delivery count
        entry = super().fetch(True)
        if entry is None:
            return None
        seq = entry[0]
        member = self.log
        returns = member.counts.get(seq, 0) >> 1
        if ack_required:
            member.checkout(seq)
        else:
            self.ack((seq,))
        if returns:
            return (seq, with_delivery_count(entry[1], returns), True, entry[3])
        return (seq, entry[1], False, entry[3]) if entry[2] else entry


class Followers(Protocol):
    """A leader's followers (broker/cluster/quorum_leader.py): what it ships and what they
    hold. A queue with one member has none."""

    def ship(self, pos: int, ops: list[Op]) -> None: ...

    def positions(self) -> list[int]:
        """The durable positions of the followers that follow this leader's epoch."""
        ...

    def stop(self) -> None: ...

    def member_positions(self) -> dict[str, int]:
        """Each follower's position as it answered (the management API)."""
        ...

    @property
    def shipped_bytes(self) -> int:
        """LOG frame bytes sent to the followers so far (the cost of replication)."""
        ...


def _always() -> bool:
    return True


def _running(node: str) -> bool:
    return True


class QuorumQueue(AMQQueue):
    def __init__(self, vhost: VHost, name: str, *, durable: bool = True,
                 exclusive_owner: object | None = None, auto_delete: bool = False,
                 arguments: dict[str, Any] | None = None) -> None:
        super().__init__(vhost, name, durable=durable, exclusive_owner=exclusive_owner,
                         auto_delete=auto_delete, arguments=arguments)
        self.log: MemberLog = None  # type: ignore[assignment]  # attach(), before start()
        self.bq: QuorumVariableQueue = None  # type: ignore[assignment]
        # taken but not yet held by a majority: (pos, seq, message, embedded, channel, cseq)
        self._uncommitted: deque[
            tuple[int, int, Message, bool, PublishingChannel | None, int]] = deque()
        self._next_seq = 0
        self.commit_pos = 0  # every batch up to here is held by a majority
        self.term_pos = 0  # this leader's state as it took over: served once committed
        self.members: list[str] = [self.home]  # the leader first
        self.epoch = 0
        self.followers: Followers | None = None
        # a cluster's leader delivers only while it holds its etcd lease (another leader can
        # be elected only after that lease expired); a single node always may
        self.lease_ok: Callable[[], bool] = _always
        self.node_running: Callable[[str], bool] = _running
        self._lease_timer: asyncio.TimerHandle | None = None
        self._commit_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._dlx: _AtLeastOnce | None = None
        self._over_limit: set[int] = set()  # returned past x-delivery-limit while away

    # -- life cycle -------------------------------------------------------------------------
    def attach(self, member: MemberLog, segment_entries: int) -> None:
        """Its member log (Durable.attach): the backing queue reads and removes through it."""
        self.log = member
        self.durability = member  # type: ignore[assignment]  # what AMQQueue drives
        member.on_durable = self._member_durable
        self.bq = QuorumVariableQueue(member, (self.vhost.name, self.name), segment_entries)

    def recover(self) -> int:
        """Serve what the member log holds (a single node's start, or a member that becomes
        leader): the backlog stays on disk, paged in as it is delivered. Messages a consumer
        held when its leader went come back returned once more, as RabbitMQ returns the
        messages of consumers that are gone."""
        member = self.log
        if not member.opened:
            member.recover()
        count = member.index.count()
        low, high = member.index.bounds()
        self._next_seq = max(self._next_seq, high)
        self.epoch = max(self.epoch, member.state.epoch)
        if count:
            self.bq.recover(count, low, high)
        returned = [(seq, ((v >> 1) + 1) << 1) for seq, v in member.counts.items()
                    if v & CHECKED_OUT]
        member.set_counts(returned)
        member.end_batch()
        self.term_pos = member.state.pos
        limit = self.args.delivery_limit
        if limit is not None:
            self._over_limit = {seq for seq, v in returned if (v >> 1) > limit}
        self._recommit()
        return count

    def start(self) -> None:
        super().start()
        self._dlx = _AtLeastOnce(self) if self.args.at_least_once else None
        self.wake()  # a first turn once the topology is restored (bindings: dead-lettering)

    def set_policies(self, applied: AppliedPolicies) -> None:
        super().set_policies(applied)
        if self._task is None or self.deleted:
            return
        if self.args.at_least_once and self._dlx is None:
            self._dlx = _AtLeastOnce(self)
        elif not self.args.at_least_once and self._dlx is not None and not self._dlx.pending:
            self._dlx.stop()
            self._dlx = None

    def shutdown(self) -> None:
        self._release_uncommitted(confirm=False)
        if self.followers is not None:
            self.followers.stop()
            self.followers = None
        if self._dlx is not None:
            self._dlx.stop()
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        for _, fut in self._commit_waiters:
            if not fut.done():
                fut.set_result(None)
        self._commit_waiters.clear()
        super().shutdown()

    def _release_uncommitted(self, *, confirm: bool) -> None:
        """Publishes taken but not committed: nacked (the leader goes; the publisher sends
        them again) or, for a deleted queue, confirmed as RabbitMQ confirms a publish whose
        queue was deleted."""
        by_channel: dict[PublishingChannel, list[int]] = {}
        for _, _, _, _, ch, cseq in self._uncommitted:
            if ch is not None and cseq:
                by_channel.setdefault(ch, []).append(cseq)
        self._uncommitted.clear()
        for ch, seqs in by_channel.items():
            ch.queue_confirmed(self, seqs if confirm else [], [] if confirm else seqs)

    def stop(self) -> None:
        """Deleted: its member log goes with it, without acking message by message."""
        self._settle_posted(confirm=True)
        self._release_uncommitted(confirm=True)
        self.shutdown()
        if self.durability is not None:
            self.log.delete()
            self.durability = None

    # -- publish: into the log now, into the queue at commit ----------------------------------
    def _enqueue(self, channel: PublishingChannel | None,
                 items: list[tuple[Message, int]]) -> None:
        if channel is not None:
            self._senders.add(channel)  # credit is granted when the publish is applied
        if self.deleted:
            return
        member = self.log
        uncommitted = self._uncommitted
        seq = self._next_seq
        for msg, cseq in items:
            embedded = member.publish(seq, msg.msg_id, msg.encode())
            uncommitted.append((member.open_pos, seq, msg, embedded, channel, cseq))
            seq += 1
        self._next_seq = seq

    def _member_durable(self, pos: int) -> None:
        self._recommit()

    def followers_moved(self) -> None:
        """A follower's position changed (its answer over the link, or it left)."""
        self._recommit()

    def _recommit(self) -> None:
        positions = [self.log.durable_pos]
        if self.followers is not None:
            positions += self.followers.positions()
        need = len(self.members) // 2 + 1
        if len(positions) < need:
            return
        positions.sort(reverse=True)
        commit = positions[need - 1]
        if commit <= self.commit_pos:
            return
        self.commit_pos = commit
        self._apply_committed()
        if self._commit_waiters:
            waiting = []
            for pos, fut in self._commit_waiters:
                if pos <= commit:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    waiting.append((pos, fut))
            self._commit_waiters = waiting

    @property
    def serving(self) -> bool:
        """This leader's state is held by a majority: it may deliver."""
        return self.commit_pos >= self.term_pos

    def _apply_committed(self) -> None:
        """The state machine's turn: committed publishes enter the queue (RabbitMQ's
        rabbit_fifo applies enqueues after commit: limits and TTL count from here)."""
        if self.deleted:
            return
        commit = self.commit_pos
        uncommitted = self._uncommitted
        if uncommitted and uncommitted[0][0] <= commit:
            self._now = time.monotonic()
            self._apply_publishes(commit)
        self._deliver()
        self._end_turn()
        if self._held:
            self._grant_credit()

    def _apply_publishes(self, commit: int) -> None:
        uncommitted = self._uncommitted
        bq, args, now = self.bq, self.args, self._now
        ttl = args.ttl_ms
        reject_publish = args.overflow == "reject-publish"  # -dlx: drop-head, as RabbitMQ
        held = self._held
        confirms: dict[PublishingChannel, tuple[list[int], list[int]]] = {}
        while uncommitted and uncommitted[0][0] <= commit:
            _, seq, msg, embedded, channel, cseq = uncommitted.popleft()
            slot: tuple[list[int], list[int]] | None = None  # the channel's (acks, nacks)
            if channel is not None:
                held[channel] = held.get(channel, 0) + 1
                slot = confirms.get(channel)
                if slot is None:
                    slot = confirms[channel] = ([], [])
            if reject_publish and self._full(len(msg.body)):
                self.log.ack([seq])
                if cseq and slot is not None:
                    slot[1].append(cseq)
                continue
            expires_at = (self._expiry_for(msg, ttl, now)
                          if ttl is not None or msg.has_expiration else 0.0)
            bq.append_written(seq, msg, embedded, expires_at)
            self.published += 1
            if cseq and slot is not None:
                slot[0].append(cseq)
        if (args.max_length is not None or args.max_length_bytes is not None) and (
                not reject_publish):
            self._drop_overflow()
        for channel, (acks, nacks) in confirms.items():
            if acks or nacks:
                channel.queue_confirmed(self, acks, nacks)

    # -- delivery: only what a majority holds ---------------------------------------------------
    def _deliver(self) -> None:
        if self.commit_pos >= self.term_pos:
            if not self.lease_ok():
                self._lease_wait()
                return
            if self._over_limit:
                over, self._over_limit = self._over_limit, set()
                self._discard_ready(over)
            super()._deliver()

    async def get(self, ack_required: bool) -> tuple[Entry, int] | None:
        """basic.get sees every publish that came before it on any channel (as on a classic
        queue: AMQP's order), so it waits for those to commit (at most GET_WAIT_S; RabbitMQ's
        quorum queue answers from what is committed and may miss them)."""
        self.drain()
        wait_for = self._uncommitted[-1][0] if self._uncommitted else 0
        if not self.serving:
            wait_for = max(wait_for, self.term_pos)
        if wait_for > self.commit_pos:
            return await self._get_after(wait_for, ack_required)
        if not self.lease_ok():
            return None
        return self._get_now(ack_required)

    async def _get_after(self, pos: int, ack_required: bool) -> tuple[Entry, int] | None:
        fut = asyncio.get_running_loop().create_future()
        self._commit_waiters.append((pos, fut))
        try:
            await asyncio.wait_for(fut, GET_WAIT_S)
        except TimeoutError:
            pass
        if self.deleted or not self.serving or not self.lease_ok():
            return None
        return self._get_now(ack_required)

    def _get_now(self, ack_required: bool) -> tuple[Entry, int] | None:
        got = super()._fetch(ack_required)
        if got is None:
            return None
        entry, remaining = got
        if not entry[2]:  # RabbitMQ's basic.get says x-delivery-count: 0 too
            entry = (entry[0], with_delivery_count(entry[1], 0), False, entry[3])
        return entry, remaining

    def _lease_wait(self) -> None:
        """Deliveries wait for the node's lease to be renewed: look again shortly."""
        if self._lease_timer is None and not self.deleted:
            self._lease_timer = asyncio.get_running_loop().call_later(0.1, self._lease_again)

    def _lease_again(self) -> None:
        self._lease_timer = None
        self.wake()

    # -- returns and the delivery limit -----------------------------------------------------
    def requeue(self, seqs: list[int]) -> None:
        """A consumer's channel closed or the consumer went: its messages are returned."""
        if seqs and not self.deleted:
            self._return(seqs)

    def reject(self, seqs: list[int], requeue: bool) -> None:
        if requeue:
            self._return(seqs)
        else:
            self._discard(seqs, dlx.REJECTED)
            self.wake()

    def _return(self, seqs: list[int]) -> None:
        counts = self.log.counts
        limit = self.args.delivery_limit
        back: list[int] = []
        over: list[int] = []
        pairs: list[tuple[int, int]] = []
        for seq, _ in self.bq.pending_messages(seqs):
            value = ((counts.get(seq, 0) >> 1) + 1) << 1
            if limit is not None and (value >> 1) > limit:
                over.append(seq)
            else:
                back.append(seq)
                pairs.append((seq, value))
        self.log.set_counts(pairs)
        if back:
            self.bq.requeue(back)
            self._ttl_dirty = True  # a requeued message may have expired meanwhile
        if over:
            self._discard(over, DELIVERY_LIMIT)
        self.wake()

    def _discard_ready(self, wanted: set[int]) -> None:
        """Ready messages found past the delivery limit at recovery: taken and discarded.
        They were held by consumers, so they sit at the head of the queue."""
        taken: list[int] = []
        skipped: list[int] = []
        while wanted:
            entry = self.bq.fetch(True)
            if entry is None:
                break
            (taken if entry[0] in wanted else skipped).append(entry[0])
            wanted.discard(entry[0])
        if skipped:
            self.bq.restore(skipped)
        if taken:
            self._discard(taken, DELIVERY_LIMIT)

    def _dead_letter(self, msg: Message, reason: str, seq: int = -1) -> bool:
        if self._dlx is not None and seq >= 0 and self.bq.pending_messages((seq,)):
            return self._dlx.send(seq, msg, reason)
        return super()._dead_letter(msg, reason, seq)

    # -- introspection ----------------------------------------------------------------------
    def online(self) -> list[str]:
        """The members that are running (a single node: itself)."""
        return [m for m in self.members if self.node_running(m)]

    def info(self) -> dict[str, Any]:
        out = super().info()
        positions = {self.home: self.log.durable_pos} if self.log is not None else {}
        shipped = 0
        if self.followers is not None:
            positions.update(self.followers.member_positions())
            shipped = self.followers.shipped_bytes
        out.update(leader=self.home, members=list(self.members), online=self.online(),
                   epoch=self.epoch, commit_position=self.commit_pos, positions=positions,
                   log_bytes_shipped=shipped,
                   messages_uncommitted=len(self._uncommitted),
                   messages_dlx=len(self._dlx.pending) if self._dlx is not None else 0)
        return out


class _AtLeastOnce:
    """x-dead-letter-strategy at-least-once: a dead-lettered message is published to the
    dead-letter exchange with confirms from its queues, and leaves this queue's log only once
    all of them confirmed it (until then it is in `pending`, and a crash brings it back to the
    queue). Not routed anywhere, or refused: sent again after DLX_RETRY_S. It is a publishing
    channel as the target queues see one (credit, confirms)."""

    def __init__(self, queue: QuorumQueue) -> None:
        self.queue = queue
        s = queue.vhost.node.settings if queue.vhost.node is not None else None
        initial, more = ((s.credit_flow_initial_credit, s.credit_flow_more_credit_after)
                         if s is not None else (400, 200))
        self.credit_flow = CreditFlow(self, initial, more)
        self.pending: dict[int, tuple[Message, str]] = {}  # seq -> (message, reason)
        self._out: dict[int, tuple[int, int]] = {}  # publish id -> (seq, queues to confirm)
        self._ids = 0
        self._retry: asyncio.TimerHandle | None = None
        self._stopped = False

    def send(self, seq: int, msg: Message, reason: str) -> bool:
        self.pending[seq] = (msg, reason)
        self.queue.bq.log_index.held.add(seq)  # its ack waits for the confirms
        self._publish(seq)
        return True

    def _publish(self, seq: int) -> None:
        q = self.queue
        msg, reason = self.pending[seq]
        exchange = q.vhost.exchanges.get(q.args.dlx or "")
        targets: list[Any] = []
        if exchange is not None:
            try:
                out = dlx.dead_letter(msg, q.name, reason, exchange.name, q.args.dlrk)
            except ValueError:
                log.error("dead-lettering failed, message kept", queue=q.name)
                self._later()
                return
            deaths = out.headers.get("x-death") or []
            out.decoded = None
            targets = [t for t in q.vhost.route(exchange, out) if not dlx.is_cycle(t.name, deaths)]
        if not targets:
            self._later()
            return
        self._ids += 1
        self._out[self._ids] = (seq, len(targets))
        for t in targets:
            t.post_publishes(self, [(out, self._ids)])

    def queue_confirmed(self, queue: Any, seqs: list[int], rejected: list[int]) -> None:
        done: list[int] = []
        for pid in seqs:
            slot = self._out.get(pid)
            if slot is None:
                continue
            if slot[1] <= 1:
                del self._out[pid]
                done.append(slot[0])
            else:
                self._out[pid] = (slot[0], slot[1] - 1)
        for pid in rejected:
            if self._out.pop(pid, None) is not None:
                self._later()
        if done and not self._stopped:
            for seq in done:
                self.pending.pop(seq, None)
            q = self.queue
            q.bq.log_index.held.difference_update(done)
            q.log.ack(done)
            q.log.end_batch()

    def publishes_lost(self, queue: Any, items: list[tuple[Message, int]]) -> None:
        for _, pid in items:
            if self._out.pop(pid, None) is not None:
                self._later()

    def _later(self) -> None:
        if self._retry is None and not self._stopped:
            self._retry = asyncio.get_running_loop().call_later(DLX_RETRY_S, self._again)

    def _again(self) -> None:
        self._retry = None
        waiting = {slot[0] for slot in self._out.values()}
        for seq in list(self.pending):
            if seq not in waiting:
                self._publish(seq)

    def stop(self) -> None:
        self._stopped = True
        if self._retry is not None:
            self._retry.cancel()


