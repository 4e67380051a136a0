"""/api: overview, nodes, connections, channels, consumers, exchanges, queues and bindings.

Writes go through the same VHost methods AMQP clients use, so the rules (reserved names,
inequivalent arguments, exclusive queues) and the definitions hook are the same either way,
after the same permission checks (broker/mgmt/authz.py). Listings show what the caller's tags
let it see."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from broker import __version__
from broker.mgmt.authz import (
    NOT_YOURS,
    Need,
    add_route,
    caller,
    require,
    require_declare,
    require_topic,
    visible_vhosts,
)
from broker.mgmt.http import (
    NODE,
    STATS,
    ApiError,
    created_or_updated,
    json_response,
    no_content,
    read_json,
)
from broker.mgmt.peers import (
    all_consumers,
    auth_counts,
    client_consumers,
    close_peer_connection,
    peer_connection,
    peer_items,
    peer_nodes,
    peer_totals,
    quarantined,
    queues_from_homes,
)
from broker.mgmt.stats import channels, details, opened_connections
from broker.mgmt.views import (
    bindings_of,
    channel_json,
    connection_json,
    exchange_json,
    node_json,
    product,
    properties_key,
    queue_json,
)
from broker.routing.exchange import Exchange

if TYPE_CHECKING:
    from broker.cluster import Member
    from broker.node import Node
    from broker.queue.amqqueue import AMQQueue
    from broker.server.reader import Reader
    from broker.vhost import VHost

__all__ = ["add_routes", "vhost_of"]

DEFAULT_EXCHANGE_ALIAS = "amq.default"  # the default exchange's name in URLs


# -- lookups ------------------------------------------------------------------------------------
def vhost_of(node: Node, name: str) -> VHost:
    vhost = node.vhosts.get(name)
    if vhost is None:
        raise ApiError(404, "Not Found")
    return vhost


def _exchange(vhost: VHost, name: str) -> Exchange:
    ex = vhost.exchanges.get("" if name == DEFAULT_EXCHANGE_ALIAS else name)
    if ex is None:
        raise ApiError(404, "Not Found")
    return ex


def _queue(vhost: VHost, name: str) -> AMQQueue:
    q = vhost.queues.get(name)
    if q is None:
        raise ApiError(404, "Not Found")
    return q


def _bool(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() in ("true", "1", "yes")


def _sort(request: web.Request, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    key = request.query.get("sort")
    if key:
        reverse = _bool(request, "sort_reverse")
        items.sort(key=lambda d: (d.get(key) is None, d.get(key, "")), reverse=reverse)
    return items


# -- overview and nodes -------------------------------------------------------------------------
async def overview(request: web.Request) -> web.Response:
    """Node-wide for monitoring users and administrators; others see the figures of their
    own vhosts and connections, and no node or listeners (as RabbitMQ)."""
    node = request.app[NODE]
    stats = request.app[STATS]
    who = caller(request)
    vhosts = await visible_vhosts(request, monitor_sees_all=True)
    conns = [c for c in opened_connections(node) if who.sees(c)]
    chans = [ch for c in conns for ch in list(c.channels.values())]
    shown_queues = [q for v in vhosts for q in list(v.queues.values())]
    exchanges = sum(len(v.exchanges) for v in vhosts)
    consumers = client_consumers(node, vhosts)
    totals = stats.totals() if who.is_monitor else _queue_totals(shown_queues, chans)
    peer_conns = peer_chans = 0
    if who.is_monitor:  # the node-wide figures of the other workers (nodes) added in
        for part in await peer_totals(node):
            peer_conns += part["connections"]
            peer_chans += part["channels"]
            consumers += part.get("consumers", 0)
            for key, value in part["totals"].items():
                totals[key] = totals.get(key, 0) + value
    message_stats: dict[str, Any] = {}
    for key in ("publish", "confirm", "return_unroutable", "deliver_get", "ack", "redeliver"):
        message_stats[key] = totals[key]
        if who.is_monitor:
            message_stats[f"{key}_details"] = details(stats.node_rate(key))
    out: dict[str, Any] = {
        "management_version": __version__,
        "rates_mode": "basic",
        "rabbitmq_version": __version__,
        **product(),
        "cluster_name": node.cluster.name,
        "object_totals": {
            "connections": len(conns) + peer_conns,
            "channels": len(chans) + peer_chans,
            "exchanges": exchanges,
            "queues": len(shown_queues),
            "consumers": consumers,
        },
        "queue_totals": {
            key: totals[key] for key in ("messages", "messages_ready", "messages_unacknowledged")
        },
        "message_stats": message_stats,
        "statistics_db_event_queue": 0,
        # as RabbitMQ's overview: the types a declare accepts, plugins' included
        "exchange_types": [{"name": t, "description": "", "enabled": True}
                           for t in sorted(Exchange._types)],
    }
    if who.is_monitor:
        listeners = [{"node": node.name, "protocol": x.protocol, "ip_address": x.host or "::",
                      "port": x.port} for x in node.listeners]
        out["node"] = node.name
        out["listeners"] = listeners
        out["queue_totals"].update({
            f"{key}_details": details(stats.node_rate(key))
            for key in ("messages", "messages_ready", "messages_unacknowledged")
        })
    return json_response(out)


def _queue_totals(shown: list[AMQQueue], chans: list[Any]) -> dict[str, int]:
    """The overview's counts summed over what a management user may see (node totals, which
    include deleted queues and closed channels, are not theirs to see)."""
    totals = dict.fromkeys(("messages", "messages_ready", "messages_unacknowledged",
                            "publish", "confirm", "return_unroutable", "deliver_get", "ack",
                            "redeliver"), 0)
    for q in shown:
        info = q.info()
        for key in ("messages", "messages_ready", "messages_unacknowledged"):
            totals[key] += int(info.get(key, 0))
        for key, attr in (("deliver_get", "delivered"), ("ack", "acked"),
                          ("redeliver", "redelivered")):
            totals[key] += int(getattr(q, attr, 0) or 0)
    for ch in chans:
        for key, attr in (("publish", "published"), ("confirm", "confirmed"),
                          ("return_unroutable", "returned")):
            totals[key] += int(getattr(ch, attr, 0) or 0)
    return totals


def member_json(node: Node, member: Member, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A cluster node as /api/nodes shows it: this one in full, a running peer with the row
    it gave (`rows`, peer_nodes), the others from the card they keep in etcd (RabbitMQ shows
    only name, type and running for a stopped node)."""
    if member.name == node.name:
        return node_json(node)
    if member.running and member.name in rows:
        return rows[member.name]
    out: dict[str, Any] = {"name": member.name,
                           "server": member.card.get("server", member.name),
                           "type": "disc", "running": member.running}
    if member.running:  # a peer that did not answer
        card = member.card
        alarms = card.get("alarms", [])
        out.update({
            "os_pid": str(card.get("pid", "")),
            "mem_alarm": "memory" in alarms,
            "disk_free_alarm": "disk" in alarms,
            "uptime": max(0, int(time.time() * 1000) - int(card.get("started", 0))),
            "partitions": [],
        })
    return out


async def _node_rows(node: Node) -> dict[str, dict[str, Any]]:
    return {a["row"]["name"]: a["row"] for a in await peer_nodes(node)}


async def nodes(request: web.Request) -> web.Response:
    node = request.app[NODE]
    rows = await _node_rows(node)
    return json_response([member_json(node, m, rows) for m in node.cluster.members()])


async def node_one(request: web.Request) -> web.Response:
    node = request.app[NODE]
    for m in node.cluster.members():
        if m.name == request.match_info["name"]:
            rows = await _node_rows(node) if m.name != node.name else {}
            return json_response(member_json(node, m, rows))
    raise ApiError(404, "Not Found")


async def auth_attempts(request: web.Request) -> web.Response:
    """Login attempts per protocol since start (RabbitMQ's /api/auth/attempts/{node}): those
    of the node named, asked over the link when it is not this one; a hare-server's name
    (its workers' `server`) sums its workers', as its one port takes their logins."""
    node = request.app[NODE]
    name = request.match_info["name"]
    parts = [({"name": node.name, "server": node.server}, auth_counts(node))]
    if name != node.name:
        parts += [(a["row"], a["auth"]) for a in await peer_nodes(node)]
    summed: dict[str, list[int]] = {}
    found = False
    for row, counts in parts:
        if name in (row["name"], row.get("server")):
            found = True
            for protocol, values in counts.items():
                was = summed.setdefault(protocol, [0, 0, 0])
                summed[protocol] = [a + b for a, b in zip(was, values, strict=True)]
    if not found:
        raise ApiError(404, "Not Found")
    return json_response([
        {"protocol": protocol, "auth_attempts": n, "auth_attempts_failed": failed,
         "auth_attempts_succeeded": succeeded}
        for protocol, (n, failed, succeeded) in sorted(summed.items())
    ])


# -- connections, channels, consumers -----------------------------------------------------------
async def connections(request: web.Request) -> web.Response:
    node = request.app[NODE]
    who = caller(request)
    names = {v.name for v in await visible_vhosts(request, monitor_sees_all=True)}
    return json_response(_sort(request, [
        connection_json(conn, node) for conn in opened_connections(node)
        if conn.vhost.name in names and who.sees(conn)
    ] + [c for c in await peer_items(node, "connections")  # other workers' or nodes'
         if c["vhost"] in names and (who.is_monitor or c["user"] == who.name)]))


async def _connection(request: web.Request, name: str) -> Reader | dict[str, Any]:
    """A connection the caller may see: its own, or any for monitoring and administrators
    (RabbitMQ answers 401 for another user's, not 404). This node's (its reader), else a
    peer's ({"connection", "channels"}: peers.peer_connection), as the other workers of a
    server share its management port."""
    node = request.app[NODE]
    who = caller(request)
    for conn in opened_connections(node):
        if conn.name == name:
            if not who.sees(conn):
                raise ApiError(401, NOT_YOURS)
            return conn
    found = await peer_connection(node, name)
    if found is None:
        raise ApiError(404, "Not Found")
    if not (who.is_monitor or found["connection"]["user"] == who.name):
        raise ApiError(401, NOT_YOURS)
    return found


async def connection_one(request: web.Request) -> web.Response:
    conn = await _connection(request, request.match_info["name"])
    if isinstance(conn, dict):
        return json_response(conn["connection"])
    return json_response(connection_json(conn, request.app[NODE]))


async def connection_delete(request: web.Request) -> web.Response:
    """Close with 320 CONNECTION_FORCED; the reason comes from X-Reason, as RabbitMQ. Only
    administrators close other users' connections (monitoring users see them, no more)."""
    who = caller(request)
    conn = await _connection(request, request.match_info["name"])
    reason = request.headers.get("X-Reason") or "Closed via management plugin"
    if isinstance(conn, dict):
        info = conn["connection"]
        if not (who.is_admin or info["user"] == who.name):
            raise ApiError(401, NOT_YOURS)
        if not await close_peer_connection(request.app[NODE], info["node"], info["name"],
                                           reason):
            raise ApiError(404, "Not Found")  # closed meanwhile
        return no_content()
    if not who.may_close(conn):
        raise ApiError(401, NOT_YOURS)
    conn.force_close(reason)
    return no_content()


async def connection_channels(request: web.Request) -> web.Response:
    node = request.app[NODE]
    conn = await _connection(request, request.match_info["name"])
    if isinstance(conn, dict):
        return json_response(conn["channels"])
    return json_response([channel_json(ch, node) for ch in list(conn.channels.values())])


async def channels_list(request: web.Request) -> web.Response:
    node = request.app[NODE]
    who = caller(request)
    names = {v.name for v in await visible_vhosts(request, monitor_sees_all=True)}
    return json_response(_sort(request, [
        channel_json(ch, node) for ch in channels(node)
        if ch.vhost.name in names and who.sees(ch.reader)
    ] + [c for c in await peer_items(node, "channels")
         if c["vhost"] in names and (who.is_monitor or c["user"] == who.name)]))


async def consumers(request: web.Request) -> web.Response:
    """Every node's (worker's) consumers; as RabbitMQ, monitoring users and administrators see
    all of them, others their own channels' only."""
    who = caller(request)
    names = {v.name for v in await visible_vhosts(request, monitor_sees_all=True)}
    return json_response(_sort(request, [
        c for c in await all_consumers(request.app[NODE])
        if c["queue"]["vhost"] in names
        and (who.is_monitor or c["channel_details"]["user"] == who.name)]))


# -- exchanges ----------------------------------------------------------------------------------
async def exchanges(request: web.Request) -> web.Response:
    return json_response(_sort(request, [
        exchange_json(ex, vhost)
        for vhost in await visible_vhosts(request) for ex in list(vhost.exchanges.values())
    ]))


async def exchange_one(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    return json_response(exchange_json(_exchange(vhost, request.match_info["name"]), vhost))


async def exchange_put(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    name = request.match_info["name"]
    body = await read_json(request)
    type_ = body.get("type")
    if not isinstance(type_, str) or not type_:
        raise ApiError(400, "type must be set")
    await require_declare(request, vhost, "exchange", name, _arguments(body))
    existed = name in vhost.exchanges
    if not existed:  # claimed in the cluster first (a single node: nothing to do)
        await request.app[NODE].cluster.check_exchange_declare(
            vhost, name, type_, durable=bool(body.get("durable", True)),
            auto_delete=bool(body.get("auto_delete", False)),
            internal=bool(body.get("internal", False)), arguments=_arguments(body))
    vhost.declare_exchange(
        name, type_,
        durable=bool(body.get("durable", True)),
        auto_delete=bool(body.get("auto_delete", False)),
        internal=bool(body.get("internal", False)),
        arguments=_arguments(body),
    )
    return created_or_updated(not existed)


async def exchange_delete(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    ex = _exchange(vhost, request.match_info["name"])
    await require(request, vhost.name, "exchange", ex.name, "configure")
    vhost.delete_exchange(ex.name, if_unused=_bool(request, "if-unused"))
    return no_content()


async def exchange_bindings(request: web.Request) -> web.Response:
    """/api/exchanges/{vhost}/{name}/bindings/source|destination."""
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    ex = _exchange(vhost, request.match_info["name"])
    side = request.match_info["side"]
    found = bindings_of(vhost, implicit=False)
    if side == "source":
        found = [b for b in found if b["source"] == ex.name]
    else:
        found = [b for b in found
                 if b["destination_type"] == "exchange" and b["destination"] == ex.name]
    return json_response(found)


# -- queues -------------------------------------------------------------------------------------
async def queues_list(request: web.Request) -> web.Response:
    node = request.app[NODE]
    stats = request.app[STATS]
    return json_response(_sort(request, await queues_from_homes(node, [
        queue_json(q, stats, node.name)
        for vhost in await visible_vhosts(request) for q in list(vhost.queues.values())
    ])))


async def queue_one(request: web.Request) -> web.Response:
    node = request.app[NODE]
    vhost = vhost_of(node, request.match_info["vhost"])
    q = _queue(vhost, request.match_info["name"])
    out = (await queues_from_homes(node, [queue_json(q, request.app[STATS], node.name)]))[0]
    out["consumer_details"] = await all_consumers(node, (vhost.name, q.name))
    return json_response(out)


def _arguments(body: dict[str, Any]) -> dict[str, Any]:
    args = body.get("arguments") or {}
    if not isinstance(args, dict):
        raise ApiError(400, "arguments must be a JSON object")
    return args


async def queue_put(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    name = request.match_info["name"]
    body = await read_json(request)
    if body.get("exclusive"):
        raise ApiError(400, "exclusive queues cannot be declared over HTTP (no connection)")
    await require_declare(request, vhost, "queue", name, _arguments(body))
    existed = name in vhost.queues
    if not existed:
        await request.app[NODE].cluster.check_queue_declare(
            vhost, name, durable=bool(body.get("durable", True)), exclusive=False,
            auto_delete=bool(body.get("auto_delete", False)), arguments=_arguments(body),
            server_named=False)
    vhost.declare_queue(
        name,
        durable=bool(body.get("durable", True)),
        auto_delete=bool(body.get("auto_delete", False)),
        arguments=_arguments(body),
    )
    return created_or_updated(not existed)


async def queue_delete(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    q = _queue(vhost, request.match_info["name"])
    await require(request, vhost.name, "queue", q.name, "configure")
    if_unused, if_empty = _bool(request, "if-unused"), _bool(request, "if-empty")
    await vhost.check_queue_delete(q, if_unused=if_unused, if_empty=if_empty)
    vhost.delete_queue(q, if_unused=if_unused, if_empty=if_empty)
    return no_content()


async def queue_purge(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    q = _queue(vhost, request.match_info["name"])
    await require(request, vhost.name, "queue", q.name, "read")
    await q.purge()
    return no_content()


async def queue_bindings(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    q = _queue(vhost, request.match_info["name"])
    return json_response([b for b in bindings_of(vhost)
                          if b["destination_type"] == "queue" and b["destination"] == q.name])


# -- bindings -----------------------------------------------------------------------------------
async def bindings(request: web.Request) -> web.Response:
    return json_response([b for vhost in await visible_vhosts(request)
                          for b in bindings_of(vhost)])


def _binding_ends(request: web.Request) -> tuple[VHost, Exchange, str, str]:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    source = _exchange(vhost, request.match_info["source"])
    kind = "queue" if request.match_info["kind"] == "q" else "exchange"
    dest = request.match_info["dest"]
    if kind == "queue":
        _queue(vhost, dest)
    else:
        _exchange(vhost, dest)
    return vhost, source, kind, dest


async def _require_binding(request: web.Request, vhost: VHost, source: Exchange, kind: str,
                           dest: str, routing_key: str) -> None:
    """What queue.bind / exchange.bind need: write on the destination, read on the source,
    and read on the routing key when the source is a topic exchange."""
    await require(request, vhost.name, kind, dest, "write")
    await require(request, vhost.name, "exchange", source.name, "read")
    await require_topic(request, vhost.name, source.name, [routing_key], "read")


async def bindings_between(request: web.Request) -> web.Response:
    vhost, source, kind, dest = _binding_ends(request)
    return json_response([
        b for b in bindings_of(vhost, implicit=source.name == "")
        if b["source"] == source.name and b["destination"] == dest
        and b["destination_type"] == kind
    ])


async def binding_post(request: web.Request) -> web.Response:
    vhost, source, kind, dest = _binding_ends(request)
    body = await read_json(request)
    routing_key = body.get("routing_key", "")
    if not isinstance(routing_key, str):
        raise ApiError(400, "routing_key must be a string")
    args = _arguments(body)
    await _require_binding(request, vhost, source, kind, dest, routing_key)
    if kind == "queue":
        vhost.bind_queue(vhost.queues[dest], source.name, routing_key, args)
    else:
        vhost.bind_exchange(dest, source.name, routing_key, args)
    resp = web.Response(status=201)
    resp.headers["Location"] = properties_key(routing_key, args)
    return resp


async def binding_delete(request: web.Request) -> web.Response:
    vhost, source, kind, dest = _binding_ends(request)
    props = request.match_info["props"]  # aiohttp has decoded it already
    for b in bindings_of(vhost, implicit=False):
        if (b["source"] == source.name and b["destination"] == dest
                and b["destination_type"] == kind and unquote(b["properties_key"]) == props):
            await _require_binding(request, vhost, source, kind, dest, b["routing_key"])
            if kind == "queue":
                vhost.unbind_queue(vhost.queues[dest], source.name, b["routing_key"],
                                   b["arguments"])
            else:
                vhost.unbind_exchange(dest, source.name, b["routing_key"], b["arguments"])
            return no_content()
    raise ApiError(404, "Not Found")


async def binding_one(request: web.Request) -> web.Response:
    vhost, source, kind, dest = _binding_ends(request)
    props = request.match_info["props"]
    for b in bindings_of(vhost):
        if (b["source"] == source.name and b["destination"] == dest
                and b["destination_type"] == kind and unquote(b["properties_key"]) == props):
            return json_response(b)
    raise ApiError(404, "Not Found")


async def quarantine(request: web.Request) -> web.Response:
    """Messages set aside when their body was found damaged at read (broker/store/quarantine.py),
    from every message store of every node (worker); what `hare-ctl verify` lists offline."""
    node = request.app[NODE]
    return json_response(quarantined(node) + await peer_items(node, "quarantine"))


def add_routes(app: web.Application) -> None:
    m, mon = Need.MANAGEMENT, Need.MONITORING
    for method, path, handler, need in (
        ("GET", "/api/overview", overview, m),
        ("GET", "/api/nodes", nodes, mon),
        ("GET", "/api/nodes/{name}", node_one, mon),
        ("GET", "/api/quarantine", quarantine, mon),
        ("GET", "/api/auth/attempts/{name}", auth_attempts, mon),
        ("GET", "/api/connections", connections, m),
        ("GET", "/api/vhosts/{vhost}/connections", connections, m),
        ("GET", "/api/connections/{name}", connection_one, m),
        ("DELETE", "/api/connections/{name}", connection_delete, m),
        ("GET", "/api/connections/{name}/channels", connection_channels, m),
        ("GET", "/api/channels", channels_list, m),
        ("GET", "/api/vhosts/{vhost}/channels", channels_list, m),
        ("GET", "/api/consumers", consumers, m),
        ("GET", "/api/consumers/{vhost}", consumers, m),
        ("GET", "/api/exchanges", exchanges, m),
        ("GET", "/api/exchanges/{vhost}", exchanges, m),
        ("GET", "/api/exchanges/{vhost}/{name}", exchange_one, m),
        ("PUT", "/api/exchanges/{vhost}/{name}", exchange_put, m),
        ("DELETE", "/api/exchanges/{vhost}/{name}", exchange_delete, m),
        ("GET", "/api/exchanges/{vhost}/{name}/bindings/{side:source|destination}",
         exchange_bindings, m),
        ("GET", "/api/queues", queues_list, m),
        ("GET", "/api/queues/{vhost}", queues_list, m),
        ("GET", "/api/queues/{vhost}/{name}", queue_one, m),
        ("PUT", "/api/queues/{vhost}/{name}", queue_put, m),
        ("DELETE", "/api/queues/{vhost}/{name}", queue_delete, m),
        ("DELETE", "/api/queues/{vhost}/{name}/contents", queue_purge, m),
        ("GET", "/api/queues/{vhost}/{name}/bindings", queue_bindings, m),
        ("GET", "/api/bindings", bindings, m),
        ("GET", "/api/bindings/{vhost}", bindings, m),
        ("GET", _ENDS, bindings_between, m),
        ("POST", _ENDS, binding_post, m),
        ("GET", _ENDS + "/{props}", binding_one, m),
        ("DELETE", _ENDS + "/{props}", binding_delete, m),
    ):
        add_route(app, method, path, handler, need)


_ENDS = "/api/bindings/{vhost}/e/{source}/{kind:q|e}/{dest}"
