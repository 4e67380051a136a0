"""The management listener: an aiohttp application in the broker's own process and loop.

Handlers read the node's live objects directly (no copies, no locks: one loop runs them all).
Every /api path needs HTTP basic auth against the broker's users: tag `administrator` may do
anything, `monitoring` may only read (GET/HEAD), as RabbitMQ. `/` (the page) and `/metrics`
(as RabbitMQ's prometheus plugin) are open."""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import ipaddress
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from broker.config import check_password
from broker.mgmt.stats import SAMPLE_INTERVAL_S, Stats
from broker.protocol import constants as c
from broker.protocol.errors import AMQPError

if TYPE_CHECKING:
    from broker.auth import User
    from broker.node import Node
    from broker.server.listener import Listener

__all__ = [
    "NODE",
    "STATS",
    "ApiError",
    "ManagementServer",
    "created_or_updated",
    "dumps",
    "json_response",
    "no_content",
    "read_json",
    "start_management",
]

log = structlog.get_logger("hare.mgmt")

NODE: web.AppKey[Node] = web.AppKey("node")
STATS = web.AppKey("stats", Stats)
PAGE = Path(__file__).with_name("static") / "index.html"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_OPEN_PATHS = ("/", "/index.html", "/metrics")
_READ_METHODS = ("GET", "HEAD", "OPTIONS")
# Reads that hand out password hashes or the access rules: administrators only, as RabbitMQ
_ADMIN_READS = ("/api/users", "/api/definitions", "/api/permissions")

# An AMQP error raised by a vhost method, as an HTTP status (RabbitMQ's mapping).
_STATUS = {
    c.NOT_FOUND: 404,
    c.ACCESS_REFUSED: 403,
    c.PRECONDITION_FAILED: 400,
    c.RESOURCE_LOCKED: 400,
    c.COMMAND_INVALID: 400,
    c.NOT_ALLOWED: 400,
}


class ApiError(Exception):
    """An error answer: status, RabbitMQ's `error` word and a human `reason`."""

    def __init__(self, status: int, reason: str, error: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.error = error or {400: "bad_request", 401: "not_authorised",
                               404: "Object Not Found"}.get(status, "error")


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def dumps(data: Any) -> str:
    return json.dumps(data, default=_default)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=dumps(data), status=status, content_type="application/json")


def no_content() -> web.Response:
    return web.Response(status=204)


def created_or_updated(created: bool) -> web.Response:
    return web.Response(status=201 if created else 204)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is {} (RabbitMQ allows it for PUT)."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "body must be a JSON object")
    return body


def _loopback(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        return False


def authenticate(node: Node, request: web.Request) -> User:
    header = request.headers.get("Authorization", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        raise ApiError(401, "Not_Authorized")
    try:
        name, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ApiError(401, "Not_Authorized") from exc
    user = node.auth.users.get(name)
    if not sep or user is None or not check_password(password, user.password_hash):
        raise ApiError(401, "Not_Authorized")
    if name in node.auth.loopback_users and not _loopback(request):
        raise ApiError(401, f"User '{name}' can only log in via localhost")
    return user


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        resp = json_response({"error": exc.error, "reason": exc.reason}, exc.status)
        if exc.status == 401:
            # without a realm header a browser's fetch() gets the 401 instead of a pop-up
            resp.headers["WWW-Authenticate"] = 'Basic realm="Hare Management"'
            if request.headers.get("X-Requested-With") == "XMLHttpRequest":
                del resp.headers["WWW-Authenticate"]
        return resp
    except AMQPError as exc:
        status = _STATUS.get(exc.code, 400)
        return json_response({"error": "bad_request", "reason": exc.text}, status)


def _admin_read(path: str) -> bool:
    return path.startswith(_ADMIN_READS) or path.endswith("/permissions")


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in _OPEN_PATHS or not request.path.startswith("/api"):
        return await handler(request)
    user = authenticate(request.app[NODE], request)
    tags = set(user.tags)
    if "administrator" not in tags:
        if "monitoring" not in tags:
            raise ApiError(401, "Not management user")
        if request.method not in _READ_METHODS or _admin_read(request.path):
            raise ApiError(401, "Not administrator user")
    request["user"] = user
    return await handler(request)


async def _page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(PAGE, headers={"Cache-Control": "no-cache"})


class ManagementServer:
    """The running HTTP and/or HTTPS listeners of the API."""

    def __init__(self, runner: web.AppRunner, stats: Stats) -> None:
        self._runner = runner
        self.stats = stats

    async def stop(self) -> None:
        await self.stats.stop()
        await self._runner.cleanup()


def build_app(node: Node, stats: Stats) -> web.Application:
    from broker.mgmt import admin, api, definitions, health, messages, metrics, policies

    app = web.Application(middlewares=[_errors, _auth])
    app[NODE] = node
    app[STATS] = stats
    app.router.add_get("/", _page)
    app.router.add_get("/index.html", _page)
    metrics.add_routes(app)
    api.add_routes(app)
    admin.add_routes(app)
    definitions.add_routes(app)
    messages.add_routes(app)
    policies.add_routes(app)
    health.add_routes(app)
    return app


async def start_management(node: Node, listeners: list[Listener],
                           *, sample_interval: float = SAMPLE_INTERVAL_S) -> ManagementServer:
    """Serve the API on listeners the node has bound (HTTP, and HTTPS when one has TLS)."""
    stats = Stats(node, sample_interval)
    app = build_app(node, stats)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        for listener in listeners:
            for sock in listener.sockets:
                # a short shutdown grace: open HTTP requests must not hold up the broker's stop
                site = web.SockSite(runner, sock, shutdown_timeout=2.0, ssl_context=listener.tls)
                await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    stats.start()
    for listener in listeners:
        log.info("management listener started", protocol=listener.protocol, port=listener.port,
                 host=listener.host or "*")
    return ManagementServer(runner, stats)
