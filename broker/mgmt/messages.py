"""Publishing and getting messages over HTTP, for debugging as in RabbitMQ's management UI:

    POST /api/exchanges/{vhost}/{name}/publish   -> {"routed": true}
    POST /api/queues/{vhost}/{name}/get          -> [{"payload": ..., "properties": ...}, ...]

Not for production traffic (no flow control), as RabbitMQ warns too. A publish is routed like
a channel's (alternate exchanges included) and handed to each queue's mailbox the way
dead-lettering does it; the answer waits, as RabbitMQ's waits for its publisher confirm, until
every queue has it (a queue on another worker or node too), so a get right after finds it.
Both need what a channel would: write on the exchange (and on every routing key, CC and BCC
included, of a topic exchange with topic permissions) and a `user_id` that is the caller's
own; read on the queue."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pamqp import commands

from broker.flow.credit_flow import CreditFlow
from broker.message import Message, encode_properties
from broker.mgmt.api import DEFAULT_EXCHANGE_ALIAS, vhost_of
from broker.mgmt.authz import Need, add_route, caller, require, require_topic
from broker.mgmt.http import NODE, ApiError, dumps, json_response, read_json
from broker.protocol.errors import AMQPError
from broker.protocol.properties import check_properties
from broker.routing.router import routing_keys

if TYPE_CHECKING:
    from broker.queue.amqqueue import AMQQueue

__all__ = ["add_routes"]

# RabbitMQ's JSON name -> pamqp's attribute
_PROPERTIES = {
    "content_type": "content_type", "content_encoding": "content_encoding",
    "headers": "headers", "delivery_mode": "delivery_mode", "priority": "priority",
    "correlation_id": "correlation_id", "reply_to": "reply_to", "expiration": "expiration",
    "message_id": "message_id", "timestamp": "timestamp", "type": "message_type",
    "user_id": "user_id", "app_id": "app_id",
}
_ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true",
             "reject_requeue_false")


_CONFIRM_WAIT = 5.0  # s; past it the answer goes anyway (a queue's home that stopped answering)


class _Confirmed:
    """The publishing side of one HTTP publish: done once every queue it went to has
    confirmed, refused or lost it."""

    def __init__(self, queues: int) -> None:
        self.credit_flow = CreditFlow(self)
        self.left = queues
        self.done = asyncio.get_running_loop().create_future()

    def _settle(self, n: int) -> None:
        self.left -= n
        if self.left <= 0 and not self.done.done():
            self.done.set_result(None)

    def queue_confirmed(self, queue: Any, seqs: list[int], rejected: list[int]) -> None:
        self._settle(len(seqs) + len(rejected))

    def publishes_lost(self, queue: Any, items: list[tuple[Message, int]]) -> None:
        self._settle(len(items))


def _properties(raw: object) -> commands.Basic.Properties:
    if not isinstance(raw, dict):
        raise ApiError(400, "properties must be a JSON object")
    unknown = sorted(set(raw) - set(_PROPERTIES))
    if unknown:
        raise ApiError(400, f"unknown properties: {', '.join(unknown)}")
    values = {_PROPERTIES[k]: v for k, v in raw.items()}
    if isinstance(values.get("timestamp"), int):
        values["timestamp"] = datetime.datetime.fromtimestamp(values["timestamp"],
                                                              datetime.UTC)
    try:
        return commands.Basic.Properties(**values)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, f"bad properties: {exc}") from exc


def _properties_json(msg: Message) -> dict[str, Any]:
    try:
        props = msg.properties
    except ValueError as exc:  # stored before the channel checked every publish's block
        return {"error": f"properties do not decode: {exc}"}
    out: dict[str, Any] = {}
    for name, attr in _PROPERTIES.items():
        value = getattr(props, attr, None)
        if value is None:
            continue
        if isinstance(value, datetime.datetime):
            value = int(value.timestamp())
        out[name] = value
    return out


async def publish(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    name = request.match_info["name"]
    ex = vhost.exchanges.get("" if name == DEFAULT_EXCHANGE_ALIAS else name)
    if ex is None:
        raise ApiError(404, "Not Found")
    body = await read_json(request)
    routing_key = body.get("routing_key", "")
    payload = body.get("payload", "")
    if not isinstance(routing_key, str) or not isinstance(payload, str):
        raise ApiError(400, "routing_key and payload must be strings")
    encoding = body.get("payload_encoding", "string")
    if encoding == "string":
        data = payload.encode()
    elif encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise ApiError(400, f"payload is not base64: {exc}") from exc
    else:
        raise ApiError(400, "payload_encoding must be 'string' or 'base64'")
    props = _properties(body.get("properties") or {})
    await require(request, vhost.name, "exchange", ex.name, "write", publishing=True)
    who = caller(request)
    if props.user_id is not None and props.user_id != who.name \
            and "impersonator" not in who.tags:
        raise ApiError(400, f"406 PRECONDITION_FAILED - user_id property set to "
                            f"'{props.user_id}' but authenticated user was '{who.name}'")
    try:
        raw = encode_properties(props)
        check_properties(raw)  # what a channel's publish must pass
    except (TypeError, ValueError) as exc:
        raise ApiError(400, f"bad properties: {exc}") from exc
    msg = Message(ex.name, routing_key, raw, data)
    try:
        keys = routing_keys(msg)
    except AMQPError as exc:  # a CC or BCC header that is not an array
        raise ApiError(400, f"{exc.code} {exc.reply_text}") from None
    await require_topic(request, vhost.name, ex.name, keys, "write", publishing=True)
    queues = list(vhost.route(ex, msg))
    if queues:
        publisher = _Confirmed(len(queues))
        for q in queues:
            q.post_publishes(publisher, [(msg, 1)])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(publisher.done, _CONFIRM_WAIT)
    return json_response({"routed": bool(queues)})


async def get(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    q = vhost.queues.get(request.match_info["name"])
    if q is None:
        raise ApiError(404, "Not Found")
    await require(request, vhost.name, "queue", q.name, "read")
    body = await read_json(request)
    count = body.get("count", 1)
    ackmode = body.get("ackmode", "ack_requeue_true")
    encoding = body.get("encoding", "auto")
    truncate = body.get("truncate")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ApiError(400, "count must be a positive integer")
    if ackmode not in _ACKMODES:
        raise ApiError(400, f"ackmode must be one of {', '.join(_ACKMODES)}")
    if encoding not in ("auto", "base64"):
        raise ApiError(400, "encoding must be 'auto' or 'base64'")
    taken: list[int] = []
    try:
        text = dumps(await _take(q, count, encoding, truncate, taken))
    except BaseException:
        q.requeue(taken)  # whatever went wrong, what was taken goes back
        raise
    if taken:
        if ackmode == "ack_requeue_true" or ackmode == "reject_requeue_true":
            q.requeue(taken)
        elif ackmode == "ack_requeue_false":
            q.ack(taken)
        else:
            q.reject(taken, False)  # dead-lettered if the queue has a DLX
    return web.Response(text=text, content_type="application/json")


async def _take(q: AMQQueue, count: int, encoding: str, truncate: Any,
          taken: list[int]) -> list[dict[str, Any]]:
    """Up to `count` messages as JSON objects; their seq_ids go to `taken` as they are got."""
    out: list[dict[str, Any]] = []
    for _ in range(count):
        got = await q.get(True)
        if got is None:
            break
        (seq, msg, redelivered, _), remaining = got
        taken.append(seq)
        data = msg.body if truncate is None else msg.body[: int(truncate)]
        text: str | None = None
        if encoding == "auto":
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        out.append({
            "payload_bytes": len(msg.body),
            "redelivered": redelivered,
            "exchange": msg.exchange,
            "routing_key": msg.routing_key,
            "message_count": remaining,
            "properties": _properties_json(msg),
            "payload": text if text is not None else base64.b64encode(data).decode(),
            "payload_encoding": "string" if text is not None else "base64",
        })
    return out


def add_routes(app: web.Application) -> None:
    add_route(app, "POST", "/api/exchanges/{vhost}/{name}/publish", publish, Need.MANAGEMENT)
    add_route(app, "POST", "/api/queues/{vhost}/{name}/get", get, Need.MANAGEMENT)
