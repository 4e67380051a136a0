"""Queues on their home node, reached over the inter-node link, with real processes: a
publish on A to a queue homed on B, consumed on C, arrives in order with confirms; acks,
rejects and basic.get go home; a busy home node pauses the far publisher's socket (credit
flow across the link) and the far node's memory stays bounded; x-queue-master-locator
min-masters homes a queue on the node with the fewest; a wrong cluster secret gets no link;
the home node judges exclusive consumers of every node; a far consumer whose client does not
read is credit-flowed."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import aiormq
import pytest
from pamqp import commands
from pamqp.commands import Basic

from tests.amqp_raw import RawClient
from tests.server.test_unread_socket import COUNT, fill_queue, read_all, rss

from .helpers import ClusterNode, EtcdProc, wait_for


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdProc
         ) -> Iterator[tuple[ClusterNode, ClusterNode, ClusterNode]]:
    root = tmp_path_factory.mktemp("link")
    # a long lease: test_credit_flow_across_the_link stops b for as long as a loaded machine
    # takes to see the pause and sample memory, and b must stay a member meanwhile (an expired
    # lease makes b down, its queue's publishes are released and the publisher finishes)
    nodes = [ClusterNode(root / n, etcd, "link", f"link-{n}",
                         ["--cluster-lease-ttl-s", "60"]).start() for n in "abc"]
    for node in nodes:
        wait_for(lambda n=node: all(x["running"] for x in n.get("/api/nodes"))
                 and len(n.get("/api/nodes")) == 3, what="three nodes")
    yield nodes[0], nodes[1], nodes[2]
    for node in nodes:
        node.stop()


async def test_publish_on_a_home_b_consume_on_c(trio: tuple[ClusterNode, ...]) -> None:
    a, b, c = trio
    cb = await aio_pika.connect(b.url)
    await (await cb.channel()).declare_queue("fw", durable=True)
    await cb.close()
    wait_for(lambda: all(n.api("GET", "/api/queues/%2F/fw")[0] == 200 for n in (a, c)),
             what="fw everywhere")
    assert a.get("/api/queues/%2F/fw")["node"] == "link-b"

    ca = await aio_pika.connect(a.url)
    pub = await ca.channel(publisher_confirms=True)
    n = 300
    confirms = await asyncio.gather(*[
        pub.default_exchange.publish(
            aio_pika.Message(str(i).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key="fw")
        for i in range(n)])
    assert all(isinstance(x, Basic.Ack) for x in confirms)
    assert b.get("/api/queues/%2F/fw")["messages"] == n  # the home node has them all
    # a passive declare on another node counts what the home node holds
    probe = await aio_pika.connect(c.url)
    declared = await (await probe.channel()).declare_queue("fw", passive=True)
    assert declared.declaration_result.message_count == n
    await probe.close()

    cc = await aio_pika.connect(c.url)
    ch = await cc.channel()
    await ch.set_qos(prefetch_count=50)
    q = await ch.get_queue("fw", ensure=False)
    got: list[int] = []
    done = asyncio.Event()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        got.append(int(message.body))
        if len(got) % 3 == 0:
            await message.reject(requeue=False)  # rejects go home too
        else:
            await message.ack()
        if len(got) == n:
            done.set()

    tag = await q.consume(on_message)
    await asyncio.wait_for(done.wait(), 30)
    assert got == list(range(n))
    await q.cancel(tag)
    wait_for(lambda: b.get("/api/queues/%2F/fw")["messages"] == 0, what="all settled home")

    # basic.get and purge on a remote queue are answered by its home node
    await pub.default_exchange.publish(aio_pika.Message(b"g1"), routing_key="fw")
    await pub.default_exchange.publish(aio_pika.Message(b"g2"), routing_key="fw")
    m1 = await q.get(no_ack=False)
    assert m1.body == b"g1"
    await m1.ack()
    assert await q.purge() is not None
    assert b.get("/api/queues/%2F/fw")["messages"] == 0
    await ca.close()
    await cc.close()


async def test_management_purge_and_get_reach_the_home_node(
        trio: tuple[ClusterNode, ...]) -> None:
    """The management API on a node that is not a queue's home purges and gets from the home
    node's queue (both are coroutines on every queue type, so the API awaits them)."""
    a, b, _ = trio
    cb = await aio_pika.connect(b.url)
    ch = await cb.channel()
    await ch.declare_queue("mp", durable=True)
    for i in range(5):
        await ch.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key="mp")
    await cb.close()
    wait_for(lambda: b.get("/api/queues/%2F/mp")["messages"] == 5, what="5 on b")
    wait_for(lambda: a.api("GET", "/api/queues/%2F/mp")[0] == 200, what="mp on a")
    status, got = a.api("POST", "/api/queues/%2F/mp/get",
                        {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert status == 200, got
    assert [m["payload"] for m in got] == ["0", "1"]
    assert a.api("DELETE", "/api/queues/%2F/mp/contents")[0] == 204
    wait_for(lambda: b.get("/api/queues/%2F/mp")["messages"] == 0, what="purged on b")


async def test_every_nodes_consumers_listed_once(trio: tuple[ClusterNode, ...]) -> None:
    """Consumers on A and C of queues homed on B: every node's /api/consumers and the queue's
    consumer_details list both once, on their own node and channel; a single-active-consumer
    queue's choice is made, and shown, by its home."""
    a, b, c = trio
    cb = await aio_pika.connect(b.url)
    chb = await cb.channel()
    await chb.declare_queue("lc", auto_delete=True)
    await chb.declare_queue("lsac", auto_delete=True,
                            arguments={"x-single-active-consumer": True})
    wait_for(lambda: all(n.api("GET", "/api/queues/%2F/lsac")[0] == 200 for n in (a, c)),
             what="queues everywhere")
    clients = []
    for node, first, second in ((a, "lc", "lsac"), (c, "lsac", "lc")):
        conn = await aio_pika.connect(node.url)
        ch = await conn.channel()
        for name in (first, second):  # lsac's consumer on A comes first: the active one
            await (await ch.get_queue(name)).consume(_hold, consumer_tag=f"{name}-{node.name}")
        clients.append(conn)
        # once the home node has it (consume-ok on A comes before the link brings it to B)
        await asyncio.to_thread(wait_for, lambda: b.get("/api/queues/%2F/lsac")["consumers"]
                                >= len(clients), 10.0, "lsac's consumers at home")
    want = {"lc-link-a": ("lc", "link-a", True, "up"), "lc-link-c": ("lc", "link-c", True, "up"),
            "lsac-link-a": ("lsac", "link-a", True, "single_active"),
            "lsac-link-c": ("lsac", "link-c", False, "waiting")}

    def seen(listed: list[dict]) -> dict[str, tuple[str, str, bool, str]]:
        tags = [x["consumer_tag"] for x in listed if x["queue"]["name"] in ("lc", "lsac")]
        assert len(tags) == len(set(tags)), tags
        return {x["consumer_tag"]: (x["queue"]["name"], x["channel_details"]["node"],
                                    x["active"], x["activity_status"])
                for x in listed if x["queue"]["name"] in ("lc", "lsac")}

    for node in (a, b, c):
        await asyncio.to_thread(wait_for, lambda n=node: seen(n.get("/api/consumers")) == want,
                                10.0, f"every consumer on {node.name}")
        details = (await asyncio.to_thread(node.get, "/api/queues/%2F/lc"))["consumer_details"]
        assert seen(details) == {t: want[t] for t in ("lc-link-a", "lc-link-c")}
        assert {x["channel_details"]["user"] for x in details} == {"guest"}
    for conn in (*clients, cb):
        await conn.close()


async def _hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    """Keep the delivery unacknowledged."""


async def test_credit_flow_across_the_link(trio: tuple[ClusterNode, ...]) -> None:
    """While the home node does not take messages (stopped), the publisher's channel on A
    runs out of credit towards the remote queue and A stops reading the publisher's socket,
    holding a bounded part of what is offered; when the home node resumes everything
    arrives."""
    a, b, _ = trio
    cb = await aio_pika.connect(b.url)
    await (await cb.channel()).declare_queue("cf")
    await cb.close()
    wait_for(lambda: a.api("GET", "/api/queues/%2F/cf")[0] == 200, what="cf on a")
    ca = await aio_pika.connect(a.url, client_properties={"connection_name": "cf-pub"})
    ch = await ca.channel(publisher_confirms=False)
    n, body = 3000, b"x" * 8192  # 24 MiB offered; credit lets ~2 x 400 messages in

    async def publish_all() -> None:
        for _ in range(n):
            await ch.default_exchange.publish(aio_pika.Message(body), routing_key="cf")

    def pauses() -> int:
        conns = [x for x in a.get("/api/connections")
                 if x.get("client_properties", {}).get("connection_name") == "cf-pub"]
        return int(conns[0].get("flow_pauses", 0)) if conns else 0

    def rss() -> int:
        return int(a.get("/api/nodes/link-a")["mem_used"])

    before = await asyncio.to_thread(rss)
    os.kill(b.pid, signal.SIGSTOP)  # for less than its lease: it stays a member
    try:
        publisher = asyncio.ensure_future(publish_all())
        await asyncio.to_thread(wait_for, lambda: pauses() > 0, 6.0,
                                "the publisher's socket paused")
        held = max([await asyncio.to_thread(rss) for _ in range(5)]) - before
        assert not publisher.done()  # held back by credit, not buffered in full on A
        assert held < n * len(body) // 2, f"A grew by {held >> 20} MiB"
    finally:
        os.kill(b.pid, signal.SIGCONT)
    await asyncio.wait_for(publisher, 30)
    await asyncio.to_thread(wait_for, lambda: b.get("/api/queues/%2F/cf")["messages"] == n,
                            30.0, f"all {n} on the home node")
    await ca.close()
    assert b.api("DELETE", "/api/queues/%2F/cf")[0] == 204


async def test_balanced_locator_homes_on_the_least_loaded(
        trio: tuple[ClusterNode, ...]) -> None:
    """x-queue-master-locator: min-masters (a classic queue; RabbitMQ 3.10 refuses
    x-queue-leader-locator on one) homes each new queue on the running node with the
    fewest queues (not the declaring one), created there before declare-ok; without it a
    queue stays on the declaring node (client-local)."""
    a = trio[0]

    def fewest() -> set[str]:
        running = {x["name"] for x in a.get("/api/nodes") if x["running"]}
        counts = dict.fromkeys(running, 0)
        for q in a.get("/api/queues/%2F"):
            if q["node"] in counts:
                counts[q["node"]] += 1
        low = min(counts.values())
        return {name for name, count in counts.items() if count == low}

    conn = await aio_pika.connect(a.url)
    ch = await conn.channel(publisher_confirms=True)
    homes = []
    for i in range(6):
        want = await asyncio.to_thread(fewest)
        q = await ch.declare_queue(f"bal.{i}",
                                   arguments={"x-queue-master-locator": "min-masters"})
        home = (await asyncio.to_thread(a.get, f"/api/queues/%2F/bal.{i}"))["node"]
        assert home in want, (home, want)
        homes.append(home)
        # the home node has it already: a publish right after declare-ok is confirmed there
        confirm = await ch.default_exchange.publish(aio_pika.Message(b"b"),
                                                    routing_key=f"bal.{i}")
        assert isinstance(confirm, Basic.Ack)
        assert (await q.get(no_ack=True)).body == b"b"
    assert len(set(homes)) == 3, homes  # spread over every node
    await ch.declare_queue("local.0")
    assert (await asyncio.to_thread(a.get, "/api/queues/%2F/local.0"))["node"] == "link-a"
    await conn.close()


async def test_wrong_secret_gets_no_link(tmp_path: Path, etcd: EtcdProc,
                                         trio: tuple[ClusterNode, ...]) -> None:
    """A node that does not know the cluster secret is a member (etcd lets it in) but no
    node links with it: its queues are unreachable from the others, nothing crosses."""
    a = trio[0]
    z = ClusterNode(tmp_path / "z", etcd, "link", "link-z",
                    ["--cluster-lease-ttl-s", "10", "--cluster-secret", "not-the-secret"])
    z.start()
    try:
        cz = await aio_pika.connect(z.url)
        await (await cz.channel()).declare_queue("zq")
        await cz.close()
        wait_for(lambda: a.api("GET", "/api/queues/%2F/zq")[0] == 200, what="zq on a")
        await asyncio.sleep(1.0)  # time enough for a dial and its refusal
        assert a.get("/api/queues/%2F/zq")["state"] == "down"
        assert "did not prove the cluster secret" in z.log() + a.log()
    finally:
        z.stop()


async def test_exclusive_consumer_is_judged_by_the_home_node(
        trio: tuple[ClusterNode, ...]) -> None:
    """RabbitMQ's 403 "in exclusive use" whatever node each consumer is on: the home queue
    judges every basic.consume, and another node waits for its answer before consume-ok."""
    a, b, c = trio
    cb = await aio_pika.connect(b.url)
    await (await cb.channel()).declare_queue("xc")
    wait_for(lambda: all(n.api("GET", "/api/queues/%2F/xc")[0] == 200 for n in (a, c)),
             what="xc everywhere")

    async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        pass

    async def consume(conn: aio_pika.abc.AbstractConnection, exclusive: bool) -> str:
        q = await (await conn.channel()).get_queue("xc", ensure=False)
        return await q.consume(ignore, no_ack=True, exclusive=exclusive)

    ca = await aio_pika.connect(a.url)
    cc = await aio_pika.connect(c.url)
    holder = await ca.channel()
    xq = await holder.get_queue("xc", ensure=False)
    tag = await xq.consume(ignore, no_ack=True, exclusive=True)
    for conn in (cc, cb):  # a consumer on a third node, and on the home node itself
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="in exclusive use"):
            await consume(conn, exclusive=False)
    await xq.cancel(tag)
    await consume(cc, exclusive=False)  # free again; now a plain consumer holds it on c
    for conn in (ca, cb):
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match="in exclusive use"):
            await consume(conn, exclusive=True)
    await cc.close()  # its consumer goes with its connection: the queue is free again
    await asyncio.to_thread(wait_for, lambda: b.get("/api/queues/%2F/xc")["consumers"] == 0,
                            10.0, "c's consumer gone")
    await consume(ca, exclusive=True)
    await ca.close()
    await cb.close()
    assert b.api("DELETE", "/api/queues/%2F/xc")[0] == 204


async def test_remote_consumer_that_never_reads_is_credit_flowed(
        trio: tuple[ClusterNode, ...]) -> None:
    """A no-ack consumer without a prefetch limit on A, of a queue homed on B, whose client
    never reads: B sends what A's writer takes and A grants back, as a local consumer's
    writer pauses its queue, so the messages wait in B's queue and A's memory stays bounded;
    everything arrives, in order, once the client reads."""
    a, b, _ = trio
    fill_queue(b.port, "unread-far")  # 500 x 100 KiB, homed on b
    wait_for(lambda: a.api("GET", "/api/queues/%2F/unread-far")[0] == 200, what="on a")
    before = rss(a.pid)
    reader = RawClient(a.port)
    reader.handshake()
    reader.open_channel(1)
    reader.send_method(1, commands.Basic.Consume(queue="unread-far", no_ack=True))
    await asyncio.sleep(1.0)  # A and B deliver what they can; the client reads nothing
    ready = b.get("/api/queues/%2F/unread-far")["messages"]
    assert ready > COUNT // 2, ready  # most wait in the home queue, not in A's buffers
    assert rss(a.pid) - before < 32 * 1024 * 1024
    assert await asyncio.to_thread(read_all, reader, COUNT) == list(range(COUNT))
    reader.close()
    assert b.api("DELETE", "/api/queues/%2F/unread-far")[0] == 204


def test_delete_ok_comes_before_the_cancel_of_another_channel(
        trio: tuple[ClusterNode, ...]) -> None:
    """A queue.delete answers once the cluster has the deletion; the basic.cancel it causes on
    another channel of the same connection waits for the same commit, so it comes after the
    delete-ok, as from RabbitMQ (and from a single node)."""
    a = trio[0]
    c = RawClient(a.port)
    c.handshake()  # consumer_cancel_notify
    c.open_channel(1)
    c.open_channel(2)
    c.send_method(1, commands.Queue.Declare(queue="dc"))
    c.expect(commands.Queue.DeclareOk, 1)
    c.send_method(1, commands.Basic.Consume(queue="dc", consumer_tag="held"))
    c.expect(commands.Basic.ConsumeOk, 1)
    c.send_method(2, commands.Queue.Delete(queue="dc"))
    c.expect(commands.Queue.DeleteOk, 2)
    assert c.expect(commands.Basic.Cancel, 1).consumer_tag == "held"
    c.close()
