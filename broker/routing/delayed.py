"""The delayed-message exchange (rabbitmq_delayed_message_exchange's `x-delayed-message`).

Its bindings and its routing are those of the type named by its `x-delayed-type` argument (a
declare without one, or naming no other type, is refused 406). A message whose `x-delay`
header is an integer above 0 is not routed now: `route` gives the destination that holds it
until it is due, which `hold` (set by the vhost) supplies for that delay. When it is due, the
holder publishes it to this exchange again with `x-delay` negated, as the plugin delivers it,
so it routes at once. Which queues it reaches is decided then, by the bindings of that time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from broker.message import Message
from broker.protocol.constants import PRECONDITION_FAILED
from broker.protocol.errors import ChannelError
from broker.routing.exchange import Binding, Exchange

__all__ = ["DelayedMessageExchange", "message_delay"]


def message_delay(message: Message) -> int:
    """The message's `x-delay` in ms; 0 when absent, not an integer, or not above 0."""
    value = message.headers.get("x-delay")
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, value)


def _delayed_type(arguments: dict[str, Any]) -> str | None:
    value = arguments.get("x-delayed-type")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


class DelayedMessageExchange(Exchange):
    __slots__ = ("held", "hold", "inner", "uses_routing_key")
    type_name = "x-delayed-message"

    def __init__(self, name: str, type: str = "x-delayed-message", **kwargs: Any) -> None:
        super().__init__(name, type, **kwargs)
        self.validate_arguments(self.arguments)
        inner_type = _delayed_type(self.arguments)
        assert inner_type is not None
        # the declared type's index; its own name so its errors and bindings read the same
        self.inner = Exchange(name, inner_type)
        self.uses_routing_key = self.inner.uses_routing_key
        # makes the destination that holds messages of one delay (ms) until due (set by the
        # vhost); None: every message routes at once
        self.hold: Callable[[DelayedMessageExchange, int], object] | None = None
        self.held: dict[int, object] = {}  # delay (ms) -> its holder, made on first use

    @staticmethod
    def validate_arguments(arguments: dict[str, Any]) -> None:
        inner = _delayed_type(arguments)
        if inner is None:
            raise ChannelError(
                PRECONDITION_FAILED, "Invalid argument, 'x-delayed-type' must be an existing "
                "exchange type")
        if inner not in Exchange._types or inner == DelayedMessageExchange.type_name:
            raise ChannelError(
                PRECONDITION_FAILED, f"Invalid argument, 'x-delayed-type' must be an existing "
                f"exchange type: {inner}")
        Exchange._types[inner].validate_arguments(arguments)

    def _validate(self, binding: Binding, arguments: dict[str, Any]) -> None:
        self.inner._validate(binding, arguments)

    def _add(self, binding: Binding, arguments: dict[str, Any]) -> None:
        self.inner.bind(binding.destination, binding.routing_key, arguments)

    def _remove(self, binding: Binding) -> None:
        self.inner.unbind(binding.destination, binding.routing_key, binding.arguments_dict())

    def route(self, routing_key: str, message: Message) -> Iterable[object]:
        if self.hold is not None:
            delay = message_delay(message)
            if delay:
                holder = self.held.get(delay)
                if holder is None:
                    holder = self.held[delay] = self.hold(self, delay)
                return (holder,)
        return self.inner.route(routing_key, message)
