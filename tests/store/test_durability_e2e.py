"""Durable exchanges, queues, bindings and persistent messages across restarts, end to end."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from aio_pika import DeliveryMode, ExchangeType, Message

pytestmark = pytest.mark.asyncio


async def _publish_confirmed(url: str, n: int, size: int = 100, queue: str = "dq") -> None:
    conn = await aio_pika.connect(url)
    ch = await conn.channel(publisher_confirms=True)
    x = await ch.declare_exchange("dx", ExchangeType.DIRECT, durable=True)
    q = await ch.declare_queue(queue, durable=True)
    await q.bind(x, "k")
    body_pad = b"." * size
    await asyncio.gather(*[
        x.publish(Message(b"%06d" % i + body_pad, delivery_mode=DeliveryMode.PERSISTENT), "k")
        for i in range(n)
    ])
    await conn.close()


async def _read_all(url: str, queue: str = "dq") -> list[bytes]:
    conn = await aio_pika.connect(url)
    ch = await conn.channel()
    q = await ch.declare_queue(queue, durable=True)
    out = []
    while True:
        m = await q.get(fail=False)
        if m is None:
            break
        out.append(m.body)
        await m.ack()
    await conn.close()
    return out


@pytest.mark.parametrize("size", [100, 10_000])  # embedded in the index / in the msg_store
async def test_persistent_messages_survive_clean_restart(fresh_broker, size):
    fresh_broker.start()
    await _publish_confirmed(fresh_broker.url, 200, size)
    assert fresh_broker.stop() == 0
    fresh_broker.start()
    bodies = await _read_all(fresh_broker.url)
    assert [b[:6] for b in bodies] == [b"%06d" % i for i in range(200)]


@pytest.mark.parametrize("size", [100, 10_000])
async def test_confirmed_persistent_messages_survive_kill_9(fresh_broker, size):
    fresh_broker.start()
    await _publish_confirmed(fresh_broker.url, 300, size)
    fresh_broker.kill()
    fresh_broker.start()
    bodies = await _read_all(fresh_broker.url)
    assert [b[:6] for b in bodies] == [b"%06d" % i for i in range(300)]


async def test_acked_messages_stay_acked_and_unacked_come_back_redelivered(fresh_broker):
    fresh_broker.start()
    await _publish_confirmed(fresh_broker.url, 10, 5000)
    conn = await aio_pika.connect(fresh_broker.url)
    ch = await conn.channel()
    q = await ch.declare_queue("dq", durable=True)
    first = [await q.get() for _ in range(4)]
    for m in first[:2]:
        await m.ack()
    await asyncio.sleep(0.2)  # the acks reach the index before the crash
    fresh_broker.kill()
    fresh_broker.start()
    conn = await aio_pika.connect(fresh_broker.url)
    ch = await conn.channel()
    q = await ch.declare_queue("dq", durable=True)
    got = []
    while (m := await q.get(fail=False)) is not None:
        got.append((m.body[:6], m.redelivered))
        await m.ack()
    await conn.close()
    assert [b for b, _ in got] == [b"%06d" % i for i in range(2, 10)]
    assert [r for _, r in got[:2]] == [True, True]  # delivered before the crash, never acked
    assert not any(r for _, r in got[2:])


async def test_topology_survives_restart_transient_things_do_not(fresh_broker):
    fresh_broker.start()
    conn = await aio_pika.connect(fresh_broker.url)
    ch = await conn.channel()
    dx = await ch.declare_exchange("keep-x", ExchangeType.TOPIC, durable=True)
    await ch.declare_exchange("lose-x", ExchangeType.FANOUT, durable=False)
    dq = await ch.declare_queue("keep-q", durable=True)
    await ch.declare_queue("lose-q", durable=False)
    await dq.bind(dx, "a.#")
    await ch.default_exchange.publish(Message(b"transient"), "keep-q")  # not persistent
    await conn.close()
    fresh_broker.stop()
    fresh_broker.start()
    conn = await aio_pika.connect(fresh_broker.url)
    ch = await conn.channel()
    dx = await ch.declare_exchange("keep-x", ExchangeType.TOPIC, passive=True)
    dq = await ch.declare_queue("keep-q", passive=True)
    assert dq.declaration_result.message_count == 0  # the transient message is gone
    await dx.publish(Message(b"routed"), "a.b.c")  # the binding came back
    m = await dq.get(timeout=5)
    assert m.body == b"routed"
    for name, kind in (("lose-x", "exchange"), ("lose-q", "queue")):
        probe = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            if kind == "exchange":
                await probe.declare_exchange(name, passive=True)
            else:
                await probe.declare_queue(name, passive=True)
    await conn.close()


async def test_fanout_to_durable_queues_shares_one_body(fresh_broker):
    fresh_broker.start()
    conn = await aio_pika.connect(fresh_broker.url)
    ch = await conn.channel(publisher_confirms=True)
    fx = await ch.declare_exchange("fan", ExchangeType.FANOUT, durable=True)
    queues = [await ch.declare_queue(f"fq{i}", durable=True) for i in range(3)]
    for q in queues:
        await q.bind(fx)
    big = b"x" * 50_000
    await fx.publish(Message(big, delivery_mode=DeliveryMode.PERSISTENT), "")
    # each queue takes its own copy out: the body stays until the last one acks
    for q in queues[:2]:
        m = await q.get()
        await m.ack()
    await conn.close()
    await asyncio.sleep(0.3)  # acks are not confirmed to the client: give them time to land
    fresh_broker.kill()
    fresh_broker.start()
    conn = await aio_pika.connect(fresh_broker.url)
    ch = await conn.channel()
    counts = []
    for i in range(3):
        q = await ch.declare_queue(f"fq{i}", passive=True)
        counts.append(q.declaration_result.message_count)
    assert counts == [0, 0, 1]
    q = await ch.declare_queue("fq2", passive=True)
    m = await q.get()
    assert m.body == big
    await conn.close()
