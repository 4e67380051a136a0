"""Quorum queues in a cluster: where each member is, who leads, elections and membership, on
etcd (docs/CLUSTER.md, "Replicated queues"). No consensus code of Hare's own: a leader is
named by one etcd transaction on the queue's record, fenced by the record's epoch.

A quorum queue's record (the `queues` family) has `members` (the leader first when it was
written) and `epoch` beside `node`, its leader. On every node the coordinator places the
record: the leader holds the QuorumQueue (broker/queue/quorum_queue.py) with a
LeaderFollowers; every other member holds a Replica (its member log, following the leader);
every other node a RemoteQueue to the leader, as for any queue homed elsewhere.

Elections. A leader leads only in the process that became leader: a node that finds itself
named leader at start (it restarted), whose lease expired, or that a follower fenced,
abdicates. A member votes when the record's leader is not leading - not running for the
cluster, abdicated, or another member voted already - by raising its own fence past the
record's epoch (it refuses that leader's batches from then on) and putting
`qstate/<vhost>/<queue>/<node>` = its (last epoch, position) under its own lease. Once a
majority of the members voted for the record's epoch, the voter with the highest (last epoch,
position, name) makes one transaction: the record unchanged since it read it -> itself as
`node`, `epoch` + 1, and the votes deleted. A majority that confirmed a message and a majority
that voted share a member, so the winner holds every confirmed message. A member without its
data (lost disk, new member) does not vote until a leader has copied the queue to it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from typing import TYPE_CHECKING, Any

import structlog

from broker.cluster.etcd import Etcd, EtcdUnavailable, KeyValue
from broker.cluster.families import record_key
from broker.cluster.link_codec import decode_log
from broker.cluster.quorum_leader import LeaderFollowers
from broker.cluster.quorum_replica import Replica
from broker.queue.quorum_queue import QuorumQueue
from broker.store import layout
from broker.store.definitions import decode_table
from broker.store.quorum_meta import META_FILE

if TYPE_CHECKING:
    from broker.cluster.etcd_cluster import EtcdCluster
    from broker.cluster.link import Link
    from broker.vhost import VHost

__all__ = ["QuorumCoordinator", "choose_members", "is_quorum"]

log = structlog.get_logger("hare.quorum")

Key = tuple[str, str]


def is_quorum(record: dict[str, Any]) -> bool:
    return "members" in record


def choose_members(leader: str, candidates: list[str], size: int, load: dict[str, int],
                   server: dict[str, str] | None = None) -> list[str]:
    """`size` members, the leader first, the others the least loaded of `candidates`
    (quorum queue members per node: RabbitMQ's balanced placement), at most one per server
    (`server`: node -> the hare-server it runs in) while the candidates span several: the
    workers of one server share its machine and disk, so a second member there survives
    nothing the first would not. Candidates all on one server: as many as asked."""
    def where(n: str) -> str:
        return (server or {}).get(n, n)

    others = sorted((n for n in candidates if n != leader), key=lambda n: (load.get(n, 0), n))
    if len({where(n) for n in [leader, *others]}) > 1:
        used = {where(leader)}
        spread = []
        for n in others:
            if where(n) not in used:
                used.add(where(n))
                spread.append(n)
        others = spread
    return [leader, *others[:max(size, 1) - 1]]


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


class QuorumCoordinator:
    def __init__(self, cluster: EtcdCluster) -> None:
        self.cluster = cluster
        self.node = cluster.node
        self.me = cluster.node.name
        self.prefix = cluster.root + "qstate/"
        self.replicas: dict[Key, Replica] = {}
        self.records: dict[Key, dict[str, Any]] = {}
        self.votes: dict[Key, dict[str, dict[str, Any]]] = {}  # qstate entries seen
        self.won: dict[Key, int] = {}  # epochs this process was made leader of
        self._voted: dict[Key, int] = {}  # the record epoch we voted about
        self._electing: set[Key] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    def unled_alone(self) -> list[Key]:
        """The quorum queues whose only member is this node and that no process of it leads
        yet: after a restart each waits for its own election (a vote and one transaction)."""
        return [key for key, record in self.records.items()
                if record["members"] == [self.me]
                and self.won.get(key) != int(record["epoch"])]

    # -- placing records ------------------------------------------------------------------------
    def place(self, vhost: VHost, record: dict[str, Any], *, new: bool = False) -> None:
        key = (vhost.name, record["name"])
        self.records[key] = record
        members, leader, epoch = record["members"], record["node"], int(record["epoch"])
        existing = vhost.queues.get(record["name"])
        mine = self.me in members
        if new and mine:
            self.won[key] = max(self.won.get(key, 0), epoch)
        if mine and leader == self.me and self.won.get(key) == epoch:
            if isinstance(existing, QuorumQueue) and existing.epoch == epoch:
                existing.members = list(members)
                existing.followers_moved()
                return
            self._lead(vhost, record, existing, new=new)
            return
        if isinstance(existing, QuorumQueue):
            self._abdicate(vhost, existing)
            existing = vhost.queues.get(record["name"])
            if not mine:
                # removed from the members while leading: the others elect only once they
                # know this process stopped delivering (this mark, or its lease gone)
                self._spawn(self._mark_stopped(key, epoch))
        if mine:
            replica = self._replica(key, new=new)
            if leader != self.me:
                replica.follow(leader, epoch)
            else:
                replica.stop_following()
        else:
            self.drop_replica(key)
        self.cluster.place_remote(vhost, record, existing)
        self._check_election(key)

    def _replica(self, key: Key, *, new: bool = False) -> Replica:
        replica = self.replicas.get(key)
        if replica is None:
            durable = self.node.durable
            assert durable is not None
            member = durable.member_log(*key)
            if new:
                member.create(epoch=int(self.records[key]["epoch"]))
            replica = self.replicas[key] = Replica(self, key[0], key[1], member)
        elif new and replica.member.empty() and not replica.voter:
            # the record reached us before the declare's own call: nothing held, nothing
            # ever answered, so it may vote from the start like the others
            replica.member.create(epoch=int(self.records[key]["epoch"]))
            replica.state = "idle"
        return replica

    def drop_replica(self, key: Key, *, delete: bool = True) -> None:
        replica = self.replicas.pop(key, None)
        if replica is not None:
            replica.stop_following()
            if delete:
                replica.member.delete()
            else:
                replica.member.close()

    def forget(self, key: Key) -> None:
        """The queue was deleted: this node's member goes with it."""
        self.records.pop(key, None)
        self.votes.pop(key, None)
        self.won.pop(key, None)
        self.drop_replica(key)

    # -- leading --------------------------------------------------------------------------------
    def _lead(self, vhost: VHost, record: dict[str, Any], existing: Any, *, new: bool) -> None:
        key = (vhost.name, record["name"])
        epoch = int(record["epoch"])
        durable = self.node.durable
        assert durable is not None
        replica = self.replicas.pop(key, None)
        if replica is not None:
            replica.stop_following()
            member = replica.member
        else:
            member = durable.member_log(*key)
            if new:
                member.create(epoch)
            else:
                member.recover()
        arguments = decode_table(record["arguments"])
        q = QuorumQueue(vhost, record["name"], durable=True, auto_delete=record["auto_delete"],
                        arguments=arguments)
        q.members = list(record["members"])
        q.epoch = epoch
        q.attach(member, self.node.settings.queue_index_segment_entries)
        member.promote(epoch)
        q.followers = LeaderFollowers(self, q)
        member.ship_to(q.followers.ship)
        q.lease_ok = self.cluster.lease_valid
        q.recover()
        self.cluster.install_queue(vhost, q, existing)
        log.info("quorum queue leader", queue=q.name, vhost=vhost.name, epoch=epoch,
                 members=q.members, position=member.state.pos)

    def _abdicate(self, vhost: VHost, q: QuorumQueue) -> None:
        """This process no longer leads `q` (a newer epoch, its lease lost, a follower's
        fence): its consumers are cancelled, what it had not committed is nacked, and its
        member log becomes a replica's."""
        key = (vhost.name, q.name)
        self.won.pop(key, None)
        member = q.log
        log.info("quorum queue leader steps down", queue=q.name, vhost=vhost.name,
                 epoch=q.epoch)
        self.cluster.uninstall_queue(vhost, q)
        self.replicas[key] = Replica(self, key[0], key[1], member)

    def abdicate_all(self, reason: str) -> None:
        """Our lease was lost: every queue this process leads may have a new leader."""
        for vhost in list(self.node.vhosts.values()):
            for q in list(vhost.queues.values()):
                if isinstance(q, QuorumQueue) and q.followers is not None:
                    log.warning("quorum queue leader abdicates", queue=q.name, reason=reason)
                    self._abdicate(vhost, q)
                    record = self.records.get((vhost.name, q.name))
                    if record is not None:
                        self.cluster.place_remote(vhost, record, vhost.queues.get(q.name))
        for key in list(self.records):
            self._check_election(key)

    def stale(self, link: Link, m: dict[str, Any]) -> None:
        """A follower refused our batch: it voted past our epoch."""
        vhost = self.node.vhosts.get(m["v"])
        q = vhost.queues.get(m["q"]) if vhost is not None else None
        if vhost is not None and isinstance(q, QuorumQueue) and int(m["epoch"]) > q.epoch:
            self._abdicate(vhost, q)
            record = self.records.get((vhost.name, q.name))
            if record is not None:
                self.cluster.place_remote(vhost, record, vhost.queues.get(q.name))
                self._check_election((vhost.name, q.name))

    # -- elections ------------------------------------------------------------------------------
    def _leader_gone(self, key: Key) -> bool:
        record = self.records[key]
        leader = record["node"]
        if leader not in record["members"]:
            mark = self.votes.get(key, {}).get(leader)
            return not self.cluster.node_running(leader) or (
                mark is not None and int(mark.get("epoch", -1)) == int(record["epoch"]))
        if leader == self.me:
            return self.won.get(key) != int(record["epoch"])
        if not self.cluster.node_running(leader):
            return True
        epoch = int(record["epoch"])
        return any(int(v.get("epoch", -1)) == epoch for v in self.votes.get(key, {}).values())

    def _check_election(self, key: Key) -> None:
        record = self.records.get(key)
        replica = self.replicas.get(key)
        if record is None or replica is None or not self._leader_gone(key):
            return
        epoch = int(record["epoch"])
        if replica.voter and self._voted.get(key) != epoch:
            self._voted[key] = epoch
            replica.member.fence(epoch)
            self._spawn(self._vote(key, epoch, replica))
        self._decide(key)

    async def _vote(self, key: Key, epoch: int, replica: Replica) -> None:
        s = replica.member.state
        vote = {"epoch": epoch, "last_epoch": s.last_epoch, "pos": s.pos, "node": self.me}
        lease = self.cluster.membership.lease
        try:
            await self.cluster.etcd.put(self._vote_key(key, self.me), _dumps(vote), lease=lease)
        except EtcdUnavailable as exc:
            log.warning("quorum vote not written", queue=key[1], error=str(exc))
            self._voted.pop(key, None)
            return
        log.info("quorum member voted", queue=key[1], vhost=key[0], epoch=epoch,
                 last_epoch=s.last_epoch, position=s.pos)

    async def _mark_stopped(self, key: Key, epoch: int) -> None:
        mark = {"epoch": epoch, "last_epoch": 0, "pos": 0, "node": self.me, "stopped": True}
        try:
            await self.cluster.etcd.put(self._vote_key(key, self.me), _dumps(mark),
                                        lease=self.cluster.membership.lease)
        except EtcdUnavailable as exc:
            log.warning("quorum leader's stop not written (its lease will tell)", queue=key[1],
                        error=str(exc))

    def _vote_key(self, key: Key, node: str) -> str:
        return self.prefix + record_key("", (key[0], key[1], node))[1:]

    def vote_event(self, kv: KeyValue, deleted: bool) -> None:
        """A qstate key changed (the cluster's watch)."""
        from urllib.parse import unquote

        parts = [unquote(p) for p in kv.key[len(self.prefix):].split("/")]
        if len(parts) != 3:
            return
        key = (parts[0], parts[1])
        votes = self.votes.setdefault(key, {})
        if deleted:
            votes.pop(parts[2], None)
        else:
            votes[parts[2]] = json.loads(kv.value)
        self._check_election(key)

    def load_votes(self, kvs: list[KeyValue]) -> None:
        self.votes.clear()
        for kv in kvs:
            self.vote_event(kv, False)

    def _decide(self, key: Key) -> None:
        record = self.records.get(key)
        if record is None or key in self._electing:
            return
        epoch = int(record["epoch"])
        members = record["members"]
        votes = [v for node, v in self.votes.get(key, {}).items()
                 if node in members and int(v.get("epoch", -1)) == epoch]
        if len(votes) < len(members) // 2 + 1:
            return
        best = max(votes, key=lambda v: (int(v["last_epoch"]), int(v["pos"]), v["node"]))
        if best["node"] != self.me or key not in self.replicas:
            return
        self._electing.add(key)
        self._spawn(self._take(key, record))

    async def _take(self, key: Key, record: dict[str, Any]) -> None:
        """One transaction: the record as we know it -> us as leader, the next epoch."""
        epoch = int(record["epoch"]) + 1
        members = [self.me, *(n for n in record["members"] if n != self.me)]
        new = {**record, "node": self.me, "epoch": epoch, "members": members}
        rkey = self.cluster.metadata.prefix + record_key("queues", key)
        # the watch may bring the new record before the transaction's answer: it must find
        # that this process is the one the record names (a failed transaction names us never)
        self.won[key] = epoch
        try:
            try:
                result = await self.cluster.etcd.txn(
                    [Etcd.value_is(rkey, _dumps(record))],
                    [Etcd.op_put(rkey, _dumps(new)),
                     Etcd.op_delete(self._vote_key(key, ""), prefix=True)],
                    [])
            except EtcdUnavailable as exc:
                log.warning("quorum election transaction failed", queue=key[1], error=str(exc))
                if self.won.get(key) == epoch:
                    self.won.pop(key)  # an answer lost: the record tells (read again later)
                await asyncio.sleep(0.5)
                return
            if not result.succeeded:
                if self.won.get(key) == epoch:
                    self.won.pop(key)
                return  # the record changed: someone else won, or members changed
            log.info("quorum queue elected", queue=key[1], vhost=key[0], epoch=epoch)
            vhost = self.node.vhosts.get(key[0])
            current = self.records.get(key)
            if vhost is not None and current is not None and int(current["epoch"]) < epoch:
                with self.cluster.metadata.quiet():
                    self.place(vhost, new)
        finally:
            self._electing.discard(key)
            if self.records.get(key) is not None:
                self._decide(key)

    # -- membership of the queue (grow / shrink) ------------------------------------------------
    async def change_members(self, vhost: str, name: str, add: str | None = None,
                             remove: str | None = None) -> dict[str, Any]:
        """One transaction on the record: a member added (it is copied the queue by the
        leader, then counts) or removed (it leaves, its data deleted)."""
        rkey = self.cluster.metadata.prefix + record_key("queues", (vhost, name))
        for _ in range(5):
            kv = await self.cluster.etcd.get(rkey)
            if kv is None:
                raise LookupError(f"no queue '{name}' in vhost '{vhost}'")
            record = json.loads(kv.value)
            if not is_quorum(record):
                raise ValueError(f"queue '{name}' in vhost '{vhost}' is not a quorum queue")
            members = list(record["members"])
            if add is not None:
                node = self._placed(add, name, members)
                if node in members:
                    return record
                members.append(node)
            if remove is not None:
                if remove not in members:
                    return record
                if len(members) == 1:
                    raise ValueError("a quorum queue keeps at least one member")
                members.remove(remove)
            new = {**record, "members": members}
            result = await self.cluster.etcd.txn(
                [Etcd.unchanged(rkey, kv.mod_revision)], [Etcd.op_put(rkey, _dumps(new))], [])
            if result.succeeded:
                return new
        raise RuntimeError("the queue's record kept changing")

    def _placed(self, add: str, queue: str, members: list[str]) -> str:
        """The node a new member goes to: `add` itself, or for a server's name its least
        loaded running node that is no member yet. Refused (ValueError) onto a server that
        holds a member already while the running nodes span several: the workers of one
        server share its machine and disk, as at a declare (choose_members)."""
        known = self.cluster.members()
        server = {m.name: str(m.card.get("server") or m.name) for m in known}
        server[self.me] = self.node.server
        if add not in server:
            nodes = [m.name for m in known if m.running and server[m.name] == add]
            if not nodes:
                raise ValueError(f"node '{add}' is not a member of the cluster")
            load: dict[str, int] = {}
            for r in self.records.values():
                for member in r["members"]:
                    load[member] = load.get(member, 0) + 1
            free = [n for n in nodes if n not in members]
            add = min(free or nodes, key=lambda n: (load.get(n, 0), n))
        if add in members:
            return add
        held = sorted(m for m in members if server.get(m, m) == server[add])
        if held and len({server[m.name] for m in known if m.running}) > 1:
            raise ValueError(
                f"server '{server[add]}' (node '{add}') already holds a member of queue "
                f"'{queue}' ({', '.join(held)}): a second member on one server survives "
                f"nothing the first does not; add a node of another server")
        return add

    # -- links and nodes ------------------------------------------------------------------------
    def node_changed(self, name: str, running: bool) -> None:
        if not running:
            for key, record in list(self.records.items()):
                if record["node"] == name:
                    self._check_election(key)

    def link_up(self, peer: str) -> None:
        for replica in self.replicas.values():
            if replica.leader == peer:
                replica.ask()

    def link_down(self, peer: str) -> None:
        for replica in self.replicas.values():
            if replica.leader == peer:
                replica.link_down()
        for vhost in self.node.vhosts.values():
            for q in vhost.queues.values():
                if isinstance(q, QuorumQueue) and isinstance(q.followers, LeaderFollowers):
                    q.followers.link_down(peer)

    def on_log(self, link: Link, payload: bytes) -> None:
        epoch, pos, kind, vhost, name, ops = decode_log(payload)
        replica = self.replicas.get((vhost, name))
        if replica is not None:
            replica.on_log(link, epoch, pos, kind, ops)

    def on_control(self, link: Link, m: dict[str, Any]) -> None:
        op = m["op"]
        key = (m["v"], m["q"])
        if op == "q_stale":
            self.stale(link, m)
            return
        if op == "q_copy_end":
            replica = self.replicas.get(key)
            if replica is not None:
                replica.copy_end(link, m)
            return
        vhost = self.node.vhosts.get(key[0])
        q = vhost.queues.get(key[1]) if vhost is not None else None
        leading = (q.followers if isinstance(q, QuorumQueue)
                   and isinstance(q.followers, LeaderFollowers) else None)
        if op == "q_copy":
            if leading is not None and int(m["epoch"]) == leading.queue.epoch:
                leading.copy_request(link, m)
            else:
                link.control({"op": "q_not_leader", "v": key[0], "q": key[1],
                              "epoch": m["epoch"]})
        elif op == "q_pos":
            if leading is not None:
                leading.position(link.peer, m)
        elif op == "q_not_leader":
            # the node the record names does not lead (yet: a declare under way; or no more:
            # it restarted, and an election is due): ask again shortly
            replica = self.replicas.get(key)
            if replica is not None and replica.leader == link.peer:
                replica.ask_later()
            self._check_election(key)

    # -- start-up --------------------------------------------------------------------------
    def keep_dirs(self) -> list[str]:
        """Index directories of quorum queue members on disk (kept at boot until the
        cluster's records say which are still ours)."""
        durable = self.node.durable
        if durable is None:
            return []
        return [p.parent.name for p in durable.queues_root.glob(f"*/{META_FILE}")]

    def drop_strays(self) -> None:
        """After the cluster's state is read: member directories of queues that do not list
        this node any more (deleted or shrunk while it was down) go."""
        durable = self.node.durable
        if durable is None:
            return
        ours = {layout.queue_dir_name(*key) for key, r in self.records.items()
                if self.me in r["members"]}
        for name in self.keep_dirs():
            if name not in ours:
                busy = any(layout.queue_dir_name(v.name, q) == name
                           for v in self.node.vhosts.values() for q in v.queues)
                if not busy:
                    shutil.rmtree(durable.queues_root / name, ignore_errors=True)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for key in list(self.replicas):
            self.drop_replica(key, delete=False)

    def info(self, vhost: str, name: str) -> dict[str, Any]:
        replica = self.replicas.get((vhost, name))
        return replica.info() if replica is not None else {}
