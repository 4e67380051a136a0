"""Federation (broker/federation) over real sockets: two Hare brokers as upstream and
downstream, upstreams and policies set through the management API, messages published and
consumed with aio-pika on both."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import pika
import pytest

from broker.amqp_uri import LocalBroker
from broker.federation.link import ExchangeLink
from broker.federation.upstream import parse_upstream
from tests.conftest import BrokerProc
from tests.mgmt.helpers import MgmtBroker, free_port
from tests.plugin_helpers import queue_depth, rabbitmq_answers
from tests.test_ctl import ctl

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MgmtBroker, MgmtBroker]]:
    """(upstream, downstream), each knowing itself by its own node name."""
    base = tmp_path_factory.mktemp("federation")
    up = MgmtBroker(base / "up", ["--node-name", "hare-up"]).start()
    down = MgmtBroker(base / "down", ["--node-name", "hare-down"]).start()
    yield up, down
    down.stop()
    up.stop()


def _put(b: MgmtBroker, component: str, name: str, value: Any) -> None:
    status, body = b.api("PUT", f"/api/parameters/{component}/%2F/{name}", {"value": value})
    assert status in (201, 204), body


def _policy(b: MgmtBroker, name: str, pattern: str, definition: dict[str, Any],
            apply_to: str) -> None:
    status, body = b.api("PUT", f"/api/policies/%2F/{name}", {
        "pattern": pattern, "definition": definition, "apply-to": apply_to})
    assert status in (201, 204), body


async def _link(b: MgmtBroker, check: Any, timeout: float = 30.0) -> dict[str, Any]:
    rows = await b.until("/api/federation-links", lambda rows: any(check(r) for r in rows),
                         timeout)
    return next(r for r in rows if check(r))


async def _upstream_keys(up: MgmtBroker, exchange: str, want: set[str]) -> None:
    """Wait until the upstream exchange's bindings to the federation are exactly `want`."""
    def keys(rows: list[dict[str, Any]]) -> set[str]:
        return {r["routing_key"] for r in rows if r["destination"].startswith("federation: ")}
    await up.until(f"/api/exchanges/%2F/{quote(exchange, safe='')}/bindings/source",
                   lambda rows: keys(rows) == want, timeout=20)


async def _declare(url: str, exchange: str, queue: str, keys: list[str],
                   type_: aio_pika.ExchangeType = aio_pika.ExchangeType.TOPIC) -> None:
    async with await aio_pika.connect(url) as conn:
        ch = await conn.channel()
        x = await ch.declare_exchange(exchange, type_, durable=True)
        q = await ch.declare_queue(queue, durable=True)
        for key in keys:
            await q.bind(x, key)


async def _publish(url: str, exchange: str, items: list[tuple[str, bytes]]) -> None:
    """Persistent, confirmed: each publish returns once the broker confirmed it."""
    async with await aio_pika.connect(url) as conn:
        ch = await conn.channel()
        x = await ch.get_exchange(exchange, ensure=False) if exchange else ch.default_exchange
        for key, body in items:
            await x.publish(aio_pika.Message(
                body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), key)


async def _take(url: str, queue: str, until: bytes | int, timeout: float = 30.0
                ) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Consume and ack until the body `until` arrives (or that many messages have)."""
    got: list[aio_pika.abc.AbstractIncomingMessage] = []
    async with await aio_pika.connect(url) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue(queue, passive=True)
        async with asyncio.timeout(timeout), q.iterator() as it:
            async for msg in it:
                await msg.ack()
                got.append(msg)
                if msg.body == until or len(got) == until:
                    break
    return got



async def test_exchange_federation_delivers_and_bindings_follow(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    up, down = pair
    await _declare(up.url, "fx.x", "fx.upstream-local", [])
    await _declare(down.url, "fx.x", "fx.q", ["a.*"])
    _put(down, "federation-upstream", "up", {"uri": up.url, "expires": 3600000,
                                             "message-ttl": 60000})
    _policy(down, "fx", r"^fx\.", {"federation-upstream": "up"}, "exchanges")
    row = await _link(down, lambda r: r.get("exchange") == "fx.x" and r["status"] == "running")
    assert row["upstream"] == "up" and row["upstream_exchange"] == "fx.x"
    assert row in down.get("/api/federation-links/%2F")
    assert row["type"] == "exchange" and row["vhost"] == "/" and "guest" not in row["uri"]
    await _upstream_keys(up, "fx.x", {"a.*"})
    queues = {q["name"]: q for q in up.get("/api/queues/%2F")}
    fq = queues["federation: fx.x -> hare-down"]  # the plugin's name for it, and arguments
    assert fq["durable"] and fq["arguments"] == {
        "x-expires": 3600000, "x-message-ttl": 60000, "x-internal-purpose": "federation"}

    await _publish(up.url, "fx.x", [("z.z", b"not bound"), ("a.b", b"one")])
    [msg] = await _take(down.url, "fx.q", b"one")
    received = msg.headers["x-received-from"]
    assert isinstance(received, list) and len(received) == 1
    assert received[0]["exchange"] == "fx.x" and received[0]["cluster-name"] == "hare-up"
    assert received[0]["redelivered"] is False and received[0]["vhost"] == "/"
    assert msg.routing_key == "a.b"

    # bind and unbind downstream: the upstream bindings follow, and so does what crosses
    async with await aio_pika.connect(down.url) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("fx.q", passive=True)
        await q.bind("fx.x", "z.*")
        await _upstream_keys(up, "fx.x", {"a.*", "z.*"})
        await q.unbind("fx.x", "a.*")
        await _upstream_keys(up, "fx.x", {"z.*"})
    # a.b, published first, would arrive first if it still crossed
    await _publish(up.url, "fx.x", [("a.b", b"unbound now"), ("z.z", b"two")])
    assert [m.body for m in await _take(down.url, "fx.q", b"two")] == [b"two"]

    # the policy cleared: the link goes
    assert down.api("DELETE", "/api/policies/%2F/fx")[0] == 204
    await down.until("/api/federation-links",
                     lambda rows: not any(r.get("exchange") == "fx.x" for r in rows))
    # and what it declared upstream with it, as the plugin's default cleanup
    await up.until("/api/queues/%2F", lambda rows: not any(
        q["name"].startswith("federation: fx.x") for q in rows), timeout=20)
    await up.until("/api/exchanges/%2F", lambda rows: not any(
        x["name"].startswith("federation: fx.x") for x in rows), timeout=20)


async def test_max_hops_1_on_a_loop_of_two_delivers_once(tmp_path: Path) -> None:
    a = MgmtBroker(tmp_path / "a", ["--node-name", "hare-a"]).start()
    b = MgmtBroker(tmp_path / "b", ["--node-name", "hare-b"]).start()
    try:
        for here, there in ((a, b), (b, a)):
            await _declare(here.url, "loop.x", "loop.q", ["#"],
                           aio_pika.ExchangeType.FANOUT)
            _put(here, "federation-upstream", "other", {"uri": there.url, "max-hops": 1})
            _policy(here, "loop", r"^loop\.", {"federation-upstream": "other"}, "exchanges")
        for here in (a, b):
            await _link(here, lambda r: r["status"] == "running")
        for here, there_name in ((a, "hare-b"), (b, "hare-a")):
            # on each side the other's link binding, and only that one (none echoed back)
            want = [f"federation: loop.x -> {there_name} A"]
            await here.until("/api/exchanges/%2F/loop.x/bindings/source", lambda rows, w=want: [
                r["destination"] for r in rows if r["destination"].startswith("federation: ")
            ] == w, timeout=20)
        await _publish(a.url, "loop.x", [("", b"m")])
        assert [m.body for m in await _take(b.url, "loop.q", b"m")] == [b"m"]
        # a marker published at b after m: had m come back to a, it would be there first
        await _publish(b.url, "loop.x", [("", b"marker")])
        assert [m.body for m in await _take(a.url, "loop.q", b"marker")] == [b"m", b"marker"]
        assert [m.body for m in await _take(b.url, "loop.q", b"marker")] == [b"marker"]
    finally:
        b.stop()
        a.stop()


async def test_queue_federation_moves_messages_to_the_consuming_side_only(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    up, down = pair
    bodies = [b"q%d" % i for i in range(20)]
    async with await aio_pika.connect(up.url) as conn:
        await (await conn.channel()).declare_queue("fq.work", durable=True)
    await _publish(up.url, "", [("fq.work", body) for body in bodies])
    async with await aio_pika.connect(down.url) as conn:
        await (await conn.channel()).declare_queue("fq.work", durable=True)
    _put(down, "federation-upstream", "upq", {"uri": up.url, "prefetch-count": 5})
    _policy(down, "fq", r"^fq\.", {"federation-upstream": "upq"}, "queues")
    row = await _link(down, lambda r: r.get("queue") == "fq.work" and r["status"] == "running")
    assert row["upstream_queue"] == "fq.work"
    # no consumer downstream: the messages stay where they are
    await up.until("/api/queues/%2F/fq.work", lambda q: q.get("consumers") == 0)
    assert await queue_depth(up.url, "fq.work") == 20
    assert await queue_depth(down.url, "fq.work") == 0
    got = await _take(down.url, "fq.work", 20)
    assert sorted(m.body for m in got) == sorted(bodies)
    assert got[0].headers["x-received-from"][0]["queue"] == "fq.work"
    assert await queue_depth(up.url, "fq.work") == 0
    # the downstream consumer gone, the link stops fetching: new messages stay upstream
    await up.until("/api/queues/%2F/fq.work", lambda q: q.get("consumers") == 0, timeout=10)
    await _publish(up.url, "", [("fq.work", b"stays")])
    assert await queue_depth(up.url, "fq.work") == 1
    assert down.api("DELETE", "/api/policies/%2F/fq")[0] == 204


@pytest.mark.parametrize(("component", "value", "reason"), [
    ("federation-upstream", {"prefetch-count": 5}, "uri"),
    ("federation-upstream", {"uri": "http://x"}, 'uri: "http://x" not a valid URI'),
    # checked as RabbitMQ's URI parser would, as for shovels (broker/amqp_uri.py)
    ("federation-upstream", {"uri": "amqp://h:99999"}, 'uri: "amqp://h:99999" not a valid URI'),
    ("federation-upstream", {"uri": ["amqp://", "amqp://h/a/b"]}, "one path segment"),
    ("federation-upstream-set", [{"upstream": "a", "uri": "amqp://h:port"}], "not a valid URI"),
    ("federation-upstream", {"uri": "amqp://", "max-hops": "two"}, "max-hops"),
    ("federation-upstream", {"uri": "amqp://", "max-hops": 0}, "max-hops"),
    ("federation-upstream", {"uri": "amqp://", "ack-mode": "sometimes"}, "ack-mode"),
    ("federation-upstream", {"uri": "amqp://", "trust-user-id": "yes"}, "trust-user-id"),
    ("federation-upstream", {"uri": "amqp://", "colour": "blue"}, "colour"),
    ("federation-upstream", "not an object", "object"),
    ("federation-upstream-set", {"upstream": "a"}, "list"),
    ("federation-upstream-set", [{"prefetch-count": 1}], "upstream"),
    ("federation-upstream-set", [{"upstream": "a", "expires": 0}], "expires"),
])
async def test_a_malformed_parameter_is_refused_and_nothing_changes(
        pair: tuple[MgmtBroker, MgmtBroker], component: str, value: Any, reason: str) -> None:
    _, down = pair
    status, body = down.api("PUT", f"/api/parameters/{component}/%2F/bad", {"value": value})
    assert status == 400 and reason in body["reason"], body
    assert down.api("GET", f"/api/parameters/{component}/%2F/bad")[0] == 404
    status, body = down.api("PUT", "/api/policies/%2F/bad", {
        "pattern": "^x", "definition": {"federation-upstream": "a",
                                        "federation-upstream-set": "all"}})
    assert status == 400 and "together" in body["reason"]


async def test_an_unreachable_upstream_shows_the_error_then_runs(
        pair: tuple[MgmtBroker, MgmtBroker], tmp_path: Path) -> None:
    _, down = pair
    other = BrokerProc(tmp_path / "late", ["--node-name", "hare-late"])
    other.hold_port()
    await _declare(down.url, "late.x", "late.q", ["k"])
    _put(down, "federation-upstream", "late", {
        "uri": f"amqp://guest:guest@127.0.0.1:{other.port}/%2F", "reconnect-delay": 0.5})
    _policy(down, "late", r"^late\.", {"federation-upstream": "late"}, "exchanges")
    row = await _link(down, lambda r: r.get("exchange") == "late.x" and r["status"] == "error")
    assert "upstream" in row["error"]
    # meanwhile the broker and the other links carry on
    await _publish(down.url, "late.x", [("k", b"local")])
    assert [m.body for m in await _take(down.url, "late.q", b"local")] == [b"local"]
    other.start()
    try:
        await _link(down, lambda r: r.get("exchange") == "late.x" and r["status"] == "running",
                    timeout=60)
        await _publish(other.url, "late.x", [("k", b"from afar")])
        assert [m.body for m in await _take(down.url, "late.q", b"from afar")] == [b"from afar"]
    finally:
        down.api("DELETE", "/api/policies/%2F/late")
        other.stop()


async def test_upstream_restart_loses_nothing_confirmed(tmp_path: Path) -> None:
    up = MgmtBroker(tmp_path / "up", ["--node-name", "hare-up2"]).start()
    down = MgmtBroker(tmp_path / "down", ["--node-name", "hare-down2"]).start()
    try:
        await _declare(up.url, "rs.x", "rs.unused", [])
        await _declare(down.url, "rs.x", "rs.q", ["#"])
        _put(down, "federation-upstream", "up", {"uri": up.url, "reconnect-delay": 0.2,
                                                 "ack-mode": "on-confirm"})
        _policy(down, "rs", r"^rs\.", {"federation-upstream": "up"}, "exchanges")
        await _link(down, lambda r: r["status"] == "running")
        await _upstream_keys(up, "rs.x", {"#"})
        before = [(f"k{i}", b"before %d" % i) for i in range(300)]
        after = [(f"k{i}", b"after %d" % i) for i in range(300)]
        await _publish(up.url, "rs.x", before)  # every one confirmed by the upstream
        up.stop()
        await _link(down, lambda r: r["status"] == "error")
        up.start()
        await _link(down, lambda r: r["status"] == "running", timeout=60)
        await _publish(up.url, "rs.x", after)
        got = await _take(down.url, "rs.q", b"after 299", timeout=60)
        assert {m.body for m in got} >= {body for _, body in before + after}
        # the downstream stopped: the upstream keeps collecting for it; restarted, its
        # upstreams come back from its data directory and it gets what it missed
        down.stop()
        await _publish(up.url, "rs.x", [("k", b"while the downstream was down")])
        down.start()
        await _link(down, lambda r: r["status"] == "running")
        assert [m.body for m in await _take(down.url, "rs.q", 1)] == [
            b"while the downstream was down"]
    finally:
        down.stop()
        up.stop()


async def test_upstream_sets_and_all(pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    up, down = pair
    await _declare(up.url, "set.x", "set.unused", [])
    await _declare(down.url, "set.x", "set.q", ["k"])
    _put(down, "federation-upstream", "set-up", {"uri": "amqp://localhost:1"})  # wrong port
    # the set's member overrides the upstream's uri
    _put(down, "federation-upstream-set", "s", [{"upstream": "set-up", "uri": up.url}])
    _policy(down, "set", r"^set\.", {"federation-upstream-set": "s"}, "exchanges")
    await _link(down, lambda r: r.get("exchange") == "set.x" and r["status"] == "running")
    await _publish(up.url, "set.x", [("k", b"via the set")])
    assert [m.body for m in await _take(down.url, "set.q", b"via the set")] == [b"via the set"]
    # "all": one link per upstream of the vhost
    _policy(down, "set", r"^set\.", {"federation-upstream-set": "all"}, "exchanges")
    names = {n for (v, n) in [(p["vhost"], p["name"])
                              for p in down.get("/api/parameters/federation-upstream")]}
    await down.until("/api/federation-links", lambda rows: {
        r["upstream"] for r in rows if r.get("exchange") == "set.x"} == names)
    exported = down.get("/api/definitions")["parameters"]
    assert {"vhost": "/", "component": "federation-upstream-set", "name": "s",
            "value": [{"upstream": "set-up", "uri": up.url}]} in exported
    assert down.api("DELETE", "/api/policies/%2F/set")[0] == 204


async def test_federation_status_verb(pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    up, down = pair
    await _declare(up.url, "ctl.x", "ctl.unused", [])
    await _declare(down.url, "ctl.x", "ctl.q", ["k"])
    _put(down, "federation-upstream", "ctl-up", {"uri": up.url})
    _put(down, "federation-upstream", "ctl-down", {"uri": f"amqp://127.0.0.1:{free_port()}"})
    _put(down, "federation-upstream-set", "ctl", [{"upstream": "ctl-up"},
                                                  {"upstream": "ctl-down"}])
    _policy(down, "ctl", r"^ctl\.", {"federation-upstream-set": "ctl"}, "exchanges")
    await _link(down, lambda r: r["upstream"] == "ctl-up" and r["status"] == "running")
    await _link(down, lambda r: r["upstream"] == "ctl-down" and r["status"] == "error")
    lines = (await ctl(down, "federation_status")).stdout.splitlines()
    assert lines[0].split()[:6] == ["type", "name", "vhost", "upstream", "upstream_name",
                                    "status"]
    assert ["exchange", "ctl.x", "/", "ctl-up", "ctl.x", "running"] in [
        line.split()[:6] for line in lines[1:]]
    rows = json.loads((await ctl(down, "--json", "federation_status", "--only-down")).stdout)
    assert [(r["name"], r["upstream"], r["status"]) for r in rows] == [
        ("ctl.x", "ctl-down", "error")]
    assert rows[0]["error"]
    assert down.api("DELETE", "/api/policies/%2F/ctl")[0] == 204
    assert down.api("DELETE", "/api/parameters/federation-upstream/%2F/ctl-down")[0] == 204



@pytest.mark.skipif(not rabbitmq_answers(), reason="no RabbitMQ answers on 127.0.0.1:5672")
async def test_federates_an_exchange_of_rabbitmq(pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    """RabbitMQ as the upstream: what the link declares there is what RabbitMQ accepts."""
    _, down = pair
    rabbit = "amqp://guest:guest@127.0.0.1:5672/%2F"
    await _declare(down.url, "hare.fed.rmq", "rmq.q", ["k"])
    _put(down, "federation-upstream", "rabbit", {"uri": rabbit, "expires": 60000})
    _policy(down, "rmq", r"^hare\.fed\.rmq$", {"federation-upstream": "rabbit"}, "exchanges")
    try:
        row = await _link(down, lambda r: r["upstream"] == "rabbit" and r["status"] in (
            "running", "error"))
        assert row["status"] == "running", row
        await _publish(rabbit, "hare.fed.rmq", [("k", b"from rabbitmq")])
        [msg] = await _take(down.url, "rmq.q", b"from rabbitmq")
        assert msg.headers["x-received-from"][0]["cluster-name"].startswith("rabbit@")
    finally:
        down.api("DELETE", "/api/policies/%2F/rmq")
        await down.until("/api/federation-links", lambda rows: not any(
            r["upstream"] == "rabbit" for r in rows))
        # leave RabbitMQ as found (pika: it sends the plugin's names as they are)
        conn = pika.BlockingConnection(pika.URLParameters(rabbit))
        ch = conn.channel()
        ch.queue_delete("federation: hare.fed.rmq -> hare-down")
        for suffix in ("A", "B"):
            ch.exchange_delete(f"federation: hare.fed.rmq -> hare-down {suffix}")
        ch.exchange_delete("hare.fed.rmq")
        conn.close()


@pytest.mark.parametrize("ack_mode", ["on-publish", "no-ack"])
async def test_other_ack_modes_deliver_and_settle_upstream(
        pair: tuple[MgmtBroker, MgmtBroker], ack_mode: str) -> None:
    up, down = pair
    x = f"am-{ack_mode}.x"
    await _declare(up.url, x, f"am-{ack_mode}.unused", [])
    await _declare(down.url, x, f"am-{ack_mode}.q", ["k"])
    _put(down, "federation-upstream", f"am-{ack_mode}", {"uri": up.url, "ack-mode": ack_mode})
    _policy(down, f"am-{ack_mode}", f"^am-{ack_mode}\\.x$",
            {"federation-upstream": f"am-{ack_mode}"}, "exchanges")
    await _link(down, lambda r: r.get("exchange") == x and r["status"] == "running")
    await _upstream_keys(up, x, {"k"})
    bodies = [b"%d" % i for i in range(50)]
    await _publish(up.url, x, [("k", body) for body in bodies])
    assert [m.body for m in await _take(down.url, f"am-{ack_mode}.q", 50)] == bodies
    await up.until(f"/api/queues/%2F/{quote(f'federation: {x} -> hare-down', safe='')}",
                   lambda q: q.get("messages") == 0, timeout=20)
    assert down.api("DELETE", f"/api/policies/%2F/am-{ack_mode}")[0] == 204


async def test_definitions_import_and_a_deleted_vhost(pair: tuple[MgmtBroker, MgmtBroker]
                                                      ) -> None:
    _, down = pair
    assert down.api("PUT", "/api/vhosts/fedv", {})[0] in (201, 204)
    status, body = down.api("POST", "/api/definitions", {"parameters": [
        {"vhost": "fedv", "component": "federation-upstream", "name": "imported",
         "value": {"uri": "amqp://elsewhere", "max-hops": 2}}]})
    assert status in (200, 201, 204), body
    got = down.get("/api/parameters/federation-upstream/fedv/imported")
    assert got["value"] == {"uri": "amqp://elsewhere", "max-hops": 2}
    status, body = down.api("POST", "/api/definitions", {"parameters": [
        {"vhost": "fedv", "component": "federation-upstream", "name": "broken",
         "value": {"uri": 5}}]})
    assert status == 400 and "uri" in body["reason"]
    assert down.api("GET", "/api/parameters/federation-upstream/fedv/broken")[0] == 404
    assert down.api("DELETE", "/api/vhosts/fedv")[0] == 204
    assert down.api("GET", "/api/parameters/federation-upstream/fedv/imported")[0] == 404


async def test_an_upstream_uri_without_a_vhost_means_the_downstream_ones(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    up, down = pair
    for b in (up, down):
        assert b.api("PUT", "/api/vhosts/fv", {})[0] in (201, 204)
        assert b.api("PUT", "/api/permissions/fv/guest", {
            "configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    up_fv, down_fv = up.url + "fv", down.url + "fv"
    await _declare(up_fv, "v.x", "v.unused", [])
    await _declare(down_fv, "v.x", "v.q", ["k"])
    status, body = down.api("PUT", "/api/parameters/federation-upstream/fv/up", {
        "value": {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}"}})
    assert status in (201, 204), body
    status, body = down.api("PUT", "/api/policies/fv/v", {
        "pattern": "^v\\.x$", "definition": {"federation-upstream": "up"},
        "apply-to": "exchanges"})
    assert status in (201, 204), body
    await _link(down, lambda r: r["vhost"] == "fv" and r["status"] == "running")
    await _publish(up_fv, "v.x", [("k", b"in fv")])
    [msg] = await _take(down_fv, "v.q", b"in fv")
    assert msg.headers["x-received-from"][0]["vhost"] == "fv"
    for b in (down, up):
        assert b.api("DELETE", "/api/vhosts/fv")[0] == 204


@pytest.mark.parametrize("hops", [1, 2])
async def test_max_hops_along_a_chain_of_three(tmp_path: Path, hops: int) -> None:
    """a -> b -> c, each link with `max-hops` = hops: a message published at a crosses two
    links to reach c, so it gets there only with max-hops 2 (and c's binding has to travel
    back to a for that, through b)."""
    a, b, c = (MgmtBroker(tmp_path / n, ["--node-name", f"hare-{n}"]).start() for n in "abc")
    try:
        for here, there in ((b, a), (c, b)):
            _put(here, "federation-upstream", "prev", {"uri": there.url, "max-hops": hops})
            _policy(here, "chain", r"^chain\.", {"federation-upstream": "prev"}, "exchanges")
        await _declare(a.url, "chain.x", "chain.unused", [])
        await _declare(b.url, "chain.x", "chain.q", ["k"])
        await _declare(c.url, "chain.x", "chain.q", ["k"])
        for here in (b, c):
            await _link(here, lambda r: r["status"] == "running")
        await _upstream_keys(b, "chain.x", {"k"})
        await a.until("/api/exchanges/%2F/chain.x/bindings/source", lambda rows: len(
            [r for r in rows if r["destination"].startswith("federation: ")]) == hops,
            timeout=20)  # b's own binding, and c's through b when it may travel that far
        await _publish(a.url, "chain.x", [("k", b"from a")])
        assert [m.body for m in await _take(b.url, "chain.q", b"from a")] == [b"from a"]
        # from b, one link: always crosses, and after "from a" had it crossed too
        await _publish(b.url, "chain.x", [("k", b"marker")])
        got = [m.body for m in await _take(c.url, "chain.q", b"marker")]
        assert got == ([b"from a", b"marker"] if hops == 2 else [b"marker"])
    finally:
        for broker in (c, b, a):
            broker.stop()


async def test_reconnect_backoff_doubles_and_restarts_after_a_session_that_ran(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed sessions wait reconnect-delay doubling (up to 30 s); one that got to running
    starts the backoff afresh for the next failure only. The reconnect policy alone: the
    session and the clock are stand-ins, no broker is involved."""
    upstream = parse_upstream("u", {"uri": "amqp://", "reconnect-delay": 4})
    link = ExchangeLink("/", "x", upstream, "n", LocalBroker(1, "secret"), "topic",
                        user="u")
    reached = [False, False, False, True, False, False, False, False]
    sleeps: list[float] = []

    async def session() -> None:
        if not reached:
            raise asyncio.CancelledError
        if reached.pop(0):
            link._set("running")
        raise ConnectionError("down")

    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    monkeypatch.setattr(link, "_session", session)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        await link._run()
    assert sleeps == [4, 8, 16, 4, 8, 16, 30, 30]
    assert link.status == "starting" and link.error == "ConnectionError: down"


async def test_a_message_routed_nowhere_downstream_is_dropped_not_sent_back(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    """The downstream exchange binds to an exchange that binds nothing: what crosses routes
    nowhere here, and is settled upstream (as the plugin, which does not publish mandatory)
    instead of coming back for ever."""
    up, down = pair
    await _declare(up.url, "nowhere.x", "nowhere.unused", [])
    async with await aio_pika.connect(down.url) as conn:
        ch = await conn.channel()
        x = await ch.declare_exchange("nowhere.x", aio_pika.ExchangeType.TOPIC, durable=True)
        dead_end = await ch.declare_exchange("nowhere.end", aio_pika.ExchangeType.FANOUT)
        await dead_end.bind(x, "k")
    _put(down, "federation-upstream", "nowhere", {"uri": up.url})
    _policy(down, "nowhere", r"^nowhere\.x$", {"federation-upstream": "nowhere"}, "exchanges")
    await _link(down, lambda r: r.get("exchange") == "nowhere.x" and r["status"] == "running")
    await _upstream_keys(up, "nowhere.x", {"k"})
    await _publish(up.url, "nowhere.x", [("k", b"%d" % i) for i in range(5)])
    path = f"/api/queues/%2F/{quote('federation: nowhere.x -> hare-down', safe='')}"
    await up.until(path, lambda q: q.get("messages_ready") == 0
                   and q.get("messages_unacknowledged") == 0
                   and q.get("message_stats", {}).get("ack", 0) >= 5, timeout=20)
    assert down.api("DELETE", "/api/policies/%2F/nowhere")[0] == 204


async def test_a_queue_link_yields_to_the_upstreams_own_consumers(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    """The link consumes with priority -1: while the upstream's own consumer has room, every
    message goes to it, even with a hungry consumer downstream."""
    up, down = pair
    for b in (up, down):
        async with await aio_pika.connect(b.url) as conn:
            await (await conn.channel()).declare_queue("fqp.work", durable=True)
    _put(down, "federation-upstream", "upp", {"uri": up.url})
    _policy(down, "fqp", r"^fqp\.", {"federation-upstream": "upp"}, "queues")
    await _link(down, lambda r: r.get("queue") == "fqp.work" and r["status"] == "running")
    downstream_got: list[bytes] = []
    upstream_got: list[bytes] = []
    all_upstream = asyncio.Event()

    async def on_down(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        downstream_got.append(msg.body)
        await msg.ack()

    async def on_up(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        upstream_got.append(msg.body)
        await msg.ack()
        if len(upstream_got) == 20:
            all_upstream.set()

    async with await aio_pika.connect(down.url) as dconn, \
            await aio_pika.connect(up.url) as uconn:
        dch = await dconn.channel()
        await (await dch.declare_queue("fqp.work", passive=True)).consume(on_down)
        # the link consumes upstream once the downstream queue has a consumer
        await up.until("/api/queues/%2F/fqp.work", lambda q: q.get("consumers") == 1,
                       timeout=10)
        uch = await uconn.channel()
        await uch.set_qos(prefetch_count=100)
        await (await uch.declare_queue("fqp.work", passive=True)).consume(on_up)
        await up.until("/api/queues/%2F/fqp.work", lambda q: q.get("consumers") == 2)
        await _publish(up.url, "", [("fqp.work", b"%d" % i) for i in range(20)])
        async with asyncio.timeout(20):
            await all_upstream.wait()
    assert sorted(upstream_got) == sorted(b"%d" % i for i in range(20))
    assert downstream_got == []
    assert down.api("DELETE", "/api/policies/%2F/fqp")[0] == 204
