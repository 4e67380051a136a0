"""A node of a cluster whose membership and metadata live in etcd.

Keys, all under `/hare/<cluster_name>/` (docs/CLUSTER.md):
  nodes/<name>, known/<name>   membership (broker/cluster/membership.py)

One watch over the whole prefix keeps this node's view current; when the stream breaks it is
resumed from the last revision seen (or everything is read again when etcd compacted it)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import time
import uuid
from collections.abc import Awaitable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from broker.cluster.etcd import Etcd, EtcdUnavailable, WatchCompacted, WatchEvent, sleep_backoff
from broker.cluster.link import Link, LinkError, Links
from broker.cluster.local import rendezvous, self_card
from broker.cluster.membership import Member, Membership
from broker.cluster.metadata import ClusterMetadata, cluster_root
from broker.cluster.quorum import QuorumCoordinator, choose_members, is_quorum
from broker.cluster.remote_queue import RemoteQueue
from broker.queue.amqqueue import AMQQueue
from broker.queue.stream_queue import StreamQueue
from broker.queue.types import queue_class
from broker.server.direct_reply import reply_node
from broker.store import layout
from broker.store.definitions import decode_table, encode_table

if TYPE_CHECKING:
    from broker.message import Message
    from broker.node import Node
    from broker.queue.consumer import Consumer
    from broker.queue.contract import QueueType
    from broker.queue.quorum_queue import QuorumQueue
    from broker.vhost import VHost

__all__ = ["ETCD_ALARM", "EtcdCluster", "node_id"]

log = structlog.get_logger("hare.cluster")

ETCD_ALARM = "etcd unreachable"


def node_id(data_dir: Path) -> str:
    """This data directory's identity: the same node across restarts and re-created
    containers that keep the volume; a different one for another directory."""
    path = Path(data_dir) / layout.NODE_ID
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        ident = uuid.uuid4().hex
        path.write_text(ident + "\n")
        return ident


class EtcdCluster:
    clustered = True

    def __init__(self, node: Node) -> None:
        s = node.settings
        self.node = node
        self.name = s.cluster_name
        self.root = cluster_root(s.cluster_name)
        self.etcd = Etcd([u.strip() for u in s.cluster_etcd.split(",") if u.strip()],
                         token=s.cluster_etcd_token)
        self._started_ms = 0
        self.membership = Membership(
            self.etcd, self.root, node.name, node_id(s.data_dir), s.cluster_lease_ttl_s,
            lambda: {**self_card(node, self._started_ms), "link_port": self.links.port,
                     "link_host": s.cluster_link_advertise or s.cluster_link_host
                     or socket.gethostname()},
        )
        self.metadata = ClusterMetadata(node, self.etcd, self.root)
        self.links = Links(self)
        self.quorum = QuorumCoordinator(self)
        self.membership.on_change = self._node_changed
        self.membership.on_rejoined = lambda: self.quorum.abdicate_all("lease lost")
        self.revision = 0  # the last etcd revision applied
        self.etcd_ok = True
        self._tasks: list[asyncio.Task[None]] = []
        self._restarting = False  # sync(): taking the cluster's state after our own restore
        self._card_task: asyncio.Task[None] | None = None

    # -- life cycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._started_ms = self.membership.started_ms
        await self.links.start()  # bound before we join: our card names its port
        try:
            await self.membership.join()
            kvs, _ = await self.etcd.get_prefix(self.root)
            self.membership.load([kv for kv in kvs if self._is_membership(kv.key)])
        except EtcdUnavailable as exc:
            await self.links.stop()
            await self.etcd.close()
            raise EtcdUnavailable(f"cannot reach etcd at {self.node.settings.cluster_etcd}: "
                                  f"{exc}") from exc
        except BaseException:
            await self.links.stop()
            await self.etcd.close()
            raise
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.membership.keep_alive(self._etcd_reachable),
                             name="cluster:lease"),
        ]
        self.node.alarms.subscribe(self._alarm_changed)
        self.membership.on_card = self._peer_alarms
        log.info("joined cluster", cluster=self.name, node=self.node.name,
                 running=sorted(self.membership.running))

    async def sync(self) -> None:
        """After the node restored what it kept on disk: take the cluster's definitions (or
        bring ours, when the cluster has none yet), then follow its changes."""
        self._restarting = True
        try:
            kvs, _ = await self.etcd.get_prefix(self.metadata.prefix)
            if not kvs:
                await self.metadata.seed()
            else:
                await self.metadata.rehome(kvs, self.membership.old_names)
            await self._read_all()
        except EtcdUnavailable as exc:
            log.warning("etcd unreachable at start: serving the definitions kept on disk",
                        error=str(exc))
            self._etcd_reachable(False)
            self.metadata.writable = False
        self._restarting = False
        self.metadata.started()
        self._tasks.append(asyncio.get_running_loop().create_task(self._watch(),
                                                                  name="cluster:watch"))
        for peer in self.membership.running:
            self.links.node_up(peer)

    async def stop(self) -> None:
        if self._card_task is not None:
            self._tasks.append(self._card_task)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.quorum.stop()
        await self.membership.leave()
        await self.links.stop()
        await self.etcd.close()

    # -- the view of etcd -------------------------------------------------------------------
    async def _read_all(self) -> None:
        kvs, revision = await self.etcd.get_prefix(self.root)
        self.membership.load([kv for kv in kvs if self._is_membership(kv.key)])
        self.quorum.load_votes([kv for kv in kvs if kv.key.startswith(self.quorum.prefix)])
        self.metadata.load([kv for kv in kvs if kv.key.startswith(self.metadata.prefix)])
        self.revision = revision
        self.quorum.drop_strays()

    def caught_up(self, timeout_s: float = 1.0) -> Awaitable[bool]:
        return self._caught_up(self.revision, timeout_s)  # the revision the refusal saw

    async def _caught_up(self, before: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        try:
            # an empty range: only its header's revision is wanted; an etcd that does not
            # answer costs a read at most timeout_s (then it answers from what it has)
            _, target = await asyncio.wait_for(
                self.etcd.get_prefix(self.root + "caught-up/"), timeout_s)
        except (EtcdUnavailable, TimeoutError):
            return False
        # etcd's revision counts every prefix: one another cluster bumped never comes to our
        # watch, so the wait is bounded (a multi-worker server's meta store is ours alone)
        while self.revision < target and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return self.revision > before

    def _is_membership(self, key: str) -> bool:
        return key.startswith((self.membership.nodes_prefix, self.membership.known_prefix))

    async def _watch(self) -> None:
        attempt = 0
        while True:
            try:
                async for events in self.etcd.watch(self.root, self.revision + 1):
                    attempt = 0
                    self._apply(events)
            except WatchCompacted:
                log.warning("etcd history compacted: reading the cluster state again")
                with contextlib.suppress(EtcdUnavailable):
                    await self._read_all()
            except EtcdUnavailable as exc:
                log.debug("etcd watch broke", error=str(exc))
            if not self.etcd_ok or not self.metadata.writable:
                # back from an outage: what changed meanwhile may be compacted away
                with contextlib.suppress(EtcdUnavailable):
                    await self._read_all()
            await sleep_backoff(attempt)
            attempt += 1

    def _apply(self, events: list[WatchEvent]) -> None:
        for event in events:
            key = event.kv.key
            if key.startswith(self.metadata.prefix):
                self.metadata.apply_event(event.kv, event.kind == "delete")
            elif key.startswith(self.quorum.prefix):
                self.quorum.vote_event(event.kv, event.kind == "delete")
            elif self._is_membership(key):
                self.membership.apply(event.kv, deleted=event.kind == "delete")
            self.revision = max(self.revision, event.revision)

    # -- alarms -----------------------------------------------------------------------------
    def _etcd_reachable(self, ok: bool) -> None:
        self.metadata.writable = ok
        if ok == self.etcd_ok:
            return
        self.etcd_ok = ok
        if ok:
            log.info("alarm cleared", resource=ETCD_ALARM)
        else:
            log.warning("alarm raised", resource=ETCD_ALARM)

    def _alarm_changed(self, resource: str, raised: bool) -> None:
        """Our resource alarms are on our card, so every node's cluster_status shows them."""
        if self._card_task is None or self._card_task.done():
            self._card_task = asyncio.get_running_loop().create_task(self._publish_card())

    def _peer_alarms(self) -> None:
        """A resource alarm on any running node blocks the publishers of every node (as in a
        RabbitMQ cluster): a node's queues take the others' publishes over the link, so one
        node's memory is everyone's concern; and a multi-worker hare-server's one watermark
        is its workers' shares together."""
        raised = {r for name, card in self.membership.running.items()
                  if name != self.node.name for r in card.get("alarms", [])}
        self.node.set_peer_alarms(frozenset(raised))

    async def _publish_card(self) -> None:
        with contextlib.suppress(EtcdUnavailable):
            await self.membership.refresh_card()

    # -- the seam ---------------------------------------------------------------------------
    def members(self) -> list[Member]:
        out = self.membership.members()
        for m in out:
            if m.name == self.node.name:
                m.card = self_card(self.node, self._started_ms)
        return out

    def alarms(self) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for m in self.members():
            if m.running:
                out.extend({"node": m.name, "resource": r} for r in m.card.get("alarms", []))
        if not self.etcd_ok:
            out.append({"node": self.node.name, "resource": ETCD_ALARM})
        return out

    # -- metadata (the seam's write side) ---------------------------------------------------
    def changed(self, vhost: str | None, what: str, obj: object) -> None:
        self.metadata.changed(vhost, what, obj)

    async def check_queue_declare(self, vhost: VHost, name: str, *, durable: bool,
                                  exclusive: bool, auto_delete: bool,
                                  arguments: dict[str, Any], server_named: bool) -> None:
        vhost.check_new_queue(name, arguments, durable=durable, exclusive=exclusive,
                              auto_delete=auto_delete, server_named=server_named)
        home = self.node.name if exclusive else self._locate(arguments)
        record = {"vhost": vhost.name, "name": name, "durable": durable,
                  "auto_delete": auto_delete, "exclusive": exclusive,
                  "arguments": encode_table(arguments), "node": home}
        if arguments.get("x-queue-type") == "quorum":
            await self._declare_quorum(vhost, record, arguments)
            return
        if await self.metadata.claim("queues", (vhost.name, name), record) is not None:
            return  # another node's declare won: the channel compares against it
        if home != self.node.name:
            # the home node creates it before declare-ok: a publish right after the
            # declare-ok must find it there (the link keeps this call's order)
            try:
                await self.link(home).call({"op": "ensure", "record": record})
            except LinkError:
                log.warning("home node did not confirm the new queue", queue=name, home=home)
            with self.metadata.quiet():
                self.place_queue(vhost, record)

    async def _declare_quorum(self, vhost: VHost, record: dict[str, Any],
                              arguments: dict[str, Any]) -> None:
        """A new quorum queue: its members chosen (x-quorum-initial-group-size, default 3,
        at most the running nodes; the least loaded), claimed with epoch 1, and created on
        each member before declare-ok - the leader first, so the others find it when they
        ask for their copy."""
        size = arguments.get("x-quorum-initial-group-size") or (
            self.node.settings.quorum_initial_group_size)
        reachable = [n for n in self.membership.running
                     if n == self.node.name or self.links.get(n)]
        load: dict[str, int] = {}
        for _key, r in self.quorum.records.items():
            for member in r["members"]:
                load[member] = load.get(member, 0) + 1
        servers = {n: self.membership.running.get(n, {}).get("server", n) for n in reachable}
        servers[self.node.name] = self.node.server
        record["members"] = choose_members(record["node"], reachable, int(size), load, servers)
        record["epoch"] = 1
        if await self.metadata.claim("queues", (vhost.name, record["name"]), record) is not None:
            return  # another node's declare won: the channel compares against it
        for member in record["members"]:
            if member == self.node.name:
                with self.metadata.quiet():
                    self.place_queue(vhost, record, new=True)
                continue
            try:
                await self.link(member).call({"op": "ensure", "record": record, "new": True})
            except LinkError:
                log.warning("quorum member did not confirm the new queue", queue=record["name"],
                            member=member)
        if self.node.name not in record["members"]:
            with self.metadata.quiet():
                self.place_queue(vhost, record)

    def _locate(self, arguments: dict[str, Any]) -> str:
        """The home of a new queue: the declaring node (RabbitMQ's client-local), or with
        x-queue-leader-locator = balanced (or the setting queue_master_locator) the running
        node with the fewest queues. The setting's auto is client-local for the server: a
        client sees one node however many workers it has, so with connection placement (its
        connections follow their queues) the queue goes to the worker with the fewest, and
        one connection's declares spread over every core."""
        locator = arguments.get("x-queue-leader-locator") or arguments.get(
            "x-queue-master-locator") or self.node.settings.queue_master_locator
        if isinstance(locator, bytes):
            locator = locator.decode()
        running: Collection[str] = self.membership.running
        handover = self.node.handover
        if locator == "auto" and handover is not None:
            running = [n for n in handover.siblings.names if n in running]
        elif locator not in ("balanced", "min-masters"):
            return self.node.name
        counts = {name: 0 for name in running}
        counts[self.node.name] = 0
        for v in self.node.vhosts.values():
            for q in v.queues.values():
                if q.home in counts:
                    counts[q.home] += 1
        reachable = [n for n in counts if n == self.node.name or self.links.get(n)]
        return min(reachable, key=lambda n: (counts[n], n))

    async def check_exchange_declare(self, vhost: VHost, name: str, type_: str, *,
                                     durable: bool, auto_delete: bool, internal: bool,
                                     arguments: dict[str, Any]) -> None:
        vhost.check_new_exchange(name, type_, arguments)
        record = {"vhost": vhost.name, "name": name, "type": type_, "durable": durable,
                  "auto_delete": auto_delete, "internal": internal,
                  "arguments": encode_table(arguments)}
        await self.metadata.claim("exchanges", (vhost.name, name), record)

    async def check_writable(self) -> None:
        await self.metadata.check_writable()

    async def commit(self) -> None:
        await self.metadata.commit()

    async def change_queue_members(self, vhost: str, name: str, *, add: str | None,
                                   remove: str | None) -> dict[str, Any]:
        await self.metadata.check_writable()
        return await self.quorum.change_members(vhost, name, add=add, remove=remove)

    def place_queue(self, vhost: VHost, record: dict[str, Any], *, new: bool = False) -> None:
        """A queue of the cluster's, as this node holds it: the queue itself when it is
        homed here, else a RemoteQueue that forwards to its home node. A quorum queue's
        record goes to the quorum coordinator (leader, follower, or neither)."""
        if is_quorum(record):
            self.quorum.place(vhost, record, new=new)
            return
        name = record["name"]
        existing = vhost.queues.get(name)
        q: QueueType
        if record["node"] == self.node.name:
            if isinstance(existing, AMQQueue | StreamQueue):
                return
            if self._restarting and (record["exclusive"] or not record["durable"]):
                # ours from before a restart: an exclusive queue's connection is gone, and a
                # non-durable queue does not outlive its node (RabbitMQ deletes both)
                self.metadata.forget_queue(vhost.name, name)
                return
            arguments = decode_table(record["arguments"])
            q = queue_class(arguments)(vhost, name, durable=record["durable"],
                                       auto_delete=record["auto_delete"], arguments=arguments)
            durable = self.node.durable
            if durable is not None:
                durable.new_queue(q)
        else:
            if isinstance(existing, RemoteQueue) and existing.home == record["node"]:
                return
            q = RemoteQueue(vhost, record, self)
        if existing is not None:
            existing.shutdown()
        vhost.queues[name] = q
        vhost.params.apply_to_queue(q)
        if isinstance(q, AMQQueue | StreamQueue):
            q.start()
        vhost._changed("put_queue", q)

    def place_remote(self, vhost: VHost, record: dict[str, Any], existing: Any) -> None:
        """The queue as a RemoteQueue to its home node (a quorum queue: its leader)."""
        if isinstance(existing, RemoteQueue) and existing.home == record["node"]:
            existing.update(record)
            return
        self.install_queue(vhost, RemoteQueue(vhost, record, self), existing)

    def install_queue(self, vhost: VHost, q: Any, existing: Any) -> None:
        """`q` replaces `existing` (the same queue, another role on this node): the
        bindings lead to it, and the consumers of the old one are cancelled (basic.cancel,
        as RabbitMQ's when a queue's leader goes: clients consume again)."""
        if existing is not None and existing is not q:
            self._cancel_consumers(existing)
            vhost.move_bindings(existing, q)
            existing.shutdown()
        vhost.queues[q.name] = q
        vhost.params.apply_to_queue(q)
        if isinstance(q, AMQQueue):
            q.start()
        with self.metadata.quiet():
            vhost._changed("put_queue", q)

    def uninstall_queue(self, vhost: VHost, q: QuorumQueue) -> None:
        """A quorum queue leader steps down: its consumers are cancelled and it stops, its
        member log kept for the replica that takes it."""
        self._cancel_consumers(q)
        q.shutdown()
        q.log.on_durable = None
        q.log.ship_to(None)

    def _cancel_consumers(self, q: Any) -> None:
        for consumer in list(q.consumers):
            q.remove_consumer(consumer)
            consumer.channel.consumer_cancelled_by_queue(consumer)

    def lease_valid(self) -> bool:
        """Our lease holds now (a quorum queue leader delivers only then)."""
        return time.monotonic() < self.membership.lease_until

    def node_running(self, name: str) -> bool:
        return self.membership.is_running(name)

    # -- nodes and links ---------------------------------------------------------------------
    def _node_changed(self, name: str, running: bool) -> None:
        if running:
            self.links.node_up(name)
        else:
            self.links.node_down(name)
            self._drop_exclusive_of(name)
        self.quorum.node_changed(name, running)
        self.node.events.nodes_changed.notify((name, running))

    def _drop_exclusive_of(self, name: str) -> None:
        """A node that went down took its connections, so its exclusive queues are gone:
        the first node to see it deletes them from the cluster (idempotent)."""
        for vhost in list(self.node.vhosts.values()):
            for q in list(vhost.queues.values()):
                if isinstance(q, RemoteQueue) and q.home == name and q.exclusive_owner:
                    vhost.delete_queue(q)

    def link_up(self, peer: str) -> None:
        """A link came up: quorum queue followers ask their leader there for a copy."""
        self.quorum.link_up(peer)

    def link_down(self, peer: str) -> None:
        self.quorum.link_down(peer)

    def remote_queue(self, vhost: str, name: str) -> RemoteQueue | None:
        v = self.node.vhosts.get(vhost)
        q = v.queues.get(name) if v is not None else None
        return q if isinstance(q, RemoteQueue) else None

    def remote_queues_on(self, peer: str) -> list[RemoteQueue]:
        return [q for v in self.node.vhosts.values() for q in v.queues.values()
                if isinstance(q, RemoteQueue) and q.home == peer]

    def consumer_gone(self, consumer: Consumer) -> None:
        """Our consumer of a queue on another node lost it (node down, queue deleted):
        basic.cancel to the client, as RabbitMQ does."""
        q = consumer.queue
        with contextlib.suppress(ValueError):
            q.consumers.remove(consumer)
        consumer.channel.consumer_cancelled_by_queue(consumer)

    async def ask_peers(self, op: str, message: dict[str, Any], *,
                        same_server: bool = False) -> list[dict[str, Any]]:
        async def ask(link: Link) -> dict[str, Any] | None:
            try:
                return await link.call({**message, "op": op})
            except LinkError:
                return None  # down or slow: its part is left out, the rest is answered

        running = self.membership.running
        peers = [x for x in (self.links.get(n) for n in running if n != self.node.name
                             and (not same_server
                                  or running[n].get("server", n) == self.node.server))
                 if x is not None]
        answers = await asyncio.gather(*(ask(x) for x in peers))
        return [a for a in answers if a is not None]

    def runner(self, key: str, *, same_server: bool = False) -> str:
        running = self.membership.running
        nodes = [n for n in running if not same_server
                 or running[n].get("server", n) == self.node.server]
        return rendezvous(key, [*{*nodes, self.node.name}])

    async def settled(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (waiting := self.quorum.unled_alone()) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if waiting:
            log.warning("quorum queues not led yet at start", queues=[k[1] for k in waiting])

    def _reply_link(self, name: str) -> Link | None:
        node = reply_node(name)
        return self.links.get(node) if node and node != self.node.name else None

    def forward_reply(self, msg: Message) -> None:
        link = self._reply_link(msg.routing_key)
        if link is not None:
            link.control({"op": "dreply", "ex": msg.exchange, "rk": msg.routing_key,
                          "props": base64.b64encode(msg.props).decode(),
                          "body": base64.b64encode(msg.body).decode()})

    async def reply_alive(self, name: str) -> bool:
        link = self._reply_link(name)
        if link is None:
            return False
        try:
            return bool((await link.call({"op": "dreply_alive", "name": name})).get("alive"))
        except LinkError:
            return False

    def link(self, peer: str) -> Link:
        link = self.links.get(peer)
        if link is None:
            raise LinkError(f"no link to {peer}")
        return link
