"""Dead-lettering, as RabbitMQ: a rejected, expired or overflowed message is republished to the
queue's x-dead-letter-exchange with an `x-death` history. Pure: builds the new message; the
queue routes it."""

from __future__ import annotations

import datetime
from typing import Any

from pamqp import commands

from broker.message import Message

__all__ = ["EXPIRED", "MAXLEN", "REJECTED", "dead_letter", "is_cycle"]

REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"


def dead_letter(
    msg: Message, queue: str, reason: str, dlx: str, dlrk: str | None
) -> Message:
    """The message to publish to `dlx`: same body, properties with an updated x-death."""
    src = msg.properties
    props = commands.Basic.Properties(
        **{name: getattr(src, name) for name in src.__slots__}  # type: ignore[attr-defined]
    )
    headers: dict[str, Any] = dict(props.headers or {})
    routing_keys = [msg.routing_key, *_str_list(headers.get("CC"))]
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0, tzinfo=None)
    deaths = [d for d in headers.get("x-death") or [] if isinstance(d, dict)]
    for i, death in enumerate(deaths):
        if death.get("queue") == queue and death.get("reason") == reason:
            death = dict(death)
            death["count"] = int(death.get("count", 1)) + 1
            death["time"] = now
            death["routing-keys"] = routing_keys
            deaths.pop(i)
            deaths.insert(0, death)
            break
    else:
        entry: dict[str, Any] = {
            "count": 1,
            "reason": reason,
            "queue": queue,
            "time": now,
            "exchange": msg.exchange,
            "routing-keys": routing_keys,
        }
        if reason == EXPIRED and props.expiration:
            entry["original-expiration"] = props.expiration
        deaths.insert(0, entry)
    headers["x-death"] = deaths
    headers.setdefault("x-first-death-reason", reason)
    headers.setdefault("x-first-death-queue", queue)
    headers.setdefault("x-first-death-exchange", msg.exchange)
    headers.pop("BCC", None)
    props.headers = headers
    if reason == EXPIRED:
        props.expiration = None  # the message must not expire again on the way
    out = msg.with_properties(props)
    out.exchange = dlx
    out.routing_key = dlrk if dlrk is not None else msg.routing_key
    return out


def is_cycle(queue: str, deaths: list[Any]) -> bool:
    """Whether dead-lettering a message with this x-death history (newest first) to `queue`
    closes a fully automatic cycle: `queue` is in the history and no death since (inclusive)
    was a rejection. RabbitMQ drops the message for such a queue rather than loop forever."""
    for death in deaths:
        if not isinstance(death, dict):
            continue
        if _text(death.get("reason")) == REJECTED:
            return False
        if _text(death.get("queue")) == queue:
            return True
    return False


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _str_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [v.decode() if isinstance(v, bytes) else str(v) for v in value]
