"""Health checks, with RabbitMQ's paths, status codes (200 healthy, 503 not) and JSON, so
monitoring set up for RabbitMQ works unchanged:

    /api/healthchecks/node                 {"status":"ok"} (RabbitMQ's older, deprecated check)
    /api/health/checks/alarms              503 while any resource alarm is in effect
    /api/health/checks/local-alarms        the same for this node (one node: the same set)
    /api/health/checks/port-listener/{p}   503 unless something listens on port p
    /api/health/checks/virtual-hosts       503 if a vhost is down (a Hare vhost never is)
    /api/aliveness-test/{vhost}            declare `aliveness-test`, publish, get it back
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pamqp import commands

from broker.flow.alarm import DISK, MEMORY
from broker.message import Message, encode_properties
from broker.mgmt.api import vhost_of
from broker.mgmt.authz import Need, add_route, require, require_declare
from broker.mgmt.http import NODE, ApiError, json_response

if TYPE_CHECKING:
    from broker.node import Node

__all__ = ["add_routes", "listening_ports"]

_UNHEALTHY = 503
# RabbitMQ's names for the resources (rabbit_alarm's format_as_map)
_RESOURCE = {MEMORY: "memory", DISK: "disk space"}
ALIVENESS_QUEUE = "aliveness-test"


def _failed(reason: str, **extra: Any) -> web.Response:
    return json_response({"status": "failed", "reason": reason, **extra}, _UNHEALTHY)


def _ok(**extra: Any) -> web.Response:
    return json_response({"status": "ok", **extra})


def _alarms(node: Node, cluster_wide: bool = False) -> list[dict[str, str]]:
    """This node's resource alarms, or every node's and the cluster's own (etcd
    unreachable) when `cluster_wide`."""
    if cluster_wide:
        return [{"resource": _RESOURCE.get(a["resource"], a["resource"]), "node": a["node"]}
                for a in node.cluster.alarms()]
    return [{"resource": _RESOURCE.get(r, r), "node": node.name}
            for r in sorted(node.alarms_active())]


async def node_check(request: web.Request) -> web.Response:
    node = request.app[NODE]
    alarms = sorted(node.alarms_active())
    if alarms:
        return _failed("resource alarm(s) in effect", alarms=alarms)
    return _ok()


def _alarms_check(reason: str, cluster_wide: bool
                  ) -> Callable[[web.Request], Awaitable[web.Response]]:
    """One node: its local alarms are the cluster's, only RabbitMQ's wording differs."""

    async def check(request: web.Request) -> web.Response:
        alarms = _alarms(request.app[NODE], cluster_wide)
        return _failed(reason, alarms=alarms) if alarms else _ok()

    return check


def listening_ports(node: Node) -> list[int]:
    """Every port the node accepts connections on: AMQP, management HTTP, AMQPS, HTTPS."""
    return sorted({listener.port for listener in node.listeners})


async def port_listener_check(request: web.Request) -> web.Response:
    try:
        port = int(request.match_info["port"])
    except ValueError:
        raise ApiError(400, "Invalid port") from None
    ports = listening_ports(request.app[NODE])
    if port in ports:
        return _ok(port=port)
    return _failed("No active listener", missing=port, ports=ports)


async def virtual_hosts_check(request: web.Request) -> web.Response:
    # A Hare vhost has no separate process or store that could be down: it is up while the
    # node answers. The 503 shape would be {"reason":"Some virtual hosts are down", ...}.
    return _ok()


async def aliveness_test(request: web.Request) -> web.Response:
    """As RabbitMQ 3.10: declare the non-durable queue `aliveness-test` (left in place, so
    frequent probes do not churn definitions), publish "test_message" to it through the
    default exchange and get it back: with the caller's AMQP permissions, as RabbitMQ (401
    `ACCESS_REFUSED - access to queue 'aliveness-test' ...` without them)."""
    node = request.app[NODE]
    vhost = vhost_of(node, request.match_info["vhost"])
    await require_declare(request, vhost, "queue", ALIVENESS_QUEUE, None)
    await require(request, vhost.name, "exchange", "", "write")
    await require(request, vhost.name, "queue", ALIVENESS_QUEUE, "read")
    if ALIVENESS_QUEUE not in vhost.queues:  # the first test declares it, in the cluster too
        # (as a PUT: else each node, or each worker of a server, had one of its own)
        await node.cluster.check_queue_declare(
            vhost, ALIVENESS_QUEUE, durable=False, exclusive=False, auto_delete=False,
            arguments={}, server_named=False)
    q = vhost.declare_queue(ALIVENESS_QUEUE)
    await node.cluster.commit()  # nothing to wait for once it exists
    msg = Message("", ALIVENESS_QUEUE, encode_properties(commands.Basic.Properties()),
                  b"test_message")
    for target in vhost.route(vhost.default_exchange, msg):
        target.post_publishes(None, [(msg, 0)])
    got = await q.get(False)
    if got is None:
        return _failed("aliveness-test queue is empty")
    return _ok()


def add_routes(app: web.Application) -> None:
    # any management tag, as RabbitMQ 3.10.8 (the aliveness test needs AMQP permissions too)
    for path, handler in (
        ("/api/healthchecks/node", node_check),
        ("/api/health/checks/alarms",
         _alarms_check("There are alarms in effect in the cluster", True)),
        ("/api/health/checks/local-alarms",
         _alarms_check("There are alarms in effect on the node", False)),
        ("/api/health/checks/port-listener/{port}", port_listener_check),
        ("/api/health/checks/virtual-hosts", virtual_hosts_check),
        ("/api/aliveness-test/{vhost}", aliveness_test),
    ):
        add_route(app, "GET", path, handler, Need.MANAGEMENT)
