"""The other nodes' part of the management API's answers: in a cluster (a multi-worker
hare-server's workers are one), a queue's counts and rates are its home node's, and each
node has its own connections, channels and counters. The node answering a request asks its
peers over the link (`cluster.ask_peers`, answered by the handler registered here) and
merges their parts with its own, so any node (any worker behind the one port) shows the
whole broker: every queue once with its home's figures, every connection, every consumer
once (listed by the node of its channel, its `active` as its queue's home decides it),
summed totals; a connection named in a request is found (and closed) on the node that holds it,
and each node's row of /api/nodes has its own figures. A single node has no peers: nothing is
asked."""

from __future__ import annotations

import json
from functools import partial
from typing import TYPE_CHECKING, Any

from broker.flow.memory_monitor import process_memory
from broker.mgmt.http import dumps
from broker.mgmt.stats import channels, opened_connections, stores
from broker.mgmt.views import (
    channel_json,
    connection_json,
    consumer_json,
    node_json,
    queue_json,
)

if TYPE_CHECKING:
    from broker.mgmt.stats import Stats
    from broker.node import Node
    from broker.vhost import VHost

__all__ = ["OP", "all_consumers", "all_status", "auth_counts", "client_consumers",
           "close_peer_connection", "peer_connection", "peer_items", "peer_nodes", "peer_totals",
           "quarantined", "queues_from_homes", "register", "store_figures"]

OP = "mgmt_part"


def register(node: Node, stats: Stats) -> None:
    node.peer_handlers[OP] = partial(_answer, node, stats)


async def _answer(node: Node, stats: Stats, m: dict[str, Any]) -> dict[str, Any]:
    kind = m.get("kind")
    if kind == "totals":
        conns = opened_connections(node)
        return {"connections": len(conns),
                "channels": sum(len(c.channels) for c in conns), "totals": stats.totals(),
                "consumers": client_consumers(node, list(node.vhosts.values())),
                # what /metrics sums over the nodes (workers) besides
                "rss": process_memory(), "alarms": sorted(node.alarms_active()),
                "auth": auth_counts(node), "stores": store_figures(node)}
    if kind == "node":  # its own /api/nodes row (the others' cards carry no figures)
        return {"row": node_json(node), "auth": auth_counts(node)}
    if kind == "connection":
        return _connection_here(node, m)
    if kind == "consumers":
        return {"json": dumps(_consumers_here(node, _queue_key(m)))}
    items: list[dict[str, Any]]
    if kind == "queues":  # the queues homed here, with their figures
        items = [queue_json(q, stats, node.name) for v in list(node.vhosts.values())
                 for q in list(v.queues.values()) if q.home in (None, node.name)]
    elif kind == "connections":
        items = [connection_json(c, node) for c in opened_connections(node)]
    elif kind == "channels":
        items = [channel_json(ch, node) for ch in channels(node)]
    elif kind == "quarantine":
        items = quarantined(node)
    elif kind == "status":  # a plugin's running shovels or links
        items = _status_here(node, str(m.get("component")))
    else:
        return {"error": f"unknown part {kind!r}"}
    # management JSON holds AMQP values (bytes, decimals) the link's JSON does not take
    return {"json": dumps(items)}


async def peer_items(node: Node, kind: str, **question: Any) -> list[dict[str, Any]]:
    """Every peer's items of `kind` (queues homed there, its connections, its channels, a
    plugin's status rows: `question` says which plugin)."""
    out: list[dict[str, Any]] = []
    for answer in await node.cluster.ask_peers(OP, {"kind": kind, **question}):
        if "json" in answer:
            out.extend(json.loads(answer["json"]))
    return out


async def queues_from_homes(node: Node, local: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`local` (this node's view of the queues) with each queue homed on a peer taking its
    home's figures (counts, consumers, rates) over ours, and keeping what only this node
    knows (a quorum follower's own `member` state); a peer that did not answer: ours."""
    if not any(q["node"] != node.name for q in local):
        return local
    homes = {(q["vhost"], q["name"]): q for q in await peer_items(node, "queues")}
    return [{**q, **homes.get((q["vhost"], q["name"]), {})} if q["node"] != node.name else q
            for q in local]


def _status_here(node: Node, component: str) -> list[dict[str, Any]]:
    here = node.parameter_components.get(component)
    return list(here.status()) if here is not None else []


def auth_counts(node: Node) -> dict[str, list[int]]:
    """This node's login attempts per protocol: [attempts, failed, succeeded]."""
    return {p: [c.attempts, c.failed, c.succeeded] for p, c in node.auth.attempts.items()}


async def peer_nodes(node: Node) -> list[dict[str, Any]]:
    """Each peer's own /api/nodes row ("row") and login attempts ("auth", auth_counts)."""
    return [a for a in await node.cluster.ask_peers(OP, {"kind": "node"}) if "row" in a]


STORE_FIGURES = ("bytes", "garbage_bytes", "quarantined_messages")


def store_figures(node: Node) -> dict[str, dict[str, int]]:
    """What /metrics shows of each message store of this node, by store name (a
    multi-worker server's workers each have theirs: /metrics sums them)."""
    out: dict[str, dict[str, int]] = {}
    for store in stores(node):
        st = store.stats()
        out[store.name] = {key: int(st.get(key, 0)) for key in STORE_FIGURES}
    return out


def quarantined(node: Node) -> list[dict[str, Any]]:
    """The messages this node's stores set aside (broker/store/quarantine.py), each with its
    node: a multi-worker server's workers have a store each."""
    return [{**m, "node": node.name} for store in stores(node)
            for m in store.quarantined_messages()]


def _connection_here(node: Node, m: dict[str, Any]) -> dict[str, Any]:
    """Connection m["name"] if it is this node's: its JSON and its channels', or closed
    (m["close"]: the reason) when m["node"] names this node; {} when it is not here."""
    if m.get("node", node.name) != node.name:
        return {}
    conn = next((c for c in opened_connections(node) if c.name == m.get("name")), None)
    if conn is None:
        return {}
    if "close" in m:
        conn.force_close(str(m["close"]))
        return {"closed": True}
    return {"json": dumps({"connection": connection_json(conn, node),
                           "channels": [channel_json(ch, node)
                                        for ch in list(conn.channels.values())]})}


async def peer_connection(node: Node, name: str) -> dict[str, Any] | None:
    """The peer's connection called `name`, as {"connection": its JSON, "channels": its
    channels' JSON}; None when no peer has it."""
    for answer in await node.cluster.ask_peers(OP, {"kind": "connection", "name": name}):
        if "json" in answer:
            found: dict[str, Any] = json.loads(answer["json"])
            return found
    return None


async def close_peer_connection(node: Node, holder: str, name: str, reason: str) -> bool:
    """Close connection `name` of peer `holder` (320, `reason`); False when it is gone."""
    answers = await node.cluster.ask_peers(
        OP, {"kind": "connection", "name": name, "node": holder, "close": reason})
    return any(a.get("closed") for a in answers)


async def peer_totals(node: Node, *, same_server: bool = False) -> list[dict[str, Any]]:
    """Each peer's connection and channel counts and its node totals (Stats.totals);
    `same_server`: only the other workers of this node's hare-server."""
    answers = await node.cluster.ask_peers(OP, {"kind": "totals"}, same_server=same_server)
    return [a for a in answers if "totals" in a]


# (vhost, queue): one queue's consumers (a queue page); None: all of them
QueueKey = tuple[str, str] | None


def _queue_key(m: dict[str, Any]) -> QueueKey:
    return (m["v"], m["q"]) if "q" in m else None


def client_consumers(node: Node, vhosts: list[VHost]) -> int:
    """How many consumers this node's clients have in `vhosts` (those of other nodes' clients
    on queues homed here are theirs to count)."""
    clients = set(channels(node))
    return sum(c.channel in clients for v in vhosts for q in list(v.queues.values())
               for c in list(q.consumers))


def _consumers_here(node: Node, only: QueueKey) -> dict[str, list[Any]]:
    """This node's clients' consumers ("consumers"), and how the queues homed here see other
    nodes' clients' consumers ("activity": [node, vhost, queue, tag, active, status]): the
    queue's home picks a single active consumer, the consumer's node cannot tell."""
    clients = set(channels(node))
    mine: list[dict[str, Any]] = []
    activity: list[list[Any]] = []
    for v in list(node.vhosts.values()):
        if only is not None and v.name != only[0]:
            continue
        for q in list(v.queues.values()):
            if only is not None and q.name != only[1]:
                continue
            for c in list(q.consumers):
                if c.channel in clients:
                    mine.append(consumer_json(c, node.name))
                elif q.home in (None, node.name):  # a peer's consumer: the link's channel,
                    # whose reader's peer is that node's name
                    activity.append([c.channel.reader.peer[0], v.name, q.name, c.tag,
                                     *q.consumer_activity(c)])
    return {"consumers": mine, "activity": activity}


async def all_consumers(node: Node, only: QueueKey = None) -> list[dict[str, Any]]:
    """Every node's clients' consumers (of queue `only`), each once, with the `active` and
    `activity_status` its queue's home gives it."""
    parts = [_consumers_here(node, only)]
    ask = {"kind": "consumers"} if only is None else {"kind": "consumers", "v": only[0],
                                                       "q": only[1]}
    parts += [json.loads(a["json"]) for a in await node.cluster.ask_peers(OP, ask)
              if "json" in a]
    homes = {tuple(a[:4]): a[4:] for p in parts for a in p["activity"]}
    out: list[dict[str, Any]] = []
    for p in parts:
        for c in p["consumers"]:
            seen = homes.get((c["channel_details"]["node"], c["queue"]["vhost"],
                              c["queue"]["name"], c["consumer_tag"]))
            if seen is not None:
                c["active"], c["activity_status"] = seen
            out.append(c)
    return out


async def all_status(node: Node, component: str) -> list[dict[str, Any]]:
    """Every node's status rows of a parameter component (its running shovels or links),
    this node's first: a shovel or link runs on one node of the cluster."""
    return _status_here(node, component) + await peer_items(node, "status", component=component)
