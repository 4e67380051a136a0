"""The consistent-hash exchange's routing with plain values: weights, spread, stability and how
few keys move when a binding comes or goes."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from pamqp import commands

from broker.message import Message
from broker.protocol.errors import ChannelError
from broker.routing import ConsistentHashExchange, make_exchange

from .helpers import Q, msg

KEYS = [f"key-{i}" for i in range(4000)]


def one(x: Any, key: str, message: Message) -> Any:
    (dest,) = x.route(key, message)
    return dest


def owner(x: Any, key: str) -> Any:
    return one(x, key, msg(key))


def placement(x: Any) -> dict[str, Q]:
    return {k: owner(x, k) for k in KEYS}


def test_factory_builds_it() -> None:
    assert type(make_exchange("c", "x-consistent-hash")) is ConsistentHashExchange


def test_no_bindings_routes_nothing() -> None:
    assert list(make_exchange("c", "x-consistent-hash").route("k", msg("k"))) == []


@pytest.mark.parametrize("key", ["abc", "", "1.5", " 1", "1 "])
def test_a_non_integer_weight_is_refused(key: str) -> None:
    x = make_exchange("c", "x-consistent-hash")
    with pytest.raises(ChannelError, match="binding key must be an integer") as err:
        x.bind(Q("q"), key)
    assert err.value.code == 406
    assert not x.has_bindings()


def test_equal_weights_spread_evenly_and_weights_scale_the_share() -> None:
    x = make_exchange("c", "x-consistent-hash")
    qs = [Q(str(i)) for i in range(4)]
    for q in qs:
        x.bind(q, "50")
    counts = Counter(placement(x).values())
    assert set(counts) == set(qs)
    assert all(700 < n < 1300 for n in counts.values()), counts
    y = make_exchange("c", "x-consistent-hash")
    heavy, light = Q("heavy"), Q("light")
    y.bind(heavy, "200")
    y.bind(light, "100")
    counts = Counter(placement(y).values())
    assert 1.5 < counts[heavy] / counts[light] < 2.6, counts


def test_a_zero_weight_binds_but_takes_nothing() -> None:
    x = make_exchange("c", "x-consistent-hash")
    q, zero = Q("q"), Q("zero")
    x.bind(q, "1")
    assert x.bind(zero, "0")
    assert set(placement(x).values()) == {q}


def test_placement_is_stable_and_does_not_depend_on_binding_order() -> None:
    qs = [Q(str(i)) for i in range(3)]
    a = make_exchange("c", "x-consistent-hash")
    for q in qs:
        a.bind(q, "20")
    b = make_exchange("c", "x-consistent-hash")
    for q in reversed(qs):
        b.bind(q, "20")
    first = placement(a)
    assert placement(a) == first
    assert {k: q.name for k, q in placement(b).items()} == {k: q.name for k, q in first.items()}


def test_adding_a_queue_moves_only_keys_to_it_and_removing_moves_only_its_keys() -> None:
    x = make_exchange("c", "x-consistent-hash")
    qs = [Q(str(i)) for i in range(4)]
    for q in qs:
        x.bind(q, "40")
    before = placement(x)
    new = Q("new")
    x.bind(new, "40")
    after = placement(x)
    moved = {k for k in KEYS if after[k] is not before[k]}
    assert moved and all(after[k] is new for k in moved)
    assert len(moved) < len(KEYS) * 0.3  # about a fifth, not a reshuffle
    x.unbind(new, "40")
    assert placement(x) == before
    gone = qs[1]
    x.unbind(gone, "40")
    without = placement(x)
    assert {k for k in KEYS if without[k] is not before[k]} == {
        k for k in KEYS if before[k] is gone
    }


def _props_msg(routing_key: str, **props: Any) -> Message:
    raw = commands.Basic.Properties(**props).marshal()
    return Message("x", routing_key, raw, b"body")


def test_hash_header_routes_by_the_header_not_the_key() -> None:
    x = make_exchange("c", "x-consistent-hash", arguments={"hash-header": "user"})
    qs = [Q(str(i)) for i in range(4)]
    for q in qs:
        x.bind(q, "20")
    seen = {one(x, f"rk{i}", msg(f"rk{i}", headers={"user": "alice"})) for i in range(50)}
    assert len(seen) == 1
    spread = {one(x, "k", msg("k", headers={"user": f"u{i}"})) for i in range(200)}
    assert len(spread) == 4
    # no header: routed all the same, to one queue
    missing = {one(x, f"rk{i}", msg(f"rk{i}")) for i in range(50)}
    assert len(missing) == 1


@pytest.mark.parametrize("prop", ["message_id", "correlation_id"])
def test_hash_property_routes_by_the_property(prop: str) -> None:
    x = make_exchange("c", "x-consistent-hash", arguments={"hash-property": prop})
    for i in range(4):
        x.bind(Q(str(i)), "20")
    same = {one(x, f"rk{i}", _props_msg(f"rk{i}", **{prop: "id-7"})) for i in range(50)}
    assert len(same) == 1
    spread = {one(x, "k", _props_msg("k", **{prop: f"id-{i}"})) for i in range(200)}
    assert len(spread) == 4


def test_hash_property_timestamp() -> None:
    x = make_exchange("c", "x-consistent-hash", arguments={"hash-property": "timestamp"})
    for i in range(4):
        x.bind(Q(str(i)), "20")
    stamps = [datetime.fromtimestamp(1_700_000_000 + i, UTC) for i in range(200)]
    spread = {one(x, "k", _props_msg("k", timestamp=t)) for t in stamps}
    assert len(spread) == 4


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"hash-header": "h", "hash-property": "message_id"}, "mutually exclusive"),
        ({"hash-property": "app_id"}, "Unsupported property: app_id"),
    ],
)
def test_bad_hash_arguments_are_refused(arguments: dict[str, Any], error: str) -> None:
    with pytest.raises(ChannelError, match=error) as err:
        ConsistentHashExchange.validate_arguments(arguments)
    assert err.value.code == 406
