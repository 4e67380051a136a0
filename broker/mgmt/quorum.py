"""A quorum queue's members over HTTP (RabbitMQ's `rabbitmq-queues add_member` and
`delete_member`; `hare-ctl grow` and `shrink` loop over these): one etcd transaction on the
queue's record each (docs/CLUSTER.md, "Replicated queues"). Administrators only, as RabbitMQ's
CLI is the node operator's."""

from __future__ import annotations

from aiohttp import web

from broker.mgmt.api import vhost_of
from broker.mgmt.authz import Need, add_route
from broker.mgmt.http import NODE, ApiError, json_response, read_json

__all__ = ["add_routes"]


async def _change(request: web.Request, add: str | None, remove: str | None) -> web.Response:
    node = request.app[NODE]
    vhost = vhost_of(node, request.match_info["vhost"])
    try:
        record = await node.cluster.change_queue_members(
            vhost.name, request.match_info["name"], add=add, remove=remove)
    except LookupError as exc:
        raise ApiError(404, str(exc)) from None
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    return json_response({"members": record["members"], "leader": record["node"]})


async def member_add(request: web.Request) -> web.Response:
    body = await read_json(request)
    member = body.get("node")
    if not isinstance(member, str) or not member:
        raise ApiError(400, "expected {\"node\": <node name>}")
    return await _change(request, member, None)


async def member_delete(request: web.Request) -> web.Response:
    return await _change(request, None, request.match_info["node"])


def add_routes(app: web.Application) -> None:
    a = Need.ADMINISTRATOR
    add_route(app, "POST", "/api/queues/{vhost}/{name}/members", member_add, a)
    add_route(app, "DELETE", "/api/queues/{vhost}/{name}/members/{node}", member_delete, a)
