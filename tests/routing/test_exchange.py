from __future__ import annotations

import pytest

from broker.routing import (
    Binding,
    DirectExchange,
    Exchange,
    FanoutExchange,
    HeadersExchange,
    TopicExchange,
    make_exchange,
)

from .helpers import Q, msg


@pytest.mark.parametrize(
    ("type_", "cls"),
    [
        ("direct", DirectExchange),
        ("fanout", FanoutExchange),
        ("topic", TopicExchange),
        ("headers", HeadersExchange),
    ],
)
def test_factory_builds_each_type(type_: str, cls: type[Exchange]) -> None:
    x = make_exchange("x", type_, durable=True, auto_delete=True, internal=True, arguments={"a": 1})
    assert type(x) is cls
    assert (x.name, x.type, x.durable, x.auto_delete, x.internal) == ("x", type_, True, True, True)
    assert x.arguments == {"a": 1}
    assert type(Exchange("y", type_)) is cls


def test_unknown_type_is_value_error() -> None:
    with pytest.raises(ValueError, match="unknown exchange type x-nope"):
        make_exchange("x", "x-nope")
    with pytest.raises(ValueError, match="unknown exchange type nope"):
        Exchange("x", "nope")


def test_alternate_exchange_from_arguments() -> None:
    assert make_exchange("x", "direct").alternate_exchange is None
    x = make_exchange("x", "direct", arguments={"alternate-exchange": "ae"})
    assert x.alternate_exchange == "ae"
    assert (
        make_exchange("x", "fanout", arguments={"alternate-exchange": b"ae"}).alternate_exchange
        == "ae"
    )


def test_direct_exact_match_only() -> None:
    x = make_exchange("d", "direct")
    q1, q2, q3 = Q("1"), Q("2"), Q("3")
    x.bind(q1, "a")
    x.bind(q2, "a")
    x.bind(q3, "b")
    assert set(x.route("a", msg("a"))) == {q1, q2}
    assert set(x.route("b", msg("b"))) == {q3}
    assert set(x.route("A", msg("A"))) == set()
    assert set(x.route("", msg(""))) == set()
    assert set(x.route("a.b", msg("a.b"))) == set()


def test_direct_empty_key_binding() -> None:
    x = make_exchange("d", "direct")
    q = Q("q")
    x.bind(q, "")
    assert set(x.route("", msg(""))) == {q}


def test_fanout_ignores_key() -> None:
    x = make_exchange("f", "fanout")
    q1, q2 = Q("1"), Q("2")
    x.bind(q1, "a")
    x.bind(q2, "")
    assert set(x.route("anything", msg("anything"))) == {q1, q2}
    assert set(x.route("", msg(""))) == {q1, q2}


def test_bind_is_idempotent_and_identity_includes_arguments() -> None:
    x = make_exchange("d", "direct")
    q = Q("q")
    assert x.bind(q, "k") is True
    assert x.bind(q, "k") is False
    assert x.bind(q, "k", {}) is False  # no arguments and {} are the same table
    assert x.bind(q, "k", {"a": 1}) is True
    assert x.bind(q, "k", {"a": 1}) is False
    assert x.bind(q, "k", {"a": 2}) is True
    assert len(x.bindings()) == 3
    # three bindings, one copy
    assert list(x.route("k", msg("k"))) == [q]
    assert x.unbind(q, "k", {"a": 1}) is True
    assert x.unbind(q, "k", {"a": 1}) is False
    assert list(x.route("k", msg("k"))) == [q]  # two bindings still lead there
    assert x.unbind(q, "k") is True
    assert x.unbind(q, "k", {"a": 2}) is True
    assert list(x.route("k", msg("k"))) == []
    assert not x.has_bindings()


def test_argument_order_and_nesting_do_not_change_identity() -> None:
    x = make_exchange("f", "fanout")
    q = Q("q")
    assert x.bind(q, "", {"a": [1, 2], "b": {"y": 1, "x": 2}})
    assert not x.bind(q, "", {"b": {"x": 2, "y": 1}, "a": [1, 2]})
    assert x.bind(q, "", {"a": [2, 1], "b": {"x": 2, "y": 1}})
    assert x.bindings()[0].arguments_dict() == {"a": [1, 2], "b": {"x": 2, "y": 1}}


def test_binding_record_and_listing() -> None:
    x = make_exchange("src", "topic")
    q = Q("q")
    x.bind(q, "a.*", {"k": "v"})
    (b,) = x.bindings()
    assert b == Binding("src", q, "a.*", (("k", "v"),))
    assert hash(b) == hash(Binding("src", q, "a.*", (("k", "v"),)))
    assert b.arguments_dict() == {"k": "v"}
    with pytest.raises(AttributeError):
        b.routing_key = "other"  # type: ignore[misc]


@pytest.mark.parametrize("type_", ["direct", "fanout", "topic", "headers"])
def test_unbind_all_removes_only_that_destination(type_: str) -> None:
    x = make_exchange("x", type_)
    q1, q2 = Q("1"), Q("2")
    x.bind(q1, "a")
    x.bind(q1, "b", {"z": 1})
    x.bind(q2, "a")
    removed = x.unbind_all(q1)
    assert {(b.routing_key, b.arguments) for b in removed} == {("a", ()), ("b", (("z", 1),))}
    assert x.unbind_all(q1) == []
    assert [b.destination for b in x.bindings()] == [q2]
    assert set(x.route("a", msg("a"))) == {q2}
    assert set(x.route("b", msg("b"))) <= {q2}
    assert x.has_bindings()
    x.unbind_all(q2)
    assert not x.has_bindings()
    assert set(x.route("a", msg("a"))) == set()


def test_has_bindings() -> None:
    x = make_exchange("x", "fanout")
    assert not x.has_bindings()
    x.bind(Q("q"), "")
    assert x.has_bindings()


def test_bindings_for_destination() -> None:
    x = make_exchange("x", "direct")
    q1, q2 = Q("1"), Q("2")
    x.bind(q1, "a")
    x.bind(q2, "b")
    assert [b.routing_key for b in x.bindings_for(q1)] == ["a"]
    assert x.bindings_for(Q("other")) == []
