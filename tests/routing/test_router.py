from __future__ import annotations

import pytest

from broker.protocol.constants import PRECONDITION_FAILED
from broker.protocol.errors import ChannelError
from broker.routing import Exchange, make_exchange, route, routing_keys

from .helpers import Q, msg


class Registry:
    """The lookup a vhost gives the router: exchanges by name, counting the look-ups."""

    def __init__(self, *exchanges: Exchange) -> None:
        self.by_name = {x.name: x for x in exchanges}
        self.lookups: list[str] = []

    def add(self, x: Exchange) -> Exchange:
        self.by_name[x.name] = x
        return x

    def lookup(self, name: str) -> Exchange | None:
        self.lookups.append(name)
        return self.by_name.get(name)


def none(_: str) -> Exchange | None:
    raise AssertionError("lookup must not be called")


def test_plain_route_returns_a_fresh_set() -> None:
    x = make_exchange("d", "direct")
    q = Q("q")
    x.bind(q, "k")
    out = route(x, msg("k"), none)
    assert out == {q}
    out.add("mutated")
    assert route(x, msg("k"), none) == {q}  # the exchange's index was not handed out
    assert route(x, msg("nope"), none) == set()


def test_e2e_chain() -> None:
    a, b, c = (
        make_exchange("a", "direct"),
        make_exchange("b", "topic"),
        make_exchange("c", "fanout"),
    )
    q1, q2, q3 = Q("1"), Q("2"), Q("3")
    a.bind(b, "k.x")
    b.bind(c, "k.*")
    b.bind(q1, "#")
    c.bind(q2, "")
    a.bind(q3, "other")
    assert route(a, msg("k.x"), none) == {q1, q2}
    assert route(a, msg("other"), none) == {q3}
    assert route(b, msg("k.y"), none) == {q1, q2}


def test_e2e_queue_reached_twice_counts_once() -> None:
    a, b = make_exchange("a", "fanout"), make_exchange("b", "fanout")
    q = Q("q")
    a.bind(q, "")
    a.bind(b, "")
    b.bind(q, "")
    assert route(a, msg(), none) == {q}


def test_cycles_terminate() -> None:
    a, b, c = (
        make_exchange("a", "fanout"),
        make_exchange("b", "fanout"),
        make_exchange("c", "fanout"),
    )
    q = Q("q")
    a.bind(b, "")
    b.bind(c, "")
    c.bind(a, "")
    c.bind(q, "")
    a.bind(a, "")  # self-binding
    assert route(a, msg(), none) == {q}
    assert route(b, msg(), none) == {q}


def test_exchange_destinations_are_not_returned() -> None:
    a, b = make_exchange("a", "fanout"), make_exchange("b", "fanout")
    a.bind(b, "")
    assert route(a, msg(), none) == set()


def test_unbind_exchange_destination_restores_fast_path() -> None:
    a, b = make_exchange("a", "direct"), make_exchange("b", "fanout")
    q = Q("q")
    a.bind(b, "k")
    b.bind(q, "")
    assert route(a, msg("k"), none) == {q}
    a.unbind_all(b)
    assert a._exchange_dests == 0
    assert route(a, msg("k"), none) == set()


def test_alternate_exchange_when_nothing_matched() -> None:
    reg = Registry()
    x = reg.add(make_exchange("x", "direct", arguments={"alternate-exchange": "ae"}))
    ae = reg.add(make_exchange("ae", "fanout"))
    q, unrouted = Q("q"), Q("unrouted")
    x.bind(q, "k")
    ae.bind(unrouted, "")
    assert route(x, msg("k"), reg.lookup) == {q}
    assert reg.lookups == []  # matched: the alternate is not even looked up
    assert route(x, msg("other"), reg.lookup) == {unrouted}
    assert reg.lookups == ["ae"]


def test_missing_alternate_exchange_is_skipped() -> None:
    reg = Registry()
    x = reg.add(make_exchange("x", "direct", arguments={"alternate-exchange": "gone"}))
    assert route(x, msg("k"), reg.lookup) == set()
    assert reg.lookups == ["gone"]


def test_alternate_chain_and_loop() -> None:
    reg = Registry()
    x = reg.add(make_exchange("x", "direct", arguments={"alternate-exchange": "ae1"}))
    reg.add(make_exchange("ae1", "direct", arguments={"alternate-exchange": "ae2"}))
    ae2 = reg.add(make_exchange("ae2", "direct", arguments={"alternate-exchange": "x"}))
    q = Q("q")
    assert route(x, msg("k"), reg.lookup) == set()  # x -> ae1 -> ae2 -> (x seen): stops
    assert reg.lookups == ["ae1", "ae2", "x"]
    ae2.bind(q, "k")
    assert route(x, msg("k"), reg.lookup) == {q}


def test_alternate_not_used_when_only_exchanges_matched() -> None:
    """As RabbitMQ: x matched (an exchange), so x's alternate is not used; the inner
    exchange matched nothing, so its own alternate is."""
    reg = Registry()
    x = reg.add(make_exchange("x", "direct", arguments={"alternate-exchange": "x-ae"}))
    inner = reg.add(make_exchange("inner", "direct", arguments={"alternate-exchange": "in-ae"}))
    x_ae, in_ae = (
        reg.add(make_exchange("x-ae", "fanout")),
        reg.add(make_exchange("in-ae", "fanout")),
    )
    qx, qin = Q("x-ae"), Q("in-ae")
    x_ae.bind(qx, "")
    in_ae.bind(qin, "")
    x.bind(inner, "k")
    assert route(x, msg("k"), reg.lookup) == {qin}
    assert reg.lookups == ["in-ae"]
    assert route(x, msg("z"), reg.lookup) == {qx}


def test_alternate_of_alternate_only_if_alternate_matched_nothing() -> None:
    reg = Registry()
    x = reg.add(make_exchange("x", "topic", arguments={"alternate-exchange": "ae"}))
    ae = reg.add(make_exchange("ae", "topic", arguments={"alternate-exchange": "ae2"}))
    ae2 = reg.add(make_exchange("ae2", "fanout"))
    q1, q2 = Q("1"), Q("2")
    ae.bind(q1, "a.#")
    ae2.bind(q2, "")
    assert route(x, msg("a.b"), reg.lookup) == {q1}
    assert route(x, msg("b"), reg.lookup) == {q2}


# -- CC / BCC ----------------------------------------------------------------------------------
def test_routing_keys_plain() -> None:
    assert routing_keys(msg("k")) == ["k"]
    assert routing_keys(msg("k", {"other": "CC"})) == ["k"]


def test_routing_keys_cc_bcc() -> None:
    m = msg("k", {"CC": ["c1", "c2"], "BCC": ["b1"]})
    assert routing_keys(m) == ["k", "c1", "c2", "b1"]
    # only longstr entries count
    assert routing_keys(msg("k", {"CC": ["c1", 5, None]})) == ["k", "c1"]
    assert routing_keys(msg("k", {"CC": []})) == ["k"]


@pytest.mark.parametrize("value", ["c1", 5, {"a": "b"}])
def test_cc_not_an_array_is_precondition_failed(value: object) -> None:
    x = make_exchange("d", "direct")
    with pytest.raises(ChannelError) as err:
        route(x, msg("k", {"CC": value}), none)
    assert err.value.code == PRECONDITION_FAILED


def test_cc_and_bcc_route_as_extra_keys() -> None:
    x = make_exchange("d", "direct")
    q, qc, qb, other = Q("k"), Q("cc"), Q("bcc"), Q("other")
    x.bind(q, "k")
    x.bind(qc, "cc")
    x.bind(qb, "bcc")
    x.bind(other, "other")
    assert route(x, msg("k", {"CC": ["cc"], "BCC": ["bcc"]}), none) == {q, qc, qb}
    assert route(x, msg("nothing", {"CC": ["cc"]}), none) == {qc}


def test_cc_follows_e2e_and_counts_for_alternate() -> None:
    reg = Registry()
    x = reg.add(make_exchange("x", "direct", arguments={"alternate-exchange": "ae"}))
    t = reg.add(make_exchange("t", "topic"))
    ae = reg.add(make_exchange("ae", "fanout"))
    qt, qae = Q("t"), Q("ae")
    x.bind(t, "cc.key")
    t.bind(qt, "cc.#")
    ae.bind(qae, "")
    # the CC key matched at x (and again in t): no alternate
    assert route(x, msg("k", {"CC": ["cc.key"]}), reg.lookup) == {qt}
    assert reg.lookups == []
    # no key matched: alternate, which is a fanout and routes once
    assert route(x, msg("k", {"BCC": ["nope"]}), reg.lookup) == {qae}


def test_headers_exchange_with_cc() -> None:
    x = make_exchange("h", "headers")
    q = Q("q")
    x.bind(q, "", {"CC": None})
    assert route(x, msg("k", {"CC": ["a", "b"]}), none) == {q}
