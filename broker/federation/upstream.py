"""Upstreams and upstream sets: the federation plugin's runtime parameters, checked before
anything is stored (a malformed one is refused whole, with the reason), and the rules on the
`x-received-from` and `x-bound-from` headers that stop messages and bindings going round a
loop. Plain code, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from broker.amqp_uri import UriInvalid, parse_uris
from broker.policy.definition import erlang_term

__all__ = [
    "ACK_MODES",
    "BINDING_HEADER",
    "ROUTING_HEADER",
    "ParameterInvalid",
    "Upstream",
    "already_seen",
    "binding_hops",
    "parse_upstream",
    "parse_upstream_set",
    "should_forward",
    "with_overrides",
]

ACK_MODES = ("on-confirm", "on-publish", "no-ack")
ROUTING_HEADER = "x-received-from"  # on messages: every link they crossed, newest first
BINDING_HEADER = "x-bound-from"  # on upstream bindings: where a binding came from, with hops

DEFAULT_PREFETCH = 1000  # the plugin's defaults
DEFAULT_RECONNECT_DELAY_S = 5.0
DEFAULT_MAX_HOPS = 1


class ParameterInvalid(ValueError):
    """An upstream or set refused; the text is the reason (the management API's 400)."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """One upstream as a link uses it: the parameter's keys with the plugin's defaults, after
    a set's per-member overrides. `exchange`/`queue` None: the downstream one's name."""

    name: str
    uris: tuple[str, ...]
    prefetch: int = DEFAULT_PREFETCH
    reconnect_delay_s: float = DEFAULT_RECONNECT_DELAY_S
    ack_mode: str = "on-confirm"
    trust_user_id: bool = False
    exchange: str | None = None
    queue: str | None = None
    max_hops: int = DEFAULT_MAX_HOPS
    expires: int | None = None
    message_ttl: int | None = None


def _number(key: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParameterInvalid(f"{key} should be a number, actually was {erlang_term(value)}")
    if value < minimum:
        raise ParameterInvalid(f"{key} should be at least {minimum:g}, actually was {value}")
    return value


def _binary(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ParameterInvalid(f"{key} should be binary, actually was {erlang_term(value)}")
    return value


def _ack_mode(key: str, value: Any) -> str:
    if value not in ACK_MODES:
        raise ParameterInvalid(f"{key} should be one of {', '.join(ACK_MODES)}, "
                               f"actually was {erlang_term(value)}")
    return str(value)


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParameterInvalid(f"{key} should be a boolean, actually was {erlang_term(value)}")
    return value


# key -> (Upstream field, check and convert); the keys an upstream and a set member share
_SHARED: dict[str, tuple[str, Any]] = {
    "exchange": ("exchange", _binary),
    "queue": ("queue", _binary),
    "prefetch-count": ("prefetch", lambda k, v: int(_number(k, v, 1))),
    "reconnect-delay": ("reconnect_delay_s", lambda k, v: _number(k, v, 0)),
    "max-hops": ("max_hops", lambda k, v: int(_number(k, v, 1))),
    "expires": ("expires", lambda k, v: int(_number(k, v, 1))),
    "message-ttl": ("message_ttl", lambda k, v: int(_number(k, v, 0))),
    "trust-user-id": ("trust_user_id", _boolean),
    "ack-mode": ("ack_mode", _ack_mode),
}


def _fields(value: Mapping[str, Any], known: set[str], what: str) -> dict[str, Any]:
    unknown = sorted(set(value) - known)
    if unknown:
        raise ParameterInvalid(f"Unrecognised terms {', '.join(unknown)} in {what}")
    out: dict[str, Any] = {}
    for key, raw in value.items():
        if key in _SHARED:
            attr, check = _SHARED[key]
            out[attr] = check(key, raw)
    return out


def parse_upstream(name: str, value: object) -> Upstream:
    """A `federation-upstream` parameter's value; ParameterInvalid with the reason."""
    if not isinstance(value, dict):
        raise ParameterInvalid("value must be a JSON object")
    if "uri" not in value:
        raise ParameterInvalid(f'Key "uri" not found in {name}')
    try:
        uris = parse_uris(value["uri"], "uri")
    except UriInvalid as exc:
        raise ParameterInvalid(str(exc)) from None
    return Upstream(name, uris, **_fields(value, {"uri", *_SHARED}, name))


def parse_upstream_set(name: str, value: object) -> list[dict[str, Any]]:
    """A `federation-upstream-set` value: a list of {"upstream": name, overrides...}; each
    member is checked as an upstream's keys are (its `uri` too, when it overrides one)."""
    if not isinstance(value, list):
        raise ParameterInvalid(f"{name} should be a list of upstreams")
    for member in value:
        if not isinstance(member, dict):
            raise ParameterInvalid(f"{name}: each member should be a JSON object")
        if "upstream" not in member:
            raise ParameterInvalid(f'Key "upstream" not found in {name}')
        _binary("upstream", member["upstream"])
        _fields(member, {"upstream", "uri", *_SHARED}, name)
        if "uri" in member:
            try:
                parse_uris(member["uri"], "uri")
            except UriInvalid as exc:
                raise ParameterInvalid(str(exc)) from None
    return value


def with_overrides(upstream: Upstream, member: Mapping[str, Any]) -> Upstream:
    """An upstream as a set member names it: the member's keys win (the plugin's bget)."""
    changes = _fields({k: v for k, v in member.items() if k not in ("upstream", "uri")},
                      set(_SHARED), upstream.name)
    if "uri" in member:
        changes["uris"] = parse_uris(member["uri"], "uri")
    return replace(upstream, **changes)


def _entries(headers: Mapping[str, Any] | None, key: str) -> list[Mapping[str, Any]]:
    value = (headers or {}).get(key)
    if not isinstance(value, list | tuple):
        return []
    return [e for e in value if isinstance(e, Mapping)]


def already_seen(cluster_name: str, vhost: str, entries: list[Mapping[str, Any]]) -> bool:
    """Has something (a message or a binding) already passed this broker's vhost?"""
    return any(e.get("cluster-name") == cluster_name and e.get("vhost") == vhost
               for e in entries)


def should_forward(headers: Mapping[str, Any] | None, max_hops: int, cluster_name: str,
                   vhost: str) -> bool:
    """The plugin's rule, applied where the message arrives: fewer links crossed than
    max-hops, and never this broker's vhost before (a loop)."""
    entries = _entries(headers, ROUTING_HEADER)
    return len(entries) < max_hops and not already_seen(cluster_name, vhost, entries)


def binding_hops(arguments: Mapping[str, Any], max_hops: int, upstream_name: str,
                 upstream_vhost: str) -> int:
    """How many more links a downstream binding may propagate over (0: not this one).
    Bindings travel against the messages, so each link counts down from the most restrictive
    max-hops met so far; one that came from the upstream itself goes no further."""
    entries = _entries(arguments, BINDING_HEADER)
    if not entries:
        return max_hops
    if already_seen(upstream_name, upstream_vhost, entries):
        return 0
    previous = entries[0].get("hops")
    previous = previous if isinstance(previous, int) else max_hops
    return max(0, min(previous - 1, max_hops))
