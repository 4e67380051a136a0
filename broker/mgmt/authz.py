"""Who may call which management path: RabbitMQ's four user tags, vhost scoping, and the
AMQP permission checks that HTTP writes go through.

Every route declares what it needs when it is added (`add_route(app, method, path, handler,
Need.X)`); one middleware enforces it, so a new route is covered by writing one word, and a
route added without a declaration is administrators-only (fail closed).

    tag            may
    management     its own vhosts (those it may open over AMQP): their queues, exchanges,
                   bindings and overview figures; its own connections, channels and consumers
    policymaker    as management, plus policies and parameters in its vhosts
    monitoring     as management, plus every vhost, connection, channel and consumer, node
                   figures
    administrator  everything

Then, for everyone but administrators, a path that names a vhost needs access to that vhost.
Writes to topology and messages (declare, delete, purge, bind, publish, get) need the
caller's AMQP permissions too, administrators included, as RabbitMQ's management plugin acts
through an AMQP channel of the caller's. Refusals are 401 with RabbitMQ's reasons."""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.access import AccessRefused, Credentials, LoginRefused, Principal
from broker.mgmt.http import NODE, ApiError

if TYPE_CHECKING:
    from broker.node import Node
    from broker.server.reader import Reader
    from broker.vhost import VHost

__all__ = [
    "MANAGEMENT_TAGS",
    "Caller",
    "Need",
    "add_route",
    "authorize",
    "caller",
    "require",
    "require_declare",
    "visible_vhosts",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Need(StrEnum):
    MANAGEMENT = "management"
    POLICYMAKER = "policymaker"
    MONITORING = "monitoring"
    ADMINISTRATOR = "administrator"


MANAGEMENT_TAGS = frozenset(Need)
_GRANTED_BY: dict[Need, frozenset[str]] = {
    Need.MANAGEMENT: MANAGEMENT_TAGS,
    Need.POLICYMAKER: frozenset({"policymaker", "administrator"}),
    Need.MONITORING: frozenset({"monitoring", "administrator"}),
    Need.ADMINISTRATOR: frozenset({"administrator"}),
}
# RabbitMQ 3.10.8's reasons
_REFUSED: dict[Need, str] = {
    Need.MANAGEMENT: "Not management user",
    Need.POLICYMAKER: "User not authorised to access object",
    Need.MONITORING: "Not monitor user",
    Need.ADMINISTRATOR: "Not administrator user",
}
NO_VHOST_ACCESS = "User not authorised to access virtual host"
NOT_YOURS = "User not authorised to access object"

_NEEDS: web.AppKey[dict[Any, Need]] = web.AppKey("route_needs", dict)
_CALLER = "caller"


def add_route(app: web.Application, method: str, path: str, handler: Handler,
              need: Need) -> None:
    """Add a route and what it needs (GET also answers HEAD)."""
    if method == "GET":
        route = app.router.add_get(path, handler)
    else:
        route = app.router.add_route(method, path, handler)
    app.setdefault(_NEEDS, {})[(method, route.resource)] = need


def _need(request: web.Request) -> Need:
    method = "GET" if request.method == "HEAD" else request.method
    resource = request.match_info.route.resource
    if resource is None:  # no such path: the handler answers 404/405 once the caller is known
        return Need.MANAGEMENT
    return request.app.get(_NEEDS, {}).get((method, resource), Need.ADMINISTRATOR)


@dataclass(slots=True)
class Caller:
    """The authenticated user of a management request."""

    principal: Principal
    node: Node
    peer: str

    @property
    def name(self) -> str:
        return self.principal.name

    @property
    def tags(self) -> tuple[str, ...]:
        return self.principal.tags

    def has(self, need: Need) -> bool:
        return not _GRANTED_BY[need].isdisjoint(self.principal.tags)

    @property
    def is_admin(self) -> bool:
        return self.has(Need.ADMINISTRATOR)

    @property
    def is_monitor(self) -> bool:
        return self.has(Need.MONITORING)

    def sees(self, conn: Reader) -> bool:
        """Monitoring and administrators see every connection, others their own."""
        return self.is_monitor or conn.user == self.name

    def may_close(self, conn: Reader) -> bool:
        return self.is_admin or conn.user == self.name

    async def may_open(self, vhost: str) -> bool:
        auth = self.node.auth
        return bool(await auth.settle(auth.vhost_allowed, self.principal, vhost, self.peer))


def caller(request: web.Request) -> Caller:
    found: Caller = request[_CALLER]
    return found


async def visible_vhosts(request: web.Request, *, monitor_sees_all: bool = False
                         ) -> list[VHost]:
    """The vhost named in the path, or the vhosts a listing shows: all of them to
    administrators (and to monitoring users where `monitor_sees_all`, as RabbitMQ's
    /api/vhosts), otherwise those the caller may open over AMQP."""
    node = request.app[NODE]
    name = request.match_info.get("vhost")
    if name is not None:
        vhost = node.vhosts.get(name)
        if vhost is None:
            raise ApiError(404, "Not Found")
        return [vhost]
    who = caller(request)
    if who.is_admin or (monitor_sees_all and who.is_monitor):
        return list(node.vhosts.values())
    return [v for v in list(node.vhosts.values()) if await who.may_open(v.name)]


async def require(request: web.Request, vhost: str, kind: str, name: str,
                  permission: str, *, publishing: bool = False) -> None:
    """An AMQP permission, checked as a channel would: 401 with the AMQP reason if not (a
    publish answers 400 "403 ACCESS_REFUSED - ...", as RabbitMQ's does)."""
    who = caller(request)
    await _require_vhost(who, vhost)
    auth = who.node.auth
    try:
        await auth.settle(auth.check_resource, who.principal, vhost, kind, name, permission)
    except AccessRefused as exc:
        raise _refused(exc, publishing) from None


async def require_topic(request: web.Request, vhost: str, exchange: str, routing_keys: list[str],
                        permission: str, *, publishing: bool = False) -> None:
    """Topic authorisation of routing keys on a topic exchange (nothing to check on others)."""
    who = caller(request)
    auth = who.node.auth
    ex = who.node.vhosts[vhost].exchanges.get(exchange)
    if ex is None or ex.type != "topic":
        return
    try:
        for key in routing_keys:
            await auth.settle(auth.check_topic, who.principal, vhost, exchange, key, permission)
    except AccessRefused as exc:
        raise _refused(exc, publishing) from None


def _refused(exc: AccessRefused, publishing: bool) -> ApiError:
    if publishing:
        return ApiError(400, f"{exc.code} {exc.reply_text}")
    return ApiError(401, exc.reply_text)


async def require_declare(request: web.Request, vhost: VHost, kind: str, name: str,
                          arguments: dict[str, Any] | None) -> None:
    """What declaring needs (configure; read and write for a new queue's dead-letter or a new
    exchange's alternate exchange), checked before anything is created."""
    who = caller(request)
    await _require_vhost(who, vhost.name)
    existing = vhost.queues if kind == "queue" else vhost.exchanges
    auth = who.node.auth
    try:
        await auth.settle(auth.check_declare, who.principal, vhost.name, kind, name,
                          arguments, new=name not in existing)
    except AccessRefused as exc:
        raise ApiError(401, exc.reply_text) from None


async def _require_vhost(who: Caller, vhost: str) -> None:
    # RabbitMQ's management plugin acts through an AMQP connection of the caller's: no vhost
    # access, no write, whatever the tags
    if not await who.may_open(vhost):
        raise ApiError(401, "Access refused.")


# -- the middleware -------------------------------------------------------------------------------
_OPEN_PATHS = ("/", "/index.html", "/metrics")


def _loopback(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        return False


async def authenticate(node: Node, request: web.Request) -> Principal:
    """HTTP basic auth through the node's auth backends (counted as protocol 'http')."""
    header = request.headers.get("Authorization", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        raise ApiError(401, "Not_Authorized")
    try:
        name, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ApiError(401, "Not_Authorized") from exc
    if not sep:
        raise ApiError(401, "Not_Authorized")
    peer = request.remote or "?"
    try:
        result = node.auth.login(Credentials(name, password), mechanism="HTTP basic",
                                 peer=peer, loopback=_loopback(request), protocol="http")
        return result if isinstance(result, Principal) else await result
    except LoginRefused as exc:
        if exc.loopback_only:
            raise ApiError(401, f"User '{name}' can only log in via localhost") from None
        raise ApiError(401, "Not_Authorized") from None


@web.middleware
async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in _OPEN_PATHS or not request.path.startswith("/api"):
        return await handler(request)
    node = request.app[NODE]
    principal = await authenticate(node, request)
    who = Caller(principal, node, request.remote or "")
    if not who.has(Need.MANAGEMENT):
        raise ApiError(401, _REFUSED[Need.MANAGEMENT])
    need = _need(request)
    if not who.has(need):
        raise ApiError(401, _REFUSED[need])
    vhost = request.match_info.get("vhost")
    if (vhost is not None and not who.is_admin and vhost in node.vhosts
            and not await who.may_open(vhost)):
        raise ApiError(401, NO_VHOST_ACCESS)
    request[_CALLER] = who
    request["user"] = principal
    return await handler(request)
