"""Metadata in etcd, with real processes: what one node declares every node knows (and
routes by), concurrent declares end as on one node, deletes reach everyone, users and
policies too, and a definitions export or import on any node covers the whole cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pika
import pytest
from aiormq.exceptions import ChannelLockedResource, ChannelPreconditionFailed

from .helpers import ClusterNode, EtcdProc, node_pair, wait_for


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdProc
         ) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    with node_pair(tmp_path_factory.mktemp("meta"), etcd, "meta") as nodes:
        yield nodes


def queue_names(node: ClusterNode) -> dict[str, str]:
    return {q["name"]: q["node"] for q in node.get("/api/queues/%2F")}


async def test_declares_are_seen_everywhere(pair: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = pair
    conn = await aio_pika.connect(a.url)
    ch = await conn.channel()
    x = await ch.declare_exchange("m.x", aio_pika.ExchangeType.TOPIC, durable=True)
    q = await ch.declare_queue("m.q", durable=True, arguments={"x-max-length": 10})
    await q.bind(x, "k.#")
    await conn.close()
    wait_for(lambda: queue_names(b).get("m.q") == "meta-a", what="m.q on b")
    wait_for(lambda: any(bd["source"] == "m.x" and bd["destination"] == "m.q"
                         for bd in b.get("/api/bindings/%2F")), what="binding on b")
    assert b.get("/api/exchanges/%2F/m.x")["type"] == "topic"
    assert b.get("/api/queues/%2F/m.q")["arguments"] == {"x-max-length": 10}

    # a redeclare on b with other arguments is refused as on one node
    conn = await aio_pika.connect(b.url)
    ch = await conn.channel()
    with pytest.raises(ChannelPreconditionFailed, match="inequivalent arg 'x-max-length'"):
        await ch.declare_queue("m.q", durable=True, arguments={"x-max-length": 11})
    ch = await conn.channel()
    await ch.declare_queue("m.q", durable=True, arguments={"x-max-length": 10})  # the same: ok
    # a delete on b reaches a
    await ch.queue_delete("m.q")
    await ch.exchange_delete("m.x")
    await conn.close()
    wait_for(lambda: "m.q" not in queue_names(a), what="m.q gone on a")
    wait_for(lambda: all(bd["source"] != "m.x" for bd in a.get("/api/bindings/%2F")),
             what="bindings gone on a")


async def test_racing_declares_one_wins(pair: tuple[ClusterNode, ClusterNode]) -> None:
    """Two nodes declare the same queue with different arguments at the same moment, many
    times over: each round exactly one declare-ok and one 406, and both nodes agree on the
    winner's arguments."""
    a, b = pair
    ca, cb = await aio_pika.connect(a.url), await aio_pika.connect(b.url)
    try:
        for round_ in range(5):
            name = f"race.{round_}"

            async def declare(conn: aio_pika.abc.AbstractConnection, length: int,
                              name: str = name) -> int:
                ch = await conn.channel()
                try:
                    await ch.declare_queue(name, arguments={"x-max-length": length})
                except ChannelPreconditionFailed:
                    return 0
                await ch.close()
                return length

            results = await asyncio.gather(declare(ca, 1), declare(cb, 2))
            winners = [r for r in results if r]
            assert len(winners) == 1, results
            for node in (a, b):
                wait_for(lambda n=node, q=name: n.api("GET", f"/api/queues/%2F/{q}")[0] == 200,
                         what=f"{name} on {node.name}")
                assert node.get(f"/api/queues/%2F/{name}")["arguments"] == {
                    "x-max-length": winners[0]}
    finally:
        await ca.close()
        await cb.close()


async def test_racing_exclusive_declares_on_one_node(
        pair: tuple[ClusterNode, ClusterNode]) -> None:
    """Two connections of one node declare the same exclusive queue at once: one owns it,
    the other gets 405 as on a single node (the loser's view of the winner's record must not
    create the queue without its owner)."""
    a, _ = pair
    c1, c2 = await aio_pika.connect(a.url), await aio_pika.connect(a.url)
    try:
        for round_ in range(20):
            name = f"xrace.{round_}"

            async def declare(conn: aio_pika.abc.AbstractConnection,
                              name: str = name) -> aio_pika.abc.AbstractChannel | None:
                ch = await conn.channel()
                try:
                    await ch.declare_queue(name, exclusive=True)
                except ChannelLockedResource:
                    return None
                return ch

            results = await asyncio.gather(declare(c1), declare(c2))
            owners = [ch for ch in results if ch is not None]
            assert len(owners) == 1, (round_, results)
            # the owner uses it; the other connection still cannot
            q = await owners[0].get_queue(name)
            await owners[0].default_exchange.publish(aio_pika.Message(b"x"), routing_key=name)
            assert (await q.get(no_ack=True)).body == b"x"
            other = c2 if results[0] is not None else c1
            with pytest.raises(ChannelLockedResource):
                await (await other.channel()).declare_queue(name, exclusive=True)
    finally:
        await c1.close()
        await c2.close()


async def test_users_policies_and_definitions(pair: tuple[ClusterNode, ClusterNode]) -> None:
    a, b = pair
    assert a.api("PUT", "/api/users/meta-user", {"password": "pw", "tags": ""})[0] == 201
    assert a.api("PUT", "/api/permissions/%2F/meta-user",
                 {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    assert a.api("PUT", "/api/policies/%2F/meta-pol",
                 {"pattern": "^pol\\.", "definition": {"max-length": 3}})[0] == 201
    wait_for(lambda: b.api("GET", "/api/users/meta-user")[0] == 200, what="user on b")
    wait_for(lambda: b.api("GET", "/api/policies/%2F/meta-pol")[0] == 200, what="policy on b")
    # the user logs in on b; the policy applies to a queue declared on b
    conn = await aio_pika.connect(f"amqp://meta-user:pw@127.0.0.1:{b.port}/")
    ch = await conn.channel()
    await ch.declare_queue("pol.q")
    await conn.close()
    assert b.get("/api/queues/%2F/pol.q")["policy"] == "meta-pol"
    wait_for(lambda: queue_names(a).get("pol.q") == "meta-b", what="pol.q on a")
    # a's stand-in for b's queue takes the policy too (set_policies, as every queue type)
    assert a.get("/api/queues/%2F/pol.q")["policy"] == "meta-pol"
    # an export on either node has every node's durable queues
    assert a.api("PUT", "/api/queues/%2F/exp.b", {"durable": True})[0] == 201
    for node in (a, b):
        wait_for(lambda n=node: "exp.b" in {q["name"] for q in n.get("/api/definitions")["queues"]},
                 what=f"exp.b exported by {node.name}")
    # kinds added later plug in as key families: topic permissions and user limits
    assert a.api("PUT", "/api/topic-permissions/%2F/meta-user",
                 {"exchange": "amq.topic", "write": "^a", "read": ".*"})[0] in (201, 204)
    assert a.api("PUT", "/api/user-limits/meta-user/max-connections", {"value": 7})[0] == 204
    wait_for(lambda: b.api("GET", "/api/topic-permissions/%2F/meta-user")[0] == 200,
             what="topic permission on b")
    assert b.get("/api/topic-permissions/%2F/meta-user")[0]["write"] == "^a"
    wait_for(lambda: b.get("/api/user-limits/meta-user") == [
        {"user": "meta-user", "value": {"max-connections": 7}}], what="user limit on b")
    # deleting the user on b removes it on a
    assert b.api("DELETE", "/api/users/meta-user")[0] == 204
    wait_for(lambda: a.api("GET", "/api/users/meta-user")[0] == 404, what="user gone on a")


async def test_definitions_import_reaches_every_node(
        pair: tuple[ClusterNode, ClusterNode]) -> None:
    """An import on one node is the whole cluster's: vhost, user, permissions, exchange,
    queue and binding appear on the other, which routes by them at once."""
    a, b = pair
    defs = {
        "vhosts": [{"name": "imp"}],
        "users": [{"name": "imp-user", "password": "ipw", "tags": ""}],
        "permissions": [{"user": "imp-user", "vhost": "imp", "configure": ".*",
                         "write": ".*", "read": ".*"}],
        "exchanges": [{"name": "imp.x", "vhost": "imp", "type": "direct", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "queues": [{"name": "imp.q", "vhost": "imp", "durable": True, "auto_delete": False,
                    "arguments": {"x-max-length": 5}}],
        "bindings": [{"source": "imp.x", "vhost": "imp", "destination": "imp.q",
                      "destination_type": "queue", "routing_key": "k", "arguments": {}}],
    }
    assert a.api("POST", "/api/definitions", defs)[0] == 204
    wait_for(lambda: any(bd["source"] == "imp.x" for bd in b.get("/api/bindings/imp")),
             what="the imported binding on b")
    assert b.get("/api/queues/imp/imp.q")["node"] == "meta-a"
    conn = await aio_pika.connect(f"amqp://imp-user:ipw@127.0.0.1:{b.port}/imp")
    ch = await conn.channel(publisher_confirms=True)
    x = await ch.get_exchange("imp.x")
    await x.publish(aio_pika.Message(b"imported"), routing_key="k")
    q = await ch.get_queue("imp.q")
    assert (await q.get(no_ack=True)).body == b"imported"
    await conn.close()
    exported = b.get("/api/definitions")
    assert "imp" in {v["name"] for v in exported["vhosts"]}
    assert "imp.q" in {q["name"] for q in exported["queues"]}
    assert a.api("DELETE", "/api/vhosts/imp")[0] == 204
    wait_for(lambda: b.api("GET", "/api/vhosts/imp")[0] == 404, what="imp gone on b")


def test_restart_takes_the_cluster_state(tmp_path: Path, etcd: EtcdProc,
                                         pair: tuple[ClusterNode, ClusterNode]) -> None:
    """A node stopped while the others change definitions finds them at start: new ones
    appear, deleted ones (its own durable queues included) go."""
    a, b = pair
    assert b.api("PUT", "/api/queues/%2F/stays", {"durable": True})[0] == 201
    assert b.api("PUT", "/api/queues/%2F/goes", {"durable": True})[0] == 201
    wait_for(lambda: {"stays", "goes"} <= set(queue_names(a)), what="queues on a")
    b.stop()
    assert a.api("DELETE", "/api/queues/%2F/goes")[0] == 204
    assert a.api("PUT", "/api/exchanges/%2F/while-down", {"type": "fanout"})[0] == 201
    b.start()
    assert "goes" not in queue_names(b)
    assert queue_names(b)["stays"] == "meta-b"
    assert b.api("GET", "/api/exchanges/%2F/while-down")[0] == 200


def test_user_and_vhost_limits_count_every_node(pair: tuple[ClusterNode, ClusterNode]) -> None:
    """A user's max-connections and max-channels and a vhost's max-connections count the
    connections and channels of every node, as RabbitMQ's: the one that would pass the limit
    is refused on the other node too."""
    a, b = pair
    assert a.api("PUT", "/api/users/lim-user", {"password": "lpw", "tags": ""})[0] in (201, 204)
    assert a.api("PUT", "/api/vhosts/lim", {})[0] in (201, 204)
    for vhost in ("%2F", "lim"):
        assert a.api("PUT", f"/api/permissions/{vhost}/lim-user",
                     {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    assert a.api("PUT", "/api/user-limits/lim-user/max-connections", {"value": 1})[0] == 204
    assert a.api("PUT", "/api/vhost-limits/lim/max-connections", {"value": 1})[0] == 204
    # b answers 404 until the limit has reached it: polled by status, not asserted at once
    wait_for(lambda: b.api("GET", "/api/user-limits/lim-user") == (200, [
        {"user": "lim-user", "value": {"max-connections": 1}}]), what="user limit on b")
    wait_for(lambda: b.api("GET", "/api/vhost-limits/lim") == (200, [
        {"vhost": "lim", "value": {"max-connections": 1}}]), what="vhost limit on b")

    def connect(node: ClusterNode, vhost: str = "/", user: str = "lim-user",
                password: str = "lpw") -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", node.port, vhost, pika.PlainCredentials(user, password),
            connection_attempts=1))

    first = connect(a)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(b)
    assert "user connection limit (1) is reached" in str(info.value)
    first.close()
    guest = connect(a, "lim", "guest", "guest")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(b, "lim", "guest", "guest")
    assert "connection limit (1) is reached" in str(info.value)
    guest.close()

    assert a.api("DELETE", "/api/user-limits/lim-user/max-connections")[0] == 204
    assert a.api("PUT", "/api/user-limits/lim-user/max-channels", {"value": 1})[0] == 204
    wait_for(lambda: b.get("/api/user-limits/lim-user") == [
        {"user": "lim-user", "value": {"max-channels": 1}}], what="channel limit on b")
    on_a, on_b = connect(a), connect(b)
    on_a.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        on_b.channel()
    assert closed.value.reply_code == 530
    on_a.close()
