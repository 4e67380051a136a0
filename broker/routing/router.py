"""Routing one publish through the exchange graph (rabbit_exchange:route/2, rabbit_basic).

`route(exchange, message, lookup)` returns the set of queue destinations:
- Routing keys: the message's routing key, then the longstr entries of the "CC" and "BCC"
  headers (sender-selected distribution); every exchange on the way routes with all of them. A
  CC/BCC header that is not an array is a 406 PRECONDITION_FAILED, as RabbitMQ. BCC must be
  removed from the message before delivery: that is the caller's job (rewrite_properties).
- Exchange-to-exchange: a destination that is an `Exchange` is routed through in turn. Each
  exchange is visited at most once per publish (the source counts as visited), so cycles end.
- Alternate exchange: when an exchange's own `route` matched nothing (for all keys), its
  `alternate_exchange` name is resolved with `lookup` and routed through like an e2e
  destination. An exchange that matched only other exchanges did match, so its alternate is not
  used even if those matched nothing (their own alternates apply). A missing alternate is
  skipped silently, as RabbitMQ.

The common publish (no CC/BCC header, no exchange destinations, something matched) costs one
`Exchange.route` call and the result set."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.message import Message
from broker.protocol.constants import PRECONDITION_FAILED
from broker.protocol.errors import ChannelError
from broker.routing.exchange import Exchange

__all__ = ["may_have_cc", "route", "routing_keys"]

_HEADERS_FLAG = 0x20  # high byte of the property flags: 0x2000 is "headers present"


def routing_keys(message: Message) -> list[str]:
    """The routing key followed by the CC and BCC keys (rabbit_basic:header_routes)."""
    keys = [message.routing_key]
    if not may_have_cc(message.props):
        return keys
    headers = message.headers
    for name in ("CC", "BCC"):
        value: Any = headers.get(name)
        if value is None:
            continue
        if not isinstance(value, list):
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid message: unacceptable_type_in_header {name} "
                f"({type(value).__name__}); expected array",
            )
        for item in value:
            # Only longstr entries count; pamqp gives str, or bytes when not UTF-8.
            if isinstance(item, str):
                keys.append(item)
            elif isinstance(item, bytes):
                keys.append(item.decode("utf-8", "surrogateescape"))
    return keys


def route(
    exchange: Exchange, message: Message, lookup: Callable[[str], Exchange | None]
) -> set[object]:
    """Queue destinations for `message` published to `exchange` (see the module doc)."""
    keys = routing_keys(message) if may_have_cc(message.props) else None
    if (keys is None or len(keys) == 1) and not exchange._exchange_dests:
        dests = exchange.route(message.routing_key, message)
        if dests:
            # Exchanges return either a fresh set (topic, headers) or an index dict that must
            # not leak out; only the fresh set may be handed over without a copy.
            return dests if type(dests) is set else set(dests)
        if exchange.alternate_exchange is None:
            return set()
    return _route_graph(exchange, message, keys or [message.routing_key], lookup)


def may_have_cc(props: bytes) -> bool:
    """Whether the raw properties may hold a CC or BCC header: the field names are searched in
    the bytes, so most publishes never decode their properties here (a false hit only costs
    the decode)."""
    return (
        len(props) >= 2
        and props[0] & _HEADERS_FLAG != 0
        and (b"\x02CC" in props or b"\x03BCC" in props)
    )


def _route_graph(
    exchange: Exchange,
    message: Message,
    keys: list[str],
    lookup: Callable[[str], Exchange | None],
) -> set[object]:
    result: set[object] = set()
    seen: set[Exchange] = {exchange}
    work = [exchange]
    while work:
        x = work.pop()
        matched = False
        # Fanout and headers ignore the key: one call covers every CC/BCC key.
        for key in keys if x.uses_routing_key else keys[:1]:
            for dest in x.route(key, message):
                matched = True
                if isinstance(dest, Exchange):
                    if dest not in seen:
                        seen.add(dest)
                        work.append(dest)
                else:
                    result.add(dest)
        if not matched and x.alternate_exchange is not None:
            alt = lookup(x.alternate_exchange)
            if alt is not None and alt not in seen:
                seen.add(alt)
                work.append(alt)
    return result
