"""/api/topic-permissions: per exchange, the routing keys a user may publish with (write) and
bind with (read), as RabbitMQ's topic authorisation (administrators only)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.mgmt.authz import Need, add_route
from broker.mgmt.http import (
    NODE,
    ApiError,
    created_or_updated,
    json_response,
    no_content,
    read_json,
)

if TYPE_CHECKING:
    from broker.node import Node

__all__ = ["add_routes", "set_topic_permission", "topic_permission_rows"]


def topic_permission_rows(node: Node, user: str | None = None,
                          vhost: str | None = None) -> list[dict[str, Any]]:
    return [
        {"user": u, "vhost": v, "exchange": p.exchange, "write": p.write, "read": p.read}
        for (u, v), per_exchange in sorted(node.users.topic_perms.items())
        if user in (None, u) and vhost in (None, v)
        for _, p in sorted(per_exchange.items())
    ]


def set_topic_permission(node: Node, user: str, vhost: str, body: dict[str, Any]) -> bool:
    """Set one exchange's topic permission; True when the user had none in the vhost."""
    values = []
    for key in ("exchange", "write", "read"):
        value = body.get(key)
        if not isinstance(value, str):
            raise ApiError(400, f"[{{key_missing,{key}}}]")
        values.append(value)
    if user not in node.users.users or vhost not in node.vhosts:
        raise ApiError(400, "vhost_or_user_not_found")
    created = (user, vhost) not in node.users.topic_perms
    try:
        node.users.set_topic_permission(user, vhost, *values)
    except re.error as exc:
        raise ApiError(400, f"bad regular expression: {exc}") from exc
    node.changed(vhost, "put_topic_permission", (user, *values))
    return created


async def topic_permissions(request: web.Request) -> web.Response:
    node = request.app[NODE]
    user, vhost = request.match_info.get("user"), request.match_info.get("vhost")
    if user is not None and user not in node.users.users:
        raise ApiError(404, "Not Found")
    if vhost is not None and vhost not in node.vhosts:
        raise ApiError(404, "Not Found")
    rows = topic_permission_rows(node, user, vhost)
    if not rows and user is not None and vhost is not None:  # one pair: 404 when none
        raise ApiError(404, "Not Found")
    return json_response(rows)


async def topic_permission_put(request: web.Request) -> web.Response:
    body = await read_json(request)
    created = set_topic_permission(request.app[NODE], request.match_info["user"],
                                   request.match_info["vhost"], body)
    return created_or_updated(created)


async def topic_permission_delete(request: web.Request) -> web.Response:
    """All of the user's topic permissions in the vhost (RabbitMQ), or with `?exchange=X`
    only that exchange's (what `hare-ctl clear_topic_permissions USER X` sends)."""
    node = request.app[NODE]
    user, vhost = request.match_info["user"], request.match_info["vhost"]
    exchange = request.query.get("exchange")
    had = list(node.users.topic_perms.get((user, vhost), {}))
    if not node.users.clear_topic_permissions(user, vhost, exchange):
        raise ApiError(404, "Not Found")
    for gone in had if exchange is None else [exchange]:
        node.changed(vhost, "delete_topic_permission", (user, gone))
    return no_content()


def add_routes(app: web.Application) -> None:
    admin = Need.ADMINISTRATOR
    for method, path, handler in (
        ("GET", "/api/topic-permissions", topic_permissions),
        ("GET", "/api/users/{user}/topic-permissions", topic_permissions),
        ("GET", "/api/vhosts/{vhost}/topic-permissions", topic_permissions),
        ("GET", "/api/topic-permissions/{vhost}/{user}", topic_permissions),
        ("PUT", "/api/topic-permissions/{vhost}/{user}", topic_permission_put),
        ("DELETE", "/api/topic-permissions/{vhost}/{user}", topic_permission_delete),
    ):
        add_route(app, method, path, handler, admin)
