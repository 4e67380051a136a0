"""/api/vhosts, /api/users, /api/permissions and /api/whoami.

Deleting a user or a vhost revokes at once: their open connections are closed with 320
CONNECTION_FORCED, as RabbitMQ does; a narrowed or cleared permission holds from the next
operation on every open channel (UserDB's generation)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.config import hash_password, is_password_hash
from broker.mgmt.api import vhost_of
from broker.mgmt.authz import Need, add_route, caller, visible_vhosts
from broker.mgmt.http import (
    NODE,
    STATS,
    ApiError,
    created_or_updated,
    json_response,
    no_content,
    read_json,
)
from broker.mgmt.peers import queues_from_homes
from broker.mgmt.stats import details
from broker.mgmt.views import queue_json

if TYPE_CHECKING:
    from broker.access import Principal, User
    from broker.node import Node

__all__ = [
    "HASHING_ALGORITHM",
    "add_routes",
    "delete_vhost",
    "parse_tags",
    "permission_json",
    "put_user",
    "user_json",
]

HASHING_ALGORITHM = "rabbit_password_hashing_sha256"


# -- vhosts -------------------------------------------------------------------------------------
_DEPTHS = ("messages", "messages_ready", "messages_unacknowledged")


async def _depths(request: web.Request, names: list[str]) -> dict[str, dict[str, int]]:
    """Each vhost's message counts: its queues' summed, each queue's as its home node (a
    multi-worker server's worker) counts it (peers.queues_from_homes)."""
    node, stats = request.app[NODE], request.app[STATS]
    rows = await queues_from_homes(node, [queue_json(q, stats, node.name) for name in names
                                          for q in list(node.vhosts[name].queues.values())])
    out = {name: dict.fromkeys(_DEPTHS, 0) for name in names}
    for row in rows:
        for key in _DEPTHS:
            out[row["vhost"]][key] += int(row.get(key, 0))
    return out


def vhost_json(node: Node, name: str, depths: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "description": "", "tags": [], "tracing": False,
                           "cluster_state": {m.name: "running" if m.running else "stopped"
                                             for m in node.cluster.members()}}
    out.update(depths)
    for key in depths:
        out[f"{key}_details"] = details(0.0)
    return out


async def vhosts(request: web.Request) -> web.Response:
    """Every vhost for monitoring users and administrators, the caller's own for others."""
    node = request.app[NODE]
    names = sorted(v.name for v in await visible_vhosts(request, monitor_sees_all=True))
    depths = await _depths(request, names)
    return json_response([vhost_json(node, name, depths[name]) for name in names])


async def vhost_one(request: web.Request) -> web.Response:
    node = request.app[NODE]
    vhost = vhost_of(node, request.match_info["vhost"])
    depths = await _depths(request, [vhost.name])
    return json_response(vhost_json(node, vhost.name, depths[vhost.name]))


async def vhost_put(request: web.Request) -> web.Response:
    """Create a vhost; the user who created it gets full permissions on it, as RabbitMQ's
    management API does, so an administrator can use it at once."""
    node = request.app[NODE]
    name = request.match_info["vhost"]
    await read_json(request)  # description/tags are accepted and not kept
    existed = name in node.vhosts
    node.add_vhost(name)
    user: Principal = request["user"]
    if not existed and node.users.permissions(user.name, name) is None:
        set_permission(node, user.name, name, {"configure": ".*", "write": ".*", "read": ".*"})
    return created_or_updated(not existed)


def delete_vhost(node: Node, name: str) -> None:
    """Close its connections (320), stop its queues, drop it and its permissions."""
    node.remove_vhost(vhost_of(node, name).name)


async def vhost_delete(request: web.Request) -> web.Response:
    delete_vhost(request.app[NODE], request.match_info["vhost"])
    return no_content()


# -- users --------------------------------------------------------------------------------------
def parse_tags(value: object) -> list[str]:
    """Tags as RabbitMQ accepts them: a list, or one comma-separated string."""
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t.strip() for t in value if t.strip()]
    raise ApiError(400, "tags must be a string or a list of strings")


def user_json(user: User) -> dict[str, Any]:
    return {
        "name": user.name,
        "password_hash": user.password_hash,
        "hashing_algorithm": HASHING_ALGORITHM,
        "tags": list(user.tags),
        "limits": dict(user.limits),
    }


def put_user(node: Node, name: str, body: dict[str, Any]) -> bool:
    """Create or update a user from a JSON body; True when it was created. A new password
    leaves the user's open connections alone (RabbitMQ's behaviour): only new logins need it."""
    existing = node.users.users.get(name)
    algorithm = body.get("hashing_algorithm", HASHING_ALGORITHM)
    if algorithm != HASHING_ALGORITHM:
        raise ApiError(400, f"hashing_algorithm {algorithm!r} is not supported "
                            f"(only {HASHING_ALGORITHM})")
    if "password" in body:
        password = body["password"]
        if not isinstance(password, str):
            raise ApiError(400, "password must be a string")
        password_hash = hash_password(password)
    elif "password_hash" in body:
        password_hash = body["password_hash"]
        # "" is allowed, as RabbitMQ: the user exists but cannot log in with a password
        if not isinstance(password_hash, str) or (password_hash
                                                 and not is_password_hash(password_hash)):
            raise ApiError(400, "password_hash is not a base64 salted SHA-256 hash")
    elif existing is not None:
        password_hash = existing.password_hash
    else:
        raise ApiError(400, "password or password_hash must be set")
    tags = parse_tags(body.get("tags")) if "tags" in body else (
        list(existing.tags) if existing is not None else [])
    node.changed(None, "put_user", node.users.add_user(name, password_hash=password_hash,
                                                       tags=tags))
    return existing is None


async def users(request: web.Request) -> web.Response:
    node = request.app[NODE]
    return json_response([user_json(u) for _, u in sorted(node.users.users.items())])


def _user(node: Node, name: str) -> User:
    user = node.users.users.get(name)
    if user is None:
        raise ApiError(404, "Not Found")
    return user


async def user_one(request: web.Request) -> web.Response:
    return json_response(user_json(_user(request.app[NODE], request.match_info["user"])))


async def user_put(request: web.Request) -> web.Response:
    body = await read_json(request)
    return created_or_updated(put_user(request.app[NODE], request.match_info["user"], body))


async def user_delete(request: web.Request) -> web.Response:
    node = request.app[NODE]
    user = _user(node, request.match_info["user"])
    node.users.delete_user(user.name)
    node.changed(None, "delete_user", user)
    node.close_connections(user=user.name, reason=f"user '{user.name}' is deleted")
    return no_content()


async def whoami(request: web.Request) -> web.Response:
    who = caller(request)
    return json_response({"name": who.name, "tags": list(who.tags)})


# -- permissions --------------------------------------------------------------------------------
def permission_json(node: Node, user: str, vhost: str) -> dict[str, Any]:
    configure, write, read = node.users.perms[(user, vhost)].patterns()
    return {"user": user, "vhost": vhost, "configure": configure, "write": write, "read": read}


async def permissions(request: web.Request) -> web.Response:
    node = request.app[NODE]
    want_user = request.match_info.get("user")
    want_vhost = request.match_info.get("vhost")
    if want_user is not None:
        _user(node, want_user)
    if want_vhost is not None:
        vhost_of(node, want_vhost)
    return json_response([
        permission_json(node, user, vhost) for user, vhost in sorted(node.users.perms)
        if want_user in (None, user) and want_vhost in (None, vhost)
    ])


async def permission_one(request: web.Request) -> web.Response:
    node = request.app[NODE]
    key = (request.match_info["user"], request.match_info["vhost"])
    if key not in node.users.perms:
        raise ApiError(404, "Not Found")
    return json_response(permission_json(node, *key))


def set_permission(node: Node, user: str, vhost: str, body: dict[str, Any]) -> bool:
    if user not in node.users.users:
        raise ApiError(400, f"user '{user}' does not exist")
    if vhost not in node.vhosts:
        raise ApiError(400, f"vhost '{vhost}' does not exist")
    patterns = []
    for field in ("configure", "write", "read"):
        value = body.get(field)
        if not isinstance(value, str):
            raise ApiError(400, f"{field} must be a string (a regular expression)")
        patterns.append(value)
    existed = node.users.permissions(user, vhost) is not None
    try:
        node.users.set_permissions(user, vhost, *patterns)
    except Exception as exc:  # re.error: a bad regular expression is the client's mistake
        raise ApiError(400, f"bad regular expression: {exc}") from exc
    node.changed(vhost, "put_permission", (user, *patterns))
    return not existed


async def permission_put(request: web.Request) -> web.Response:
    body = await read_json(request)
    created = set_permission(request.app[NODE], request.match_info["user"],
                             request.match_info["vhost"], body)
    return created_or_updated(created)


async def permission_delete(request: web.Request) -> web.Response:
    node = request.app[NODE]
    user, vhost = request.match_info["user"], request.match_info["vhost"]
    if not node.users.clear_permissions(user, vhost):
        raise ApiError(404, "Not Found")
    node.changed(vhost, "delete_permission", (user,))
    return no_content()


def add_routes(app: web.Application) -> None:
    m, admin = Need.MANAGEMENT, Need.ADMINISTRATOR
    for method, path, handler, need in (
        ("GET", "/api/vhosts", vhosts, m),
        # one vhost, even one's own, is administrators' (RabbitMQ 3.10.8)
        ("GET", "/api/vhosts/{vhost}", vhost_one, admin),
        ("PUT", "/api/vhosts/{vhost}", vhost_put, admin),
        ("DELETE", "/api/vhosts/{vhost}", vhost_delete, admin),
        ("GET", "/api/vhosts/{vhost}/permissions", permissions, admin),
        ("GET", "/api/users", users, admin),
        ("GET", "/api/users/{user}", user_one, admin),
        ("PUT", "/api/users/{user}", user_put, admin),
        ("DELETE", "/api/users/{user}", user_delete, admin),
        ("GET", "/api/users/{user}/permissions", permissions, admin),
        ("GET", "/api/whoami", whoami, m),
        ("GET", "/api/permissions", permissions, admin),
        ("GET", "/api/permissions/{vhost}/{user}", permission_one, admin),
        ("PUT", "/api/permissions/{vhost}/{user}", permission_put, admin),
        ("DELETE", "/api/permissions/{vhost}/{user}", permission_delete, admin),
    ):
        add_route(app, method, path, handler, need)
