"""A shovel's definition: the rabbitmq_shovel plugin's keys, checked before anything is stored
or started, so a malformed one is refused whole with the plugin's kind of reason (its texts
where it has one: rabbit_shovel_parameters). Static shovels from the config file use the same
keys and the same checks (`check_static`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from broker.config import ConfigError, ShovelSpec

__all__ = ["ACK_MODES", "ParameterInvalid", "ShovelDefinition", "check_static",
           "parse_definition"]

ACK_MODES = ("on-confirm", "on-publish", "no-ack")
_KNOWN = {
    "src-uri", "src-queue", "src-exchange", "src-exchange-key", "src-prefetch-count",
    "src-delete-after", "src-protocol", "dest-uri", "dest-queue", "dest-exchange",
    "dest-exchange-key", "dest-protocol", "ack-mode", "reconnect-delay",
    "prefetch-count", "delete-after",  # the pre-3.7 names, still accepted by the plugin
}


class ParameterInvalid(ValueError):
    """A definition refused; the text is the reason (the management API's 400)."""


DEFAULT_PREFETCH = 1000  # the plugin's default
DEFAULT_RECONNECT_DELAY_S = 5.0  # the plugin's default
MAX_PREFETCH = 65535  # basic.qos's prefetch-count is a short


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
        problem = _uri_problem(uri)
        if problem:
            raise ParameterInvalid(f'{key}: "{uri}" not a valid URI: {problem}')
    return tuple(uris)


def _uri_problem(uri: str) -> str | None:
    """What amqp_uri:parse would refuse: another scheme, a port that is no port, a broken
    host. Query parameters are left to the client."""
    try:
        parts = urlsplit(uri)
        port = parts.port  # raises on a port that is no number or out of range
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("amqp", "amqps"):
        return f"unexpected URI scheme {parts.scheme!r} (amqp or amqps)"
    if port == 0:
        return "port 0"
    if parts.path.count("/") > 1:
        return "the vhost must be one path segment (%2F for /)"
    return None


def _str(value: dict[str, Any], key: str) -> str | None:
    raw = value.get(key)
    if raw is not None and not isinstance(raw, str):
        raise ParameterInvalid(f"{key} must be a string")
    return raw


def _name(value: dict[str, Any], key: str) -> str | None:
    name = _str(value, key)
    if name is not None and len(name.encode()) > 255:
        raise ParameterInvalid(f"{key}: a queue or exchange name is at most 255 bytes")
    return name


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
        raise ParameterInvalid(f"Unrecognised terms [{', '.join(unknown)}] in the shovel")
    for side in ("src-protocol", "dest-protocol"):
        if value.get(side, "amqp091") != "amqp091":
            raise ParameterInvalid(f"{side}: only amqp091 is supported")
    src_queue, src_exchange = _name(value, "src-queue"), _name(value, "src-exchange")
    if src_queue is None and src_exchange is None:
        raise ParameterInvalid("Must specify 'src-exchange' or 'src-queue'")
    if src_queue is not None and src_exchange is not None:
        raise ParameterInvalid("Cannot specify 'src-exchange' and 'src-queue'")
    dest_queue, dest_exchange = _name(value, "dest-queue"), _name(value, "dest-exchange")
    if dest_queue is not None and dest_exchange is not None:
        raise ParameterInvalid("Cannot specify 'dest-exchange' and 'dest-queue'")
    ack_mode = value.get("ack-mode", "on-confirm")
    if ack_mode not in ACK_MODES:
        raise ParameterInvalid(f"ack-mode should be one of {', '.join(ACK_MODES)}, "
                               f"actually was {ack_mode!r}")
    delete_after = value.get("src-delete-after", value.get("delete-after", "never"))
    if delete_after not in ("never", "queue-length") and (
            isinstance(delete_after, bool) or not isinstance(delete_after, int)
            or delete_after < 0):
        raise ParameterInvalid('src-delete-after should be number, "never" or "queue-length", '
                               f"actually was {delete_after!r}")
    if delete_after == "queue-length" and src_queue is None:
        raise ParameterInvalid("src-delete-after queue-length needs src-queue")
    if isinstance(delete_after, int) and ack_mode == "no-ack":
        # without acks the shovel cannot stop the source at the count
        raise ParameterInvalid("Cannot specify 'no-ack' and numerical 'delete-after'")
    prefetch = value.get("src-prefetch-count", value.get("prefetch-count", DEFAULT_PREFETCH))
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not (
            0 <= prefetch <= MAX_PREFETCH):
        raise ParameterInvalid(f"src-prefetch-count must be an integer from 0 (no limit) to "
                               f"{MAX_PREFETCH}, not {prefetch!r}")
    return ShovelDefinition(
        src_uris=_uris(value, "src-uri"),
        src_queue=src_queue,
        src_exchange=src_exchange,
        src_exchange_key=_str(value, "src-exchange-key") or "",
        dest_uris=_uris(value, "dest-uri"),
        dest_queue=dest_queue,
        dest_exchange=dest_exchange,
        dest_exchange_key=_str(value, "dest-exchange-key"),
        ack_mode=ack_mode,
        delete_after=delete_after,
        prefetch=prefetch,
        reconnect_delay_s=_number(value, "reconnect-delay", DEFAULT_RECONNECT_DELAY_S,
                                  minimum=0),
    )


def check_static(specs: tuple[ShovelSpec, ...]) -> list[tuple[str, ShovelDefinition]]:
    """The config file's [[shovels]], each checked as a dynamic definition is; the first bad
    one is a ConfigError naming it, so hare-server refuses to start as for any bad key."""
    checked = []
    for index, spec in enumerate(specs):
        try:
            checked.append((spec.name, parse_definition(spec.value)))
        except ParameterInvalid as exc:
            raise ConfigError(f"config file: shovels: entry {index + 1} (shovel "
                              f"{spec.name!r}): {exc}") from None
    return checked
