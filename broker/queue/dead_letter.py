"""Dead-lettering, as RabbitMQ: a rejected, expired or overflowed message is republished to the
queue's x-dead-letter-exchange with an `x-death` history. Pure: builds the new message; the
queue routes it.

The new message's property block is the old one with x-death (and the x-first-death-* fields
when new) written into its headers, BCC taken out and, for an expired message, the expiration
removed (broker/protocol/properties.py `rewrite_properties`): what the publisher sent is copied
byte for byte, never decoded and encoded again, whatever its tables hold."""

from __future__ import annotations

import datetime
import struct
from typing import Any

from broker.message import Message
from broker.protocol.properties import encode_field_value, rewrite_properties

__all__ = ["EXPIRED", "MAXLEN", "REJECTED", "dead_letter", "is_cycle"]

REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"

_FIRST = ("x-first-death-reason", "x-first-death-queue", "x-first-death-exchange")


def dead_letter(
    msg: Message, queue: str, reason: str, dlx: str, dlrk: str | None
) -> Message:
    """The message to publish to `dlx`: same body, properties with an updated x-death.
    Raises ValueError for a property block that does not decode (the caller keeps the
    message where it was)."""
    src = msg.properties
    headers: dict[str, Any] = src.headers or {}
    routing_keys = [msg.routing_key, *_str_list(headers.get("CC"))]
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    # a client may have sent an x-death of its own: keep the entries that can be sent on
    deaths = [d for d in headers.get("x-death") or [] if isinstance(d, dict) and _encodable(d)]
    for i, death in enumerate(deaths):
        if _text(death.get("queue")) == queue and _text(death.get("reason")) == reason:
            death = dict(death)
            count = death.get("count", 1)
            death["count"] = (count if isinstance(count, int) else 1) + 1
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
        if reason == EXPIRED and src.expiration:
            entry["original-expiration"] = src.expiration
        deaths.insert(0, entry)
    add = {"x-death": encode_field_value(deaths)}
    for key, value in zip(_FIRST, (reason, queue, msg.exchange), strict=True):
        if key not in headers:
            add[key] = encode_field_value(value)
    props = rewrite_properties(
        msg.props,
        drop_headers=("BCC",),
        add_headers=add,
        # the message must not expire again on the way
        replace={"expiration": None} if reason == EXPIRED else None,
    )
    rk = dlrk if dlrk is not None else msg.routing_key
    return Message(dlx, rk, props, msg.body)


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


def _encodable(value: Any) -> bool:
    try:
        encode_field_value(value)
    except (TypeError, ValueError, OverflowError, struct.error):
        return False
    return True


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _str_list(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in value]
