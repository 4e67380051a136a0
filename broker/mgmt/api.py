"""/api: overview, nodes, connections, channels, consumers, exchanges, queues and bindings.

Writes go through the same VHost methods AMQP clients use, so the rules (reserved names,
inequivalent arguments, exclusive queues) and the definitions hook are the same either way."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from broker import __version__
from broker.flow.memory_monitor import process_memory
from broker.mgmt.server import (
    NODE,
    STATS,
    ApiError,
    created_or_updated,
    json_response,
    no_content,
    read_json,
)
from broker.mgmt.stats import channels, details, queues
from broker.mgmt.views import (
    bindings_of,
    channel_json,
    connection_json,
    consumer_json,
    exchange_json,
    product,
    properties_key,
    queue_json,
)

if TYPE_CHECKING:
    from broker.node import Node
    from broker.queue.amqqueue import AMQQueue
    from broker.routing.exchange import Exchange
    from broker.server.reader import Reader
    from broker.vhost import VHost

__all__ = ["add_routes", "free_disk_bytes", "opened_connections", "vhost_of"]

_STARTED = time.time()
DEFAULT_EXCHANGE_ALIAS = "amq.default"  # the default exchange's name in URLs


# -- lookups ------------------------------------------------------------------------------------
def vhost_of(node: Node, name: str) -> VHost:
    vhost = node.vhosts.get(name)
    if vhost is None:
        raise ApiError(404, "Not Found")
    return vhost


def _vhosts(request: web.Request) -> list[VHost]:
    """The vhost named in the path, or every vhost."""
    node = request.app[NODE]
    name = request.match_info.get("vhost")
    if name is None:
        return list(node.vhosts.values())
    return [vhost_of(node, name)]


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


def opened_connections(node: Node) -> list[Reader]:
    """Connections past connection.open (RabbitMQ lists no half-open ones)."""
    return [conn for conn in list(node.connections) if conn.vhost is not None]


def _bool(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() in ("true", "1", "yes")


def _sort(request: web.Request, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    key = request.query.get("sort")
    if key:
        reverse = _bool(request, "sort_reverse")
        items.sort(key=lambda d: (d.get(key) is None, d.get(key, "")), reverse=reverse)
    return items


def free_disk_bytes(node: Node) -> int | None:
    try:
        st = os.statvfs(node.settings.data_dir)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


# -- overview and nodes -------------------------------------------------------------------------
async def overview(request: web.Request) -> web.Response:
    node = request.app[NODE]
    stats = request.app[STATS]
    totals = stats.totals()
    conns = opened_connections(node)
    chans = list(channels(node))
    all_queues = list(queues(node))
    exchanges = sum(len(v.exchanges) for v in node.vhosts.values())
    consumers = sum(len(q.consumers) for q in all_queues)
    message_stats: dict[str, Any] = {}
    for key in ("publish", "confirm", "return_unroutable", "deliver_get", "ack", "redeliver"):
        message_stats[key] = totals[key]
        message_stats[f"{key}_details"] = details(stats.node_rate(key))
    listeners = [{"node": node.name, "protocol": x.protocol, "ip_address": x.host or "::",
                  "port": x.port} for x in node.listeners]
    return json_response({
        "management_version": __version__,
        "rates_mode": "basic",
        "rabbitmq_version": __version__,
        **product(),
        "cluster_name": node.name,
        "node": node.name,
        "object_totals": {
            "connections": len(conns),
            "channels": len(chans),
            "exchanges": exchanges,
            "queues": len(all_queues),
            "consumers": consumers,
        },
        "queue_totals": {
            key: totals[key] for key in ("messages", "messages_ready", "messages_unacknowledged")
        } | {
            f"{key}_details": details(stats.node_rate(key))
            for key in ("messages", "messages_ready", "messages_unacknowledged")
        },
        "message_stats": message_stats,
        "listeners": listeners,
        "statistics_db_event_queue": 0,
    })


def node_json(node: Node) -> dict[str, Any]:
    alarms = node.alarms_active()
    monitor = getattr(node, "memory_monitor", None)
    out: dict[str, Any] = {
        "name": node.name,
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "mem_used": process_memory(),
        "mem_alarm": "memory" in alarms,
        "disk_free_alarm": "disk" in alarms,
        "uptime": int((time.time() - _STARTED) * 1000),
        "processors": os.cpu_count() or 1,
        "partitions": [],
        "applications": [{"name": "hare", "description": "Hare broker", "version": __version__}],
    }
    if monitor is not None and hasattr(monitor, "limit"):
        out["mem_limit"] = int(monitor.limit)
    free = free_disk_bytes(node)
    if free is not None:
        out["disk_free"] = free
    disk = getattr(node, "disk_monitor", None)
    if disk is not None and hasattr(disk, "limit"):
        out["disk_free_limit"] = int(disk.limit)
    return out


async def nodes(request: web.Request) -> web.Response:
    return json_response([node_json(request.app[NODE])])


async def node_one(request: web.Request) -> web.Response:
    node = request.app[NODE]
    if request.match_info["name"] != node.name:
        raise ApiError(404, "Not Found")
    return json_response(node_json(node))


# -- connections, channels, consumers -----------------------------------------------------------
async def connections(request: web.Request) -> web.Response:
    node = request.app[NODE]
    names = {v.name for v in _vhosts(request)}
    return json_response(_sort(request, [
        connection_json(conn, node) for conn in opened_connections(node)
        if conn.vhost.name in names
    ]))


def _connection(node: Node, name: str) -> Reader:
    for conn in opened_connections(node):
        if conn.name == name:
            return conn
    raise ApiError(404, "Not Found")


async def connection_one(request: web.Request) -> web.Response:
    node = request.app[NODE]
    return json_response(connection_json(_connection(node, request.match_info["name"]), node))


async def connection_delete(request: web.Request) -> web.Response:
    """Close with 320 CONNECTION_FORCED; the reason comes from X-Reason, as RabbitMQ."""
    node = request.app[NODE]
    conn = _connection(node, request.match_info["name"])
    conn.force_close(request.headers.get("X-Reason") or "Closed via management plugin")
    return no_content()


async def connection_channels(request: web.Request) -> web.Response:
    node = request.app[NODE]
    conn = _connection(node, request.match_info["name"])
    return json_response([channel_json(ch, node) for ch in list(conn.channels.values())])


async def channels_list(request: web.Request) -> web.Response:
    node = request.app[NODE]
    names = {v.name for v in _vhosts(request)}
    return json_response(_sort(request, [
        channel_json(ch, node) for ch in channels(node) if ch.vhost.name in names
    ]))


async def consumers(request: web.Request) -> web.Response:
    out: list[dict[str, Any]] = []
    for vhost in _vhosts(request):
        for q in list(vhost.queues.values()):
            out.extend(consumer_json(c) for c in list(q.consumers))
    return json_response(out)


# -- exchanges ----------------------------------------------------------------------------------
async def exchanges(request: web.Request) -> web.Response:
    return json_response(_sort(request, [
        exchange_json(ex, vhost)
        for vhost in _vhosts(request) for ex in list(vhost.exchanges.values())
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
    existed = name in vhost.exchanges
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
    return json_response(_sort(request, [
        queue_json(q, stats, node.name)
        for vhost in _vhosts(request) for q in list(vhost.queues.values())
    ]))


async def queue_one(request: web.Request) -> web.Response:
    node = request.app[NODE]
    vhost = vhost_of(node, request.match_info["vhost"])
    q = _queue(vhost, request.match_info["name"])
    out = queue_json(q, request.app[STATS], node.name)
    out["consumer_details"] = [consumer_json(c) for c in list(q.consumers)]
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
    existed = name in vhost.queues
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
    vhost.delete_queue(
        q, if_unused=_bool(request, "if-unused"), if_empty=_bool(request, "if-empty")
    )
    return no_content()


async def queue_purge(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    _queue(vhost, request.match_info["name"]).purge()
    return no_content()


async def queue_bindings(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    q = _queue(vhost, request.match_info["name"])
    return json_response([b for b in bindings_of(vhost)
                          if b["destination_type"] == "queue" and b["destination"] == q.name])


# -- bindings -----------------------------------------------------------------------------------
async def bindings(request: web.Request) -> web.Response:
    return json_response([b for vhost in _vhosts(request) for b in bindings_of(vhost)])


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


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/overview", overview)
    r.add_get("/api/nodes", nodes)
    r.add_get("/api/nodes/{name}", node_one)
    r.add_get("/api/connections", connections)
    r.add_get("/api/vhosts/{vhost}/connections", connections)
    r.add_get("/api/connections/{name}", connection_one)
    r.add_delete("/api/connections/{name}", connection_delete)
    r.add_get("/api/connections/{name}/channels", connection_channels)
    r.add_get("/api/channels", channels_list)
    r.add_get("/api/vhosts/{vhost}/channels", channels_list)
    r.add_get("/api/consumers", consumers)
    r.add_get("/api/consumers/{vhost}", consumers)
    r.add_get("/api/exchanges", exchanges)
    r.add_get("/api/exchanges/{vhost}", exchanges)
    r.add_get("/api/exchanges/{vhost}/{name}", exchange_one)
    r.add_put("/api/exchanges/{vhost}/{name}", exchange_put)
    r.add_delete("/api/exchanges/{vhost}/{name}", exchange_delete)
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/{side:source|destination}",
              exchange_bindings)
    r.add_get("/api/queues", queues_list)
    r.add_get("/api/queues/{vhost}", queues_list)
    r.add_get("/api/queues/{vhost}/{name}", queue_one)
    r.add_put("/api/queues/{vhost}/{name}", queue_put)
    r.add_delete("/api/queues/{vhost}/{name}", queue_delete)
    r.add_delete("/api/queues/{vhost}/{name}/contents", queue_purge)
    r.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    r.add_get("/api/bindings", bindings)
    r.add_get("/api/bindings/{vhost}", bindings)
    ends = "/api/bindings/{vhost}/e/{source}/{kind:q|e}/{dest}"
    r.add_get(ends, bindings_between)
    r.add_post(ends, binding_post)
    r.add_get(ends + "/{props}", binding_one)
    r.add_delete(ends + "/{props}", binding_delete)
