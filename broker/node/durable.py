"""What survives a restart: wiring between the live topology and the disk.

Durable exchanges, queues, bindings, users, vhosts, permissions, policies and vhost limits go
to the definitions database as they change; durable queues get a queue index and a share of
the persistent message store; at start everything is read back in a fixed order: definitions
(policies before the queues and exchanges they apply to), the message store (which on a dirty
start asks the queue indexes for reference counts), then each durable queue's contents."""

from __future__ import annotations

import shutil
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from broker.policy import PolicyInvalid, parse_policy
from broker.queue.amqqueue import AMQQueue
from broker.queue.delay_queue import DelayQueue, delay_queue_name
from broker.queue.durability import LazyIndex, QueueDurability, StoreLink, StorePeer
from broker.queue.priority_queue import PriorityQueue
from broker.queue.quorum_log import MemberLog
from broker.queue.quorum_queue import QuorumQueue
from broker.queue.stream_queue import StreamQueue
from broker.queue.types import queue_class
from broker.queue.variable_queue import VariableQueue
from broker.routing.delayed import DelayedMessageExchange
from broker.routing.exchange import Exchange
from broker.store import layout
from broker.store.definitions import (
    BindingDef,
    Definitions,
    ExchangeDef,
    PolicyDef,
    QueueDef,
    TopicPermissionDef,
)
from broker.store.msg_store import MsgStore
from broker.store.queue_index import QueueIndex, msg_refs, remove_orphans
from broker.store.quorum_meta import META_FILE
from broker.store.stream_log import StreamLog, remove_orphan_streams

if TYPE_CHECKING:
    from broker.node import Node

DELAY_MARKER = "delayed"  # in a delay queue's index directory: vhost, exchange, delay

__all__ = ["Durable"]

log = structlog.get_logger("hare.durable")


class Durable:
    def __init__(self, node: Node) -> None:
        self.node = node
        s = node.settings
        root = Path(s.data_dir)
        self.root = root
        self.queues_root = root / layout.QUEUES
        self.streams_root = root / layout.STREAMS
        self.transient_root = root / layout.TRANSIENT_QUEUES
        self._transient_ids = 0
        self.definitions = Definitions(root / layout.DEFINITIONS)
        common: dict[str, Any] = {
            "file_size_limit": s.msg_store_file_size_limit,
            "gc_garbage_fraction": s.msg_store_gc_garbage_fraction,
            "gc_min_files": s.msg_store_gc_min_files,
        }
        self.persistent = MsgStore(
            root / layout.MSG_STORE_PERSISTENT, name="persistent", fsync=str(s.fsync), **common
        )
        self.transient = MsgStore(
            root / layout.MSG_STORE_TRANSIENT, name="transient", transient=True, **common
        )
        self._restoring = False
        self._members: weakref.WeakSet[MemberLog] = weakref.WeakSet()
        credit = (s.credit_flow_initial_credit, s.credit_flow_more_credit_after)
        self.persistent_peer = StorePeer("persistent", *credit)
        self.transient_peer = StorePeer("transient", *credit)

    # -- start and stop ---------------------------------------------------------------------
    async def start(self) -> None:
        segment_entries = self.node.settings.queue_index_segment_entries
        self._restoring = True
        try:
            self._restore_access()
            self._restore_params()
            # an index whose queue is gone (deleted, then a crash) must not keep bodies alive
            keep = [self.queue_dir(qd.vhost, qd.name) for qd in self.definitions.queues()]
            if self.node.cluster.clustered:
                # quorum queue members of this node's: the cluster's records say which are
                # still ours once it is read (QuorumCoordinator.drop_strays)
                keep += [p.parent for p in self.queues_root.glob(f"*/{META_FILE}")]
            delayed = self._delay_queues()
            keep += [self.queue_dir(v, delay_queue_name(x, d)) for v, x, d in delayed]
            remove_orphans(self.queues_root, keep)
            remove_orphan_streams(self.streams_root, [self.stream_dir(qd.vhost, qd.name)
                                                      for qd in self.definitions.queues()])
            shutil.rmtree(self.transient_root, ignore_errors=True)  # pages of a past run
            await self.persistent.start(
                refs=lambda: msg_refs(self.queues_root, segment_entries)
            )
            await self.transient.start()
            streams = self._restore_topology()
            for q in streams:  # each log recovers its tail in a thread, then the queue starts
                assert q.log is not None
                await q.log.open()
                q.start()
        finally:
            self._restoring = False

    async def stop(self) -> None:
        for vhost in self.node.vhosts.values():
            for held in vhost.delay_queues():
                held.close()
            for q in list(vhost.queues.values()):
                q.close()
                if isinstance(q, StreamQueue) and q.log is not None:
                    await q.log.close()
        for member in list(self._members):  # quorum queue followers (broker/cluster/quorum.py)
            member.close()
        await self.persistent.stop()
        await self.transient.stop()
        self.definitions.close()

    def _restore_access(self) -> None:
        node, s, db = self.node, self.node.settings, self.definitions
        first_boot = not db.vhosts()
        if first_boot:
            db.put_vhost(s.default_vhost)
            node.users.add_user(s.default_user, s.default_pass, tags=["administrator"])
            u = node.users.users[s.default_user]
            db.put_user(u.name, u.password_hash, u.tags)
            db.put_permission(s.default_user, s.default_vhost, ".*", ".*", ".*")
        for name in [*db.vhosts(), *s.vhosts]:
            node.add_vhost(name)
        for ud in db.users():
            node.users.add_user(ud.name, password_hash=ud.password_hash, tags=list(ud.tags))
        for p in db.permissions():
            node.users.set_permissions(p.user, p.vhost, p.configure, p.write, p.read)
        for t in db.topic_permissions():
            node.users.set_topic_permission(t.user, t.vhost, t.exchange, t.write, t.read)
        for user, name, value in db.user_limits():
            if user in node.users.users:
                node.users.set_limit(user, name, value)
        for us in s.users:  # the config file wins over what the database remembers
            node.users.add_user(us.name, password_hash=us.password_hash, tags=list(us.tags))
        for ps in s.permissions:
            node.users.set_permissions(ps.user, ps.vhost, ps.configure, ps.write, ps.read)

    def _restore_params(self) -> None:
        """Policies and limits, before the queues and exchanges they apply to."""
        node, db = self.node, self.definitions
        for pd in db.policies():
            vhost = node.vhosts.get(pd.vhost)
            if vhost is None:
                continue
            try:
                policy = parse_policy(pd.vhost, pd.name, pd.body, operator=pd.operator)
            except PolicyInvalid as exc:  # stored by a broker that accepted more
                log.warning("stored policy ignored", vhost=pd.vhost, policy=pd.name,
                            reason=exc.reason)
                continue
            vhost.params.restore_policy(policy)
        for name, limits in db.vhost_limits().items():
            vhost = node.vhosts.get(name)
            if vhost is not None:
                vhost.params.set_limits(limits)

    def _restore_topology(self) -> list[StreamQueue]:
        """Exchanges, queues (classic ones recovered and started; the streams returned to be
        opened and started) and bindings."""
        node, db = self.node, self.definitions
        streams: list[StreamQueue] = []
        for xd in db.exchanges():
            vhost = node.vhosts.get(xd.vhost)
            if vhost is None or xd.name in vhost.exchanges:
                continue
            ex = vhost.exchanges[xd.name] = Exchange(
                xd.name, xd.type, durable=True, auto_delete=xd.auto_delete,
                internal=xd.internal, arguments=dict(xd.arguments),
            )
            vhost.adopt_exchange(ex)
        recovered = 0
        for qd in db.queues():
            vhost = node.vhosts.get(qd.vhost)
            if vhost is None or qd.name in vhost.queues:
                continue
            if qd.arguments.get("x-queue-type") == "stream":
                stream = StreamQueue(vhost, qd.name, arguments=dict(qd.arguments))
                stream.log = self._stream_log(stream)
                vhost.queues[qd.name] = stream
                vhost.params.apply_to_queue(stream)
                streams.append(stream)
                continue
            q = queue_class(qd.arguments)(vhost, qd.name, durable=True,
                                          auto_delete=qd.auto_delete,
                                          arguments=dict(qd.arguments))
            self.attach(q)
            if isinstance(q, QuorumQueue) and node.cluster.clustered:
                # a member of a cluster's quorum queue: the cluster's record says whether it
                # leads (broker/cluster/quorum.py); recovering here would write a batch of
                # this node's own and claim a position no leader gave it
                pass
            else:
                recovered += q.recover()
            vhost.queues[qd.name] = q
            vhost.params.apply_to_queue(q)
            q.start()
        for vname, xname, delay in self._delay_queues():
            vhost = node.vhosts.get(vname)
            ex = vhost.exchanges.get(xname) if vhost is not None else None
            if isinstance(ex, DelayedMessageExchange) and delay not in ex.held:
                dq = DelayQueue(vhost, xname, delay, durable=True)  # type: ignore[arg-type]
                self.attach(dq)
                recovered += dq.recover()
                ex.held[delay] = dq
                dq.start()
        for vhost in node.vhosts.values():
            vhost.params.apply_all()  # the predeclared exchanges too
        for bd in db.bindings():
            vhost = node.vhosts.get(bd.vhost)
            if vhost is None:
                continue
            src = vhost.exchanges.get(bd.source)
            dst: object | None = (
                vhost.queues.get(bd.destination) if bd.destination_type == "queue"
                else vhost.exchanges.get(bd.destination)
            )
            if src is not None and dst is not None:
                src.bind(dst, bd.routing_key, dict(bd.arguments))
        log.info("definitions restored", exchanges=len(db.exchanges()),
                 queues=len(db.queues()), bindings=len(db.bindings()), messages=recovered)
        return streams

    def _delay_queues(self) -> list[tuple[str, str, int]]:
        """(vhost, exchange, delay) of each durable delay queue on disk whose durable
        delayed-message exchange still exists (its marker names it: queue dirs are hashes)."""
        exchanges = {(xd.vhost, xd.name) for xd in self.definitions.exchanges()
                     if xd.type == DelayedMessageExchange.type_name}
        found = []
        for marker in self.queues_root.glob(f"*/{DELAY_MARKER}"):
            try:
                vhost, exchange, delay = marker.read_text().split("\0")
                entry = (vhost, exchange, int(delay))
            except (OSError, ValueError):
                continue
            if entry[:2] in exchanges:
                found.append(entry)
        return found

    # -- queues -----------------------------------------------------------------------------
    def queue_dir(self, vhost: str, name: str) -> Path:
        return self.queues_root / layout.queue_dir_name(vhost, name)

    def stream_dir(self, vhost: str, name: str) -> Path:
        return self.streams_root / layout.queue_dir_name(vhost, name)

    def _stream_log(self, q: StreamQueue) -> StreamLog:
        return StreamLog(self.stream_dir(q.vhost.name, q.name), name=f"{q.vhost.name}/{q.name}",
                         fsync=str(self.node.settings.fsync))

    def attach(self, q: AMQQueue) -> None:
        """Give a queue its variable queue and disk side. Durable queues keep their index
        under queues/ (recovered at start); the others page into transient_queues/ (wiped at
        start) and the transient store."""
        s = self.node.settings
        if isinstance(q, QuorumQueue):
            self.attach_member(q)
            return
        persistent = _persisted(q)
        if persistent:
            directory = self.queue_dir(q.vhost.name, q.name)
        else:
            self._transient_ids += 1
            directory = self.transient_root / f"{self._transient_ids:x}"
        embed = s.queue_index_embed_msgs_below
        segment = s.queue_index_segment_entries
        index = LazyIndex(
            lambda: QueueIndex(directory, embed_below=embed, segment_entries=segment), embed
        )
        durability = QueueDurability(
            q, index, self.persistent, persistent=persistent, fsync=str(s.fsync)
        )
        q.durability = durability
        transient = StoreLink(q, self.transient, self.transient_peer, None)
        q.store_peers = (self.persistent_peer, self.transient_peer)
        store = (StoreLink(q, self.persistent, self.persistent_peer, durability)
                 if persistent else transient)

        def variable_queue(seq_base: int) -> VariableQueue:
            return VariableQueue(
                store,
                index,
                transient_store=transient,
                durable=persistent,
                client=durability if persistent else None,
                segment_entries=segment,
                embed_transient=not persistent,
                seq_base=seq_base,
            )

        max_priority = q.args.max_priority
        q.bq = PriorityQueue(max_priority, variable_queue) if max_priority else variable_queue(0)

    def member_log(self, vhost: str, name: str) -> MemberLog:
        """A quorum queue member's log on this node (its index directory, as a durable
        queue's, and the persistent store)."""
        s = self.node.settings
        member = MemberLog(self.queue_dir(vhost, name), self.persistent, name=f"{vhost}/{name}",
                           embed_below=s.queue_index_embed_msgs_below,
                           segment_entries=s.queue_index_segment_entries, fsync=str(s.fsync))
        self._members.add(member)
        return member

    def attach_member(self, q: QuorumQueue) -> None:
        """A quorum queue's member log; a new queue's (not restored from disk) is created
        now, its first state written before declare-ok."""
        member = self.member_log(q.vhost.name, q.name)
        q.attach(member, self.node.settings.queue_index_segment_entries)
        if not self._restoring:
            member.create(epoch=max(q.epoch, 1))

    # -- changes from the vhosts ------------------------------------------------------------
    def changed(self, vhost: str, what: str, obj: Any) -> None:
        if self._restoring:
            return
        db = self.definitions
        if what == "put_exchange" and obj.durable:
            db.put_exchange(ExchangeDef(vhost, obj.name, obj.type, True, obj.auto_delete,
                                        obj.internal, dict(obj.arguments)))
        elif what == "delete_exchange" and obj.durable:
            db.delete_exchange(vhost, obj.name)
        elif what == "put_queue" and _persisted(obj):
            db.put_queue(QueueDef(vhost, obj.name, True, obj.auto_delete, False,
                                  dict(obj.arguments)))
        elif what == "delete_queue" and _persisted(obj):
            db.delete_queue(vhost, obj.name)
        elif what == "put_policy":
            db.put_policy(PolicyDef(vhost, obj.name, obj.operator, obj.body()))
        elif what == "delete_policy":
            db.delete_policy(vhost, obj.name, obj.operator)
        elif what == "put_limits":
            db.put_vhost_limits(vhost, obj)
        elif what == "put_vhost":
            db.put_vhost(obj)
        elif what == "delete_vhost":
            db.delete_vhost(obj)
        elif what == "put_user":
            db.put_user(obj.name, obj.password_hash, obj.tags)
        elif what == "delete_user":
            db.delete_user(obj.name)
        elif what == "put_permission":
            db.put_permission(obj[0], vhost, *obj[1:])
        elif what == "delete_permission":
            db.delete_permission(obj[0], vhost)
        elif what == "put_topic_permission":
            db.put_topic_permission(TopicPermissionDef(obj[0], vhost, *obj[1:]))
        elif what == "delete_topic_permission":
            db.delete_topic_permissions(obj[0], vhost, obj[1])
        elif what == "put_user_limit":
            db.put_user_limit(*obj)
        elif what == "delete_user_limit":
            db.delete_user_limit(*obj)
        elif what in ("put_binding", "delete_binding"):
            src, dst, key, args = obj
            if not src.durable or not getattr(dst, "durable", False):
                return
            if isinstance(dst, Exchange):
                kind = "exchange"
            elif _persisted(dst):
                kind = "queue"
            else:
                return
            bd = BindingDef(vhost, src.name, dst.name, kind, key, dict(args or {}))
            if what == "put_binding":
                db.put_binding(bd)
            else:
                db.delete_binding(bd)

    def new_queue(self, q: AMQQueue | StreamQueue) -> None:
        """A queue was declared: give it its backing queue (a stream: its log, empty)."""
        if isinstance(q, StreamQueue):
            if q.log is None:
                q.log = self._stream_log(q)
                q.log.open_now()
        elif q.durability is None:
            self.attach(q)
            if isinstance(q, DelayQueue) and q.durable:
                d = self.queue_dir(q.vhost.name, q.name)
                d.mkdir(parents=True, exist_ok=True)
                (d / DELAY_MARKER).write_text(f"{q.vhost.name}\0{q.exchange}\0{q.delay}")



def _persisted(q: object) -> bool:
    """A durable queue of this node's (a cluster's queues homed elsewhere are not ours)."""
    return isinstance(q, AMQQueue | StreamQueue) and q.durable and q.exclusive_owner is None
