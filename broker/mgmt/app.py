"""The management application: an aiohttp application in the broker's own process and loop.

Handlers read the node's live objects directly (no copies, no locks: one loop runs them all).
Every /api path needs HTTP basic auth through the node's auth backends and the tag its route
declares (broker/mgmt/authz.py). `/` (the page) and `/metrics` (as RabbitMQ's prometheus
plugin) are open. Each handler module adds its routes here; what they share is in http.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from broker.mgmt import (
    admin,
    api,
    authz,
    definitions,
    health,
    messages,
    metrics,
    parameters,
    policies,
    quorum,
    topic_permissions,
    user_limits,
)
from broker.mgmt.http import NODE, STATS, ApiError, json_response
from broker.mgmt.stats import Stats
from broker.protocol import constants as c
from broker.protocol.errors import AMQPError

if TYPE_CHECKING:
    from broker.node import Node
    from broker.server.listener import Listener

__all__ = ["build_app", "serve"]

log = structlog.get_logger("hare.mgmt")

PAGE = Path(__file__).with_name("static") / "index.html"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# An AMQP error raised by a vhost method, as an HTTP status (RabbitMQ's mapping).
_STATUS = {
    c.NOT_FOUND: 404,
    c.ACCESS_REFUSED: 403,
    c.PRECONDITION_FAILED: 400,
    c.RESOURCE_LOCKED: 400,
    c.COMMAND_INVALID: 400,
    c.NOT_ALLOWED: 400,
    c.INTERNAL_ERROR: 503,  # a cluster whose etcd cannot take a change now
}


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


@web.middleware
async def _caught_up(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every API request is answered from what the cluster's store held when it came (at
    most a second's wait; at once on a single node): a script's two requests may land on two
    workers of one server, and a queue, user, vhost or permission made through one a moment
    ago is listed and known by the other, as on every node of RabbitMQ's cluster. (AMQP's
    handshake asks only before it refuses: a login is far more frequent than a request.)"""
    if request.path.startswith("/api/"):
        await request.app[NODE].cluster.caught_up()
    return await handler(request)


@web.middleware
async def _cluster(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A change made over HTTP is answered once the cluster has it (a single node: at once);
    while the cluster cannot take changes they are refused with 503 before anything is done.
    Reads pass straight through (the aliveness test commits the queue it declares)."""
    if request.method not in ("PUT", "POST", "DELETE") or not request.path.startswith("/api"):
        return await handler(request)
    cluster = request.app[NODE].cluster
    await cluster.check_writable()
    response = await handler(request)
    await cluster.commit()
    return response


async def _page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(PAGE, headers={"Cache-Control": "no-cache"})


def build_app(node: Node, stats: Stats) -> web.Application:
    app = web.Application(middlewares=[_errors, _caught_up, authz.authorize, _cluster])
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
    parameters.add_routes(app)
    health.add_routes(app)
    topic_permissions.add_routes(app)
    user_limits.add_routes(app)
    quorum.add_routes(app)
    return app


async def serve(node: Node, stats: Stats, listeners: list[Listener]) -> web.AppRunner:
    """Serve the API on listeners the node has bound (HTTP, and HTTPS when one has TLS)."""
    runner = web.AppRunner(build_app(node, stats), access_log=None, handle_signals=False)
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
    for listener in listeners:
        log.info("management listener started", protocol=listener.protocol, port=listener.port,
                 host=listener.host or "*")
    return runner
