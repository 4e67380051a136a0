"""The Cluster protocol and its single-node implementation."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from broker.message import Message
    from broker.node import Node
    from broker.vhost import VHost

__all__ = ["Cluster", "ClusterUnavailable", "LocalCluster", "Member", "NodeNameTaken",
           "rendezvous"]


class NodeNameTaken(Exception):
    """Another running node already has this name."""


class ClusterUnavailable(Exception):
    """The cluster's store cannot be reached (etcd: EtcdUnavailable)."""


@dataclass(slots=True)
class Member:
    """A node of the cluster as /api/nodes shows it: its card is what it published."""

    name: str
    running: bool
    card: dict[str, Any] = field(default_factory=dict)


class Cluster(Protocol):
    name: str  # the cluster's name (RabbitMQ's cluster_name)
    clustered: bool

    async def ask_peers(self, op: str, message: dict[str, Any], *,
                        same_server: bool = False) -> list[dict[str, Any]]:
        """Ask every running peer `op` (a handler in its `Node.peer_handlers`); the answers
        of those that gave one (a single node: none). `same_server`: only the peers of this
        node's hare-server (the other workers of a multi-worker server)."""
        ...

    def runner(self, key: str, *, same_server: bool = False) -> str:
        """The node that runs what is run once in the cluster (a dynamic shovel, a federated
        exchange's link) under `key`: of the running nodes (`same_server`: this node's
        hare-server's workers), the one that `key` hashes highest with (rendezvous hashing),
        so a node that stops moves only its own things and takes them back when it returns.
        Every node computes the same answer from its view of who runs."""
        ...

    def forward_reply(self, msg: Message) -> None:
        """A direct reply to a name another node holds: delivered there (or dropped, as a
        reply to a name nobody holds)."""
        ...

    async def reply_alive(self, name: str) -> bool:
        """Whether another node holds direct-reply name `name`."""
        ...

    async def settled(self, timeout_s: float) -> None:
        """Start-up's last step: until the quorum queues only this node holds lead again
        (at most `timeout_s`), so a client told "listening" finds them."""
        ...

    async def start(self) -> None:
        """Join (before recovery: a refused name stops start-up)."""

    async def stop(self) -> None: ...

    def members(self) -> list[Member]:
        """Every node the cluster knows, running or not, this one included."""

    def alarms(self) -> list[dict[str, str]]:
        """Alarms of the cluster: each node's resource alarms, and the cluster's own (etcd
        unreachable), as {"node", "resource"}."""

    async def sync(self) -> None:
        """After the node restored its own definitions: take the cluster's metadata."""

    def caught_up(self, timeout_s: float = 1.0) -> Awaitable[bool]:
        """Whether waiting for what the cluster's store holds now (a user, vhost or
        permission written through another node or worker a moment ago) brought this node
        anything since the call (not since the awaiting: the watch may apply it meanwhile):
        a name not known here is asked for once before it is refused."""
        ...

    def changed(self, vhost: str | None, what: str, obj: object) -> None:
        """A definition changed here (Node.changed): the cluster's store is told."""

    async def check_queue_declare(self, vhost: VHost, name: str, *, durable: bool,
                                  exclusive: bool, auto_delete: bool,
                                  arguments: dict[str, Any], server_named: bool) -> None:
        """Before a non-passive queue.declare: a queue that does not exist here is claimed in
        the cluster, so when two nodes race only one definition wins (the loser's declare
        then compares against it: ok or 406)."""

    async def check_exchange_declare(self, vhost: VHost, name: str, type_: str, *,
                                     durable: bool, auto_delete: bool, internal: bool,
                                     arguments: dict[str, Any]) -> None:
        """The same for exchange.declare."""

    async def check_writable(self) -> None:
        """Before any other metadata change: raise when the cluster cannot take it."""

    async def commit(self) -> None:
        """After a metadata change: return once the cluster has it."""

    async def change_queue_members(self, vhost: str, name: str, *, add: str | None,
                                   remove: str | None) -> dict[str, Any]:
        """A quorum queue's members grown or shrunk (its record: members, leader); LookupError
        for no such queue, ValueError for a change that cannot be made."""


class LocalCluster:
    """One node: the cluster is its name and itself."""

    clustered = False

    def __init__(self, node: Node) -> None:
        self.node = node
        self.name = node.name
        self._started_ms = int(time.time() * 1000)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def ask_peers(self, op: str, message: dict[str, Any], *,
                        same_server: bool = False) -> list[dict[str, Any]]:
        return []

    def runner(self, key: str, *, same_server: bool = False) -> str:
        return self.node.name

    def forward_reply(self, msg: Message) -> None:
        pass

    async def settled(self, timeout_s: float) -> None:
        pass

    async def reply_alive(self, name: str) -> bool:
        return False

    def members(self) -> list[Member]:
        return [Member(self.node.name, True, self_card(self.node, self._started_ms))]

    def alarms(self) -> list[dict[str, str]]:
        return [{"node": self.node.name, "resource": r}
                for r in sorted(self.node.alarms_active())]

    async def sync(self) -> None:
        pass

    def caught_up(self, timeout_s: float = 1.0) -> Awaitable[bool]:
        return _nothing_new()

    def changed(self, vhost: str | None, what: str, obj: object) -> None:
        pass

    async def check_queue_declare(self, vhost: VHost, name: str, *, durable: bool,
                                  exclusive: bool, auto_delete: bool,
                                  arguments: dict[str, Any], server_named: bool) -> None:
        pass

    async def check_exchange_declare(self, vhost: VHost, name: str, type_: str, *,
                                     durable: bool, auto_delete: bool, internal: bool,
                                     arguments: dict[str, Any]) -> None:
        pass

    async def check_writable(self) -> None:
        pass

    async def commit(self) -> None:
        pass

    async def change_queue_members(self, vhost: str, name: str, *, add: str | None,
                                   remove: str | None) -> dict[str, Any]:
        v = self.node.vhosts.get(vhost)
        q = v.queues.get(name) if v is not None else None
        if q is None:
            raise LookupError(f"no queue '{name}' in vhost '{vhost}'")
        if q.args.kind != "quorum":
            raise ValueError(f"queue '{name}' in vhost '{vhost}' is not a quorum queue")
        for other in (add, remove):
            if other is not None and other != self.node.name:
                raise ValueError(f"node '{other}' is not a member of the cluster")
        if remove is not None:
            raise ValueError("a quorum queue keeps at least one member")
        return {"members": [self.node.name], "node": self.node.name}


async def _nothing_new() -> bool:
    return False


def rendezvous(key: str, nodes: list[str]) -> str:
    """Of `nodes`, the one `key` hashes highest with: the same answer wherever it is asked,
    and removing a node moves only the keys it had."""
    return max(nodes, key=lambda n: hashlib.sha256(f"{key}\0{n}".encode()).digest())


def self_card(node: Node, started_ms: int) -> dict[str, Any]:
    """What a node tells the cluster about itself (its card in etcd)."""
    return {"name": node.name, "server": node.server, "pid": os.getpid(),
            "started": started_ms, "amqp_port": node.port,
            "management_port": node.management_port(), "alarms": sorted(node.alarms_active())}
