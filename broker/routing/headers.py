"""The headers exchange (rabbit_exchange_type_headers): match binding arguments to headers.

RabbitMQ's rules, kept exactly:
- `x-match` is "all" (the default when absent), "any", "all-with-x" or "any-with-x"; any other
  string, or a non-string, is refused at bind time (RabbitMQ: binding_invalid, 406).
- "x-match" itself never takes part in matching; other arguments starting with "x-" are ignored
  by all/any and matched like any other by all-with-x/any-with-x.
- A binding value of void (None) asks only that the header be present (with any value).
- Otherwise a header matches if present with an equal value (a header with a void value does
  not equal a non-void binding value).
- "all" with no arguments left to match routes everything; "any" with none routes nothing.
- The routing key is ignored, and a message without headers is matched against {}.

The binding's table is parsed once at bind time into a `HeadersSpec`; a publish decodes the
message's headers once (Message.headers is lazy and cached) and walks each binding's pairs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.message import Message
from broker.protocol.constants import PRECONDITION_FAILED
from broker.protocol.errors import ChannelError
from broker.routing.exchange import Binding, Exchange

__all__ = ["HeadersExchange", "HeadersSpec", "headers_match"]

_MODES = ("all", "any", "all-with-x", "any-with-x")


class HeadersSpec:
    """A binding's arguments ready for matching: the mode and the (key, value, void) triples."""

    __slots__ = ("match_all", "pairs")

    def __init__(self, arguments: dict[str, Any]) -> None:
        mode = validate_x_match(arguments)
        with_x = mode.endswith("-with-x")
        self.match_all = mode.startswith("all")
        # The bool flag keeps True from matching 1 (Erlang compares typed values: true =/= 1).
        self.pairs: tuple[tuple[str, Any, bool], ...] = tuple(
            (k, v, type(v) is bool)
            for k, v in arguments.items()
            if k != "x-match" and (with_x or not k.startswith("x-"))
        )

    def matches(self, headers: dict[str, Any]) -> bool:
        if self.match_all:
            for key, want, is_bool in self.pairs:
                if key not in headers:
                    return False
                if want is None:
                    continue  # void: presence is enough
                got = headers[key]
                if got != want or (type(got) is bool) is not is_bool:
                    return False
            return True
        for key, want, is_bool in self.pairs:
            if key in headers:
                if want is None:
                    return True
                got = headers[key]
                if got == want and (type(got) is bool) is is_bool:
                    return True
        return False


def validate_x_match(arguments: dict[str, Any]) -> str:
    """The x-match mode of a binding's arguments; ChannelError 406 if it is not a valid one."""
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode("utf-8", "replace")
    if not isinstance(mode, str):
        raise ChannelError(
            PRECONDITION_FAILED,
            f"Invalid x-match field type {type(mode).__name__} (value {mode!r}); expected longstr",
        )
    if mode not in _MODES:
        raise ChannelError(
            PRECONDITION_FAILED,
            f"Invalid x-match field value {mode!r}; expected all, any, all-with-x, or any-with-x",
        )
    return mode


def headers_match(arguments: dict[str, Any], headers: dict[str, Any]) -> bool:
    """One-off form of the rule (tests, tools); the exchange keeps parsed specs instead."""
    return HeadersSpec(arguments).matches(headers)


class HeadersExchange(Exchange):
    __slots__ = ("_specs",)
    type_name = "headers"
    uses_routing_key = False

    def __init__(self, name: str, type: str = "headers", **kwargs: Any) -> None:
        super().__init__(name, type, **kwargs)
        self._specs: dict[Binding, HeadersSpec] = {}

    def _validate(self, binding: Binding, arguments: dict[str, Any]) -> None:
        validate_x_match(arguments)

    def _add(self, binding: Binding, arguments: dict[str, Any]) -> None:
        self._specs[binding] = HeadersSpec(arguments)

    def _remove(self, binding: Binding) -> None:
        del self._specs[binding]

    def route(self, routing_key: str, message: Message) -> Iterable[object]:
        if not self._specs:
            return ()
        headers = message.headers
        return {b.destination for b, spec in self._specs.items() if spec.matches(headers)}
