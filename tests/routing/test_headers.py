from __future__ import annotations

from typing import Any

import pytest

from broker.protocol.constants import PRECONDITION_FAILED
from broker.protocol.errors import ChannelError
from broker.routing import headers_match, make_exchange

from .helpers import Q, msg

H = {"a": "1", "b": 2, "c": None, "x-k": "v", "t": True}


@pytest.mark.parametrize(
    ("args", "headers", "expected"),
    [
        # all (explicit and default)
        ({"x-match": "all", "a": "1", "b": 2}, H, True),
        ({"a": "1", "b": 2}, H, True),
        ({"a": "1", "b": 3}, H, False),
        ({"a": "1", "zz": 1}, H, False),
        ({"a": 1}, H, False),  # "1" is not 1
        ({}, H, True),  # all of nothing
        ({}, {}, True),
        ({"x-match": "all"}, {}, True),
        ({"a": "1"}, {}, False),
        # any
        ({"x-match": "any", "a": "nope", "b": 2}, H, True),
        ({"x-match": "any", "a": "nope", "zz": 1}, H, False),
        ({"x-match": "any"}, H, False),  # any of nothing
        ({"x-match": "any", "a": "1"}, {}, False),
        # void binding value: presence only
        ({"a": None}, H, True),
        ({"zz": None}, H, False),
        ({"x-match": "any", "zz": None, "c": None}, H, True),
        ({"c": None}, H, True),  # a void header is present
        ({"c": "x"}, H, False),  # ...but does not equal a value
        # x- arguments are ignored by all/any
        ({"x-k": "other", "a": "1"}, H, True),
        ({"x-match": "any", "x-k": "v"}, H, False),
        ({"x-other": 1}, {}, True),
        # ... and matched by the -with-x variants (x-match itself never is)
        ({"x-match": "all-with-x", "x-k": "v", "a": "1"}, H, True),
        ({"x-match": "all-with-x", "x-k": "other", "a": "1"}, H, False),
        ({"x-match": "all-with-x"}, H, True),
        ({"x-match": "any-with-x", "x-k": "v"}, H, True),
        ({"x-match": "any-with-x", "x-k": "other", "zz": 1}, H, False),
        ({"x-match": "any-with-x", "x-k": None}, H, True),
        # typed comparison: True is not 1
        ({"t": True}, H, True),
        ({"t": 1}, H, False),
        ({"b": True}, {"b": 1}, False),
        # nested values compare structurally
        ({"n": [1, "x"]}, {"n": [1, "x"]}, True),
        ({"n": {"k": 1}}, {"n": {"k": 2}}, False),
    ],
)
def test_headers_rules(args: dict[str, Any], headers: dict[str, Any], expected: bool) -> None:
    assert headers_match(args, headers) is expected
    x = make_exchange("h", "headers")
    q = Q("q")
    x.bind(q, "ignored", args)
    assert (q in set(x.route("any.key", msg("any.key", headers)))) is expected


def test_message_without_headers() -> None:
    x = make_exchange("h", "headers")
    q_all, q_any, q_key = Q("all"), Q("any"), Q("key")
    x.bind(q_all, "")
    x.bind(q_any, "", {"x-match": "any", "a": 1})
    x.bind(q_key, "", {"a": 1})
    assert set(x.route("", msg(""))) == {q_all}


def test_routing_key_is_ignored() -> None:
    x = make_exchange("h", "headers")
    q = Q("q")
    x.bind(q, "some-key", {"a": "1"})
    assert set(x.route("other", msg("other", {"a": "1"}))) == {q}


@pytest.mark.parametrize("bad", ["some", "ALL", 1, ["all"]])
def test_invalid_x_match_refused_at_bind(bad: object) -> None:
    x = make_exchange("h", "headers")
    with pytest.raises(ChannelError) as err:
        x.bind(Q("q"), "", {"x-match": bad, "a": 1})
    assert err.value.code == PRECONDITION_FAILED
    assert not x.has_bindings()


def test_x_match_validation_is_headers_only() -> None:
    x = make_exchange("d", "direct")
    assert x.bind(Q("q"), "k", {"x-match": "bogus"})


def test_several_bindings_same_queue_route_once() -> None:
    x = make_exchange("h", "headers")
    q = Q("q")
    x.bind(q, "", {"a": "1"})
    x.bind(q, "", {"b": 2})
    assert list(x.route("", msg("", H))) == [q]
    x.unbind(q, "", {"a": "1"})
    assert list(x.route("", msg("", {"a": "1"}))) == []
    assert list(x.route("", msg("", {"b": 2}))) == [q]
