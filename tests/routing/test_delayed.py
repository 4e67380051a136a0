"""The delayed-message exchange's routing with plain values: the declared type's rules, and a
holder per delay for messages with a positive x-delay."""

from __future__ import annotations

from typing import Any

import pytest

from broker.protocol.errors import ChannelError
from broker.routing import DelayedMessageExchange, make_exchange, message_delay

from .helpers import Q, msg


@pytest.mark.parametrize(
    ("headers", "delay"),
    [(None, 0), ({}, 0), ({"x-delay": 0}, 0), ({"x-delay": -10}, 0), ({"x-delay": "5"}, 0),
     ({"x-delay": True}, 0), ({"x-delay": 5}, 5)],
)
def test_message_delay(headers: dict[str, Any] | None, delay: int) -> None:
    assert message_delay(msg("k", headers=headers)) == delay


def test_routes_by_the_delayed_type_and_holds_per_delay() -> None:
    x = make_exchange("d", "x-delayed-message", arguments={"x-delayed-type": "topic"})
    assert type(x) is DelayedMessageExchange
    q = Q("q")
    x.bind(q, "a.#")
    assert list(x.route("a.b", msg("a.b", headers={"x-delay": 5}))) == [q]  # no holder: now
    made: list[int] = []

    def hold(ex: DelayedMessageExchange, delay: int) -> Q:
        made.append(delay)
        return Q(f"hold-{delay}")

    x.hold = hold
    h5 = next(iter(x.route("a.b", msg("a.b", headers={"x-delay": 5}))))
    assert next(iter(x.route("zzz", msg("zzz", headers={"x-delay": 5})))) is h5
    assert next(iter(x.route("a", msg("a", headers={"x-delay": 7})))).name == "hold-7"
    assert made == [5, 7] and set(x.held) == {5, 7}
    assert set(x.route("a.c", msg("a.c", headers={"x-delay": -5}))) == {q}
    assert set(x.route("b", msg("b"))) == set()
    x.unbind(q, "a.#")
    assert set(x.route("a.c", msg("a.c"))) == set()


def test_fanout_and_headers_ignore_the_key() -> None:
    assert not make_exchange("d", "x-delayed-message",
                             arguments={"x-delayed-type": "fanout"}).uses_routing_key
    x = make_exchange("d", "x-delayed-message", arguments={"x-delayed-type": "headers"})
    q = Q("q")
    x.bind(q, "", {"x-match": "any", "a": 1})
    assert set(x.route("", msg("", headers={"a": 1}))) == {q}
    with pytest.raises(ChannelError):
        x.bind(q, "", {"x-match": "nope"})


@pytest.mark.parametrize("arguments", [{}, {"x-delayed-type": "nope"},
                                       {"x-delayed-type": "x-delayed-message"}])
def test_bad_delayed_type(arguments: dict[str, Any]) -> None:
    with pytest.raises(ChannelError, match="x-delayed-type") as err:
        DelayedMessageExchange.validate_arguments(arguments)
    assert err.value.code == 406
