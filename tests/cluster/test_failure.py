"""A node going down, with real processes: its queues answer 404 with RabbitMQ's text and
are never recreated elsewhere, publishes to them are returned and nacked, the others keep
serving (their own queues and each other's, over their link), and its restart brings every
confirmed persistent message back; a node cut off
from etcd longer than its lease comes back by itself."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import aio_pika
import pytest
from aiormq.exceptions import ChannelNotFoundEntity, DeliveryError
from pamqp import commands
from pamqp.commands import Basic

from tests.amqp_raw import RawClient

from .helpers import ClusterNode, EtcdProc, wait_for

DOWN = "home node 'fail-b' of durable queue 'dq' in vhost '/' is down or inaccessible"


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdProc
         ) -> Iterator[tuple[ClusterNode, ClusterNode, ClusterNode]]:
    root = tmp_path_factory.mktemp("fail")
    a, b, c = (ClusterNode(root / n, etcd, "fail", f"fail-{n}").start() for n in "abc")
    yield a, b, c
    b.kill()
    c.stop()
    a.stop()


def links_up(node: ClusterNode) -> bool:
    return all(n["running"] for n in node.get("/api/nodes"))


async def test_kill_home_node_then_restart(trio: tuple[ClusterNode, ...]) -> None:
    a, b, c = trio
    cc = await aio_pika.connect(c.url)
    await (await cc.channel()).declare_queue("cq", durable=True)  # homed on c
    await cc.close()
    cb = await aio_pika.connect(b.url)
    chb = await cb.channel()
    dq = await chb.declare_queue("dq", durable=True)
    await dq.bind("amq.fanout")
    await chb.declare_queue("tq", durable=False)  # goes with its node
    await chb.declare_queue("wq", durable=True)  # consumed from a when b dies
    await chb.declare_queue("xq", exclusive=True)  # goes with its connection's node
    await cb.close()
    cb = await aio_pika.connect(b.url)
    await (await cb.channel()).declare_queue("xq2", exclusive=True)  # b is killed holding it
    wait_for(lambda: all(a.api("GET", f"/api/queues/%2F/{q}")[0] == 200 for q in ("dq", "cq")),
             what="dq and cq on a")

    ca = await aio_pika.connect(a.url)
    pub = await ca.channel(publisher_confirms=True)
    local = await pub.declare_queue("aq", durable=True)  # homed on a
    n = 100
    await asyncio.gather(*[pub.default_exchange.publish(
        aio_pika.Message(str(i).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
        routing_key="dq") for i in range(n)])  # all confirmed: on b's disk

    watcher = RawClient(a.port)
    watcher.handshake()
    watcher.open_channel(1)
    watcher.send_method(1, commands.Basic.Consume(queue="wq", consumer_tag="w"))
    watcher.expect(commands.Basic.ConsumeOk, 1)

    b.kill()
    # a's consumer of b's queue is cancelled (RabbitMQ's basic.cancel when a queue's node goes)
    cancel = await asyncio.to_thread(watcher.expect, commands.Basic.Cancel, 1, 15.0)
    assert cancel.consumer_tag == "w"  # type: ignore[attr-defined]
    watcher.close()
    # b's exclusive queue goes once b is down for the cluster (its lease expired)
    wait_for(lambda: a.api("GET", "/api/queues/%2F/xq2")[0] == 404, timeout=15,
             what="xq2 dropped")
    # a's own queues go on, and c's through the a-c link
    for name in ("aq", "cq"):
        confirm = await pub.default_exchange.publish(aio_pika.Message(b"still"),
                                                     routing_key=name)
        assert isinstance(confirm, Basic.Ack)
        q = await pub.get_queue(name, ensure=False)
        assert (await q.get(no_ack=True)).body == b"still"
    # b's queue: 404 with RabbitMQ's text for declare, consume and get; never recreated
    for attempt in ("declare", "consume", "get"):
        ch = await ca.channel()
        with pytest.raises(ChannelNotFoundEntity, match=DOWN):
            if attempt == "declare":
                await ch.declare_queue("dq", durable=True)
            elif attempt == "consume":
                q = await ch.get_queue("dq", ensure=False)
                await q.consume(lambda m: None)
            else:
                q = await ch.get_queue("dq", ensure=False)
                await q.get()
    assert a.get("/api/queues/%2F/dq")["node"] == "fail-b"
    # a publish that reaches only the down queue is not confirmed as delivered: nacked,
    # and returned first when mandatory
    with pytest.raises(DeliveryError):
        await pub.default_exchange.publish(aio_pika.Message(b"nacked"), routing_key="dq",
                                           mandatory=False)
    returned: list[bytes] = []
    pub.return_callbacks.add(lambda _, m: returned.append(m.body))
    result = await pub.default_exchange.publish(aio_pika.Message(b"lost"), routing_key="dq",
                                                mandatory=True)
    assert returned == [b"lost"] and not isinstance(result, Basic.Ack)
    # routed to a live queue too (a fanout bound to both): that one confirms it
    await (await pub.get_queue("aq", ensure=False)).bind("amq.fanout")
    fanout = await pub.get_exchange("amq.fanout", ensure=False)
    assert isinstance(await fanout.publish(aio_pika.Message(b"both"), routing_key=""),
                      Basic.Ack)
    assert (await local.get()).body == b"both"

    b.start()
    wait_for(lambda: links_up(a) and a.get("/api/queues/%2F/dq")["state"] == "running",
             what="b back")
    assert b.get("/api/queues/%2F/dq")["messages"] == n
    # its non-durable queue did not survive its restart, anywhere
    wait_for(lambda: all(x.api("GET", "/api/queues/%2F/tq")[0] == 404 for x in (a, b)),
             what="tq gone")
    ch = await ca.channel()
    q = await ch.get_queue("dq", ensure=False)
    bodies = []
    for _ in range(n):
        m = await q.get(no_ack=True)
        bodies.append(int(m.body))
    assert bodies == list(range(n))
    await ca.close()


async def test_lease_expired_while_cut_off(trio: tuple[ClusterNode, ...]) -> None:
    """SIGSTOP longer than the lease (3 s): the others see the node down; resumed, it finds
    its lease gone, joins again and serves its queues to the cluster as before."""
    a, b, _ = trio
    if b.proc is None:
        b.start()
    wait_for(lambda: links_up(a), what="both up")
    os.kill(b.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: not links_up(a), timeout=15, what="b down for a")
    finally:
        os.kill(b.pid, signal.SIGCONT)
    wait_for(lambda: links_up(a), timeout=15, what="b back by itself")
    wait_for(lambda: a.get("/api/queues/%2F/dq")["state"] == "running", what="dq reachable")
    ca = await aio_pika.connect(a.url)
    ch = await ca.channel()
    await ch.default_exchange.publish(aio_pika.Message(b"after"), routing_key="dq")
    q = await ch.get_queue("dq", ensure=False)
    got = None
    for _ in range(50):
        got = await q.get(fail=False, no_ack=True)
        if got is not None:
            break
        await asyncio.sleep(0.1)
    assert got is not None and got.body == b"after"
    await ca.close()


def test_a_down_homes_queue_can_still_be_deleted(tmp_path, etcd: EtcdProc) -> None:  # type: ignore[no-untyped-def]
    """queue.delete without if-empty / if-unused of a queue whose home is down: deleted, with
    a count of 0 (delete-ok's count is asked of the home, which cannot answer); with either
    flag there is nothing to judge by, so it is refused with the home-down 404."""
    import pika
    import pika.exceptions

    a, b = (ClusterNode(tmp_path / n, etcd, "deldown", f"deldown-{n}").start() for n in "ab")
    try:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        for q in ("gone-q", "kept-q"):
            conn.channel().queue_declare(q, durable=True)
        conn.close()
        wait_for(lambda: a.api("GET", "/api/queues/%2F/kept-q")[0] == 200, what="queues on a")
        b.kill()
        wait_for(lambda: not {n["name"]: n["running"] for n in a.get("/api/nodes")
                              }["deldown-b"], timeout=20, what="b down")
        conn = pika.BlockingConnection(pika.URLParameters(a.url))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            conn.channel().queue_delete("kept-q", if_empty=True)
        assert refused.value.reply_code == 404
        assert conn.channel().queue_delete("gone-q").method.message_count == 0
        conn.close()
        assert a.api("GET", "/api/queues/%2F/gone-q")[0] == 404
    finally:
        b.kill()
        a.stop()
