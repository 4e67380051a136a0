"""/api/user-limits: max-connections and max-channels per user, as RabbitMQ's user limits.
Anyone with a management tag may read them (as RabbitMQ); administrators set and clear them.
A limit applies to connections and channels opened after it is set (open ones stay)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.access import LIMITS
from broker.mgmt.authz import Need, add_route
from broker.mgmt.http import NODE, ApiError, json_response, no_content, read_json

if TYPE_CHECKING:
    from broker.node import Node

__all__ = ["add_routes", "set_user_limit"]


def _rows(node: Node, user: str | None = None) -> list[dict[str, Any]]:
    return [{"user": name, "value": dict(u.limits)}
            for name, u in sorted(node.users.users.items())
            if u.limits and user in (None, name)]


def set_user_limit(node: Node, user: str, name: str, value: object) -> None:
    """Validate and set one limit (-1, or any negative value: no limit)."""
    if name not in LIMITS:
        raise ApiError(400, f"Unrecognised terms [{{<<\"{name}\">>,{value}}}] in user-limits")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} should be a number, actually was {value!r}")
    if user not in node.users.users:
        raise ApiError(400, f'["no_such_user","{user}"]')
    node.users.set_limit(user, name, value)
    node.changed(None, "put_user_limit", (user, name, value))


async def user_limits(request: web.Request) -> web.Response:
    node = request.app[NODE]
    user = request.match_info.get("user")
    if user is not None and user not in node.users.users:
        raise ApiError(404, "Not Found")
    return json_response(_rows(node, user))


async def user_limit_put(request: web.Request) -> web.Response:
    body = await read_json(request)
    if "value" not in body:
        raise ApiError(400, "[{key_missing,value}]")
    set_user_limit(request.app[NODE], request.match_info["user"], request.match_info["name"],
                   body["value"])
    return no_content()


async def user_limit_delete(request: web.Request) -> web.Response:
    """One limit, or `all` of them (rabbitmqctl clear_user_limits USER all)."""
    node = request.app[NODE]
    user, name = request.match_info["user"], request.match_info["name"]
    if user not in node.users.users:
        raise ApiError(404, "Not Found")
    if name != "all" and name not in LIMITS:
        raise ApiError(400, f"unknown limit '{name}' (known: {', '.join(LIMITS)}, all)")
    had = list(node.users.users[user].limits)
    node.users.clear_limit(user, name)
    for gone in had if name == "all" else [name]:
        node.changed(None, "delete_user_limit", (user, gone))
    return no_content()


def add_routes(app: web.Application) -> None:
    for method, path, handler, need in (
        ("GET", "/api/user-limits", user_limits, Need.MANAGEMENT),
        ("GET", "/api/user-limits/{user}", user_limits, Need.MANAGEMENT),
        ("PUT", "/api/user-limits/{user}/{name}", user_limit_put, Need.ADMINISTRATOR),
        ("DELETE", "/api/user-limits/{user}/{name}", user_limit_delete, Need.ADMINISTRATOR),
    ):
        add_route(app, method, path, handler, need)
