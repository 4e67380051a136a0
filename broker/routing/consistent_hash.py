"""The consistent-hash exchange (rabbitmq_consistent_hash_exchange's `x-consistent-hash`).

- A binding's key is its weight: an integer in text ("1", "20"); anything else is refused at
  bind time with the plugin's 406. A weight of 0 or less binds but takes no share.
- Each binding puts `weight` points on a 64-bit ring; a message goes to the destination of the
  first point at or after the hash of its value (wrapping round). Points are hashes of the
  destination's name, the binding and the point's number, so they are the same after a restart
  and a key keeps its queue while the bindings stay; adding or removing a binding moves only
  the keys whose nearest point it adds or takes away.
- The value hashed is the routing key (the first one only: CC/BCC keys are not hashed, as the
  plugin), or the header the `hash-header` argument names, or the property `hash-property`
  names (message_id, correlation_id, timestamp). A message without that header or property
  still routes: all such messages hash alike and go to one destination, as the plugin.
- `hash-header` with `hash-property`, or an unknown property, is refused at declare (406).

The plugin (3.10) maps a hash to a bucket with jump consistent hash and renumbers buckets when a
binding goes, which moves keys of bindings that stayed; a ring of points does not."""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable
from hashlib import blake2b
from typing import Any

from broker.message import Message
from broker.protocol.constants import PRECONDITION_FAILED
from broker.protocol.errors import ChannelError
from broker.routing.exchange import Binding, Exchange

__all__ = ["ConsistentHashExchange", "hash_point", "validate_hash_arguments"]

PROPERTIES = ("message_id", "correlation_id", "timestamp")
_WEIGHT = re.compile(r"[+-]?[0-9]+")  # what Erlang's list_to_integer accepts
_MISSING = b"\x00undefined"  # the hashed stand-in for an absent header or property


def hash_point(data: bytes) -> int:
    """A 64-bit position on the ring; stable across processes (unlike hash())."""
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "big")


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def validate_hash_arguments(arguments: dict[str, Any]) -> None:
    """The plugin's exchange validation: one hash source at most, a known property."""
    header = arguments.get("hash-header")
    prop = arguments.get("hash-property")
    if header is not None and prop is not None:
        raise ChannelError(
            PRECONDITION_FAILED, "hash-header and hash-property are mutually exclusive"
        )
    if prop is not None and _text(prop) not in PROPERTIES:
        raise ChannelError(PRECONDITION_FAILED, f"Unsupported property: {_text(prop) or prop}")


def _as_bytes(value: Any) -> bytes:
    if value is None:
        return _MISSING
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if hasattr(value, "timestamp"):  # pamqp decodes the timestamp property as a datetime
        return str(int(value.timestamp())).encode()
    return repr(value).encode()


def _dest_name(dest: object) -> str:
    kind = "exchange" if isinstance(dest, Exchange) else "queue"
    return f"{kind}:{getattr(dest, 'name', dest)}"


class ConsistentHashExchange(Exchange):
    __slots__ = ("_header", "_points", "_property", "_ring", "_ring_dests")
    type_name = "x-consistent-hash"
    uses_routing_key = False  # only the message's own routing key is hashed

    def __init__(self, name: str, type: str = "x-consistent-hash", **kwargs: Any) -> None:
        super().__init__(name, type, **kwargs)
        self._header = _text(self.arguments.get("hash-header"))
        self._property = _text(self.arguments.get("hash-property"))
        self._points: dict[Binding, list[int]] = {}
        self._ring: list[int] = []  # sorted point positions
        self._ring_dests: list[object] = []  # the destination of each position

    @staticmethod
    def validate_arguments(arguments: dict[str, Any]) -> None:
        validate_hash_arguments(arguments)

    def _validate(self, binding: Binding, arguments: dict[str, Any]) -> None:
        if not _WEIGHT.fullmatch(binding.routing_key):
            raise ChannelError(
                PRECONDITION_FAILED,
                f'The binding key must be an integer: <<"{binding.routing_key}">>',
            )

    def _add(self, binding: Binding, arguments: dict[str, Any]) -> None:
        seed = f"{_dest_name(binding.destination)}\0{binding.routing_key}\0{binding.arguments!r}"
        weight = max(0, int(binding.routing_key))
        self._points[binding] = [hash_point(f"{seed}\0{i}".encode()) for i in range(weight)]
        self._rebuild()

    def _remove(self, binding: Binding) -> None:
        del self._points[binding]
        self._rebuild()

    def _rebuild(self) -> None:
        # Ties (two equal 64-bit points) break by binding order; bindings change rarely.
        pairs = sorted(
            (p, i, b.destination)
            for i, (b, points) in enumerate(self._points.items())
            for p in points
        )
        self._ring = [p for p, _, _ in pairs]
        self._ring_dests = [d for _, _, d in pairs]

    def hashed_value(self, routing_key: str, message: Message) -> bytes:
        """The bytes this exchange hashes for `message`."""
        if self._header is not None:
            return _as_bytes(message.headers.get(self._header))
        if self._property is not None:
            return _as_bytes(getattr(message.properties, self._property, None))
        return _as_bytes(routing_key)

    def route(self, routing_key: str, message: Message) -> Iterable[object]:
        ring = self._ring
        if not ring:
            return ()
        i = bisect_left(ring, hash_point(self.hashed_value(routing_key, message)))
        return (self._ring_dests[i if i < len(ring) else 0],)
