"""A dynamic shovel's definition: the rabbitmq_shovel plugin's keys, checked before anything
is stored or started, so a malformed one is refused whole with the plugin's kind of reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ACK_MODES", "ParameterInvalid", "ShovelDefinition", "parse_definition"]

ACK_MODES = ("on-confirm", "on-publish", "no-ack")
_KNOWN = {
    "src-uri", "src-queue", "src-exchange", "src-exchange-key", "src-prefetch-count",
    "src-delete-after", "src-protocol", "dest-uri", "dest-queue", "dest-exchange",
    "dest-exchange-key", "dest-protocol", "ack-mode", "reconnect-delay",
}


class ParameterInvalid(ValueError):
    """A definition refused; the text is the reason (the management API's 400)."""


DEFAULT_PREFETCH = 1000  # the plugin's default
DEFAULT_RECONNECT_DELAY_S = 5.0  # the plugin's default


@dataclass(frozen=True, slots=True)
class ShovelDefinition:
    src_uris: tuple[str, ...]
    src_queue: str | None
    src_exchange: str | None
    src_exchange_key: str
    dest_uris: tuple[str, ...]
    dest_queue: str | None
    dest_exchange: str | None
    dest_exchange_key: str | None  # None: the message's own routing key
    ack_mode: str
    delete_after: int | str  # "never", "queue-length" or a count
    prefetch: int
    reconnect_delay_s: float


def _uris(value: dict[str, Any], key: str) -> tuple[str, ...]:
    raw = value.get(key)
    uris = [raw] if isinstance(raw, str) else raw
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise ParameterInvalid(f"{key}: a URI or a non-empty list of URIs is required")
    for uri in uris:
        if urlsplit(uri).scheme not in ("amqp", "amqps"):
            raise ParameterInvalid(f"{key}: {uri!r} is not an amqp:// or amqps:// URI")
    return tuple(uris)


def _str(value: dict[str, Any], key: str) -> str | None:
    raw = value.get(key)
    if raw is not None and not isinstance(raw, str):
        raise ParameterInvalid(f"{key} must be a string")
    return raw


def _number(value: dict[str, Any], key: str, default: float, *, minimum: float) -> float:
    raw = value.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw < minimum:
        raise ParameterInvalid(f"{key} must be a number >= {minimum}")
    return raw


def parse_definition(value: object) -> ShovelDefinition:
    if not isinstance(value, dict):
        raise ParameterInvalid("value must be a JSON object")
    unknown = sorted(set(value) - _KNOWN)
    if unknown:
        raise ParameterInvalid(f"unrecognised shovel parameters: {', '.join(unknown)}")
    for side in ("src-protocol", "dest-protocol"):
        if value.get(side, "amqp091") != "amqp091":
            raise ParameterInvalid(f"{side}: only amqp091 is supported")
    src_queue, src_exchange = _str(value, "src-queue"), _str(value, "src-exchange")
    if (src_queue is None) == (src_exchange is None):
        raise ParameterInvalid("exactly one of src-queue and src-exchange is required")
    dest_queue, dest_exchange = _str(value, "dest-queue"), _str(value, "dest-exchange")
    if dest_queue is not None and dest_exchange is not None:
        raise ParameterInvalid("dest-queue and dest-exchange are mutually exclusive")
    ack_mode = value.get("ack-mode", "on-confirm")
    if ack_mode not in ACK_MODES:
        raise ParameterInvalid(f"ack-mode must be one of {', '.join(ACK_MODES)}")
    delete_after = value.get("src-delete-after", "never")
    if delete_after not in ("never", "queue-length") and (
            isinstance(delete_after, bool) or not isinstance(delete_after, int)
            or delete_after < 0):
        raise ParameterInvalid("src-delete-after must be never, queue-length or a count")
    if delete_after == "queue-length" and src_queue is None:
        raise ParameterInvalid("src-delete-after queue-length needs src-queue")
    return ShovelDefinition(
        src_uris=_uris(value, "src-uri"),
        src_queue=src_queue,
        src_exchange=src_exchange,
        src_exchange_key=_str(value, "src-exchange-key") or "#",
        dest_uris=_uris(value, "dest-uri"),
        dest_queue=dest_queue,
        dest_exchange=dest_exchange,
        dest_exchange_key=_str(value, "dest-exchange-key"),
        ack_mode=ack_mode,
        delete_after=delete_after,
        prefetch=int(_number(value, "src-prefetch-count", DEFAULT_PREFETCH, minimum=1)),
        reconnect_delay_s=_number(value, "reconnect-delay", DEFAULT_RECONNECT_DELAY_S,
                                  minimum=0),
    )
