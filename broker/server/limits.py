"""Connection and channel limits counted over the whole broker: a user's `max-connections` and
`max-channels`, a vhost's `max-connections` (RabbitMQ counts them across the cluster; a
multi-worker hare-server's workers are nodes of one).

Each node counts its own connections and channels (RabbitMQ's connection tracking, per node);
a node checking a limit asks the other nodes for theirs over the link, only when the limit is
set: with no limit, a connection.open or channel.open costs nothing more than on one node.
A connection or channel whose check is under way counts already (`Reader.opening`,
`Reader.channels_opening`), here and in the answers to the other nodes: of two opens that
race on two nodes, each sees the other, so the limit is never passed (both may be refused
when only one would fit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.protocol.connection_state import ConnectionState

if TYPE_CHECKING:
    from broker.node import Node
    from broker.server.reader import Reader

__all__ = ["NO_COUNTS", "OP", "Counts", "answer", "local_counts", "peer_counts"]

OP = "limit_counts"
OPENED = ConnectionState.OPENED


@dataclass(frozen=True, slots=True)
class Counts:
    user_connections: int = 0
    user_channels: int = 0
    vhost_connections: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.user_connections + other.user_connections,
                      self.user_channels + other.user_channels,
                      self.vhost_connections + other.vhost_connections)


NO_COUNTS = Counts()


def local_counts(node: Node, user: str, vhost: str, besides: Reader | None = None) -> Counts:
    """This node's open (or opening) connections of `user` and in `vhost`, and the user's
    channels, `besides` (the connection asking) left out of the connections. Closing
    connections do not count: a client that closed and reconnects at once must not find its
    old connection still holding the slot."""
    user_conns = user_channels = vhost_conns = 0
    for c in node.connections:
        if c.user == user:
            user_channels += len(c.channels) + c.channels_opening
        if c is besides:
            continue
        opened = c.state == OPENED
        if c.user == user and (opened or c.opening is not None):
            user_conns += 1
        if (c.opening == vhost if c.opening is not None
                else opened and c.vhost is not None and c.vhost.name == vhost):
            vhost_conns += 1
    return Counts(user_conns, user_channels, vhost_conns)


async def peer_counts(node: Node, user: str, vhost: str) -> Counts:
    """The other nodes' counts, summed (a node down or not answering has none to add)."""
    total = NO_COUNTS
    for part in await node.cluster.ask_peers(OP, {"user": user, "vhost": vhost}):
        total += Counts(int(part.get("user_connections", 0)),
                        int(part.get("user_channels", 0)),
                        int(part.get("vhost_connections", 0)))
    return total


async def answer(node: Node, m: dict[str, Any]) -> dict[str, Any]:
    """A peer's question (Node.peer_handlers[OP]): this node's counts."""
    counts = local_counts(node, str(m["user"]), str(m["vhost"]))
    return {"user_connections": counts.user_connections,
            "user_channels": counts.user_channels,
            "vhost_connections": counts.vhost_connections}
