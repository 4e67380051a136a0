"""What every management handler shares: the application's keys (the node, the stats), the
error answer and JSON in and out. No routes and no application here (broker/mgmt/app.py)."""

from __future__ import annotations

import datetime
import decimal
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.mgmt.stats import Stats

if TYPE_CHECKING:
    from broker.node import Node

__all__ = [
    "NODE",
    "STATS",
    "ApiError",
    "created_or_updated",
    "dumps",
    "json_response",
    "no_content",
    "read_json",
]

NODE: web.AppKey[Node] = web.AppKey("node")
STATS = web.AppKey("stats", Stats)


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
