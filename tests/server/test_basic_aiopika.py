"""Core AMQP behaviour through aio-pika, the reference client."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import pytest
from aio_pika import ExchangeType, Message

pytestmark = pytest.mark.asyncio


async def connect(broker):
    return await aio_pika.connect(broker.url)


async def drain(queue: aio_pika.abc.AbstractQueue, n: int, timeout: float = 5.0) -> list:
    got = []
    async def run():
        async with queue.iterator() as it:
            async for m in it:
                got.append(m)
                if len(got) == n:
                    return
    await asyncio.wait_for(run(), timeout)
    return got


async def test_publish_consume_ack(broker):
    conn = await connect(broker)
    ch = await conn.channel()
    q = await ch.declare_queue("", exclusive=True)
    for i in range(10):
        await ch.default_exchange.publish(Message(b"m%d" % i), routing_key=q.name)
    msgs = await drain(q, 10)
    assert [m.body for m in msgs] == [b"m%d" % i for i in range(10)]
    for m in msgs:
        await m.ack()
    await asyncio.sleep(0.1)
    declared = await ch.declare_queue(q.name, passive=True)
    assert declared.declaration_result.message_count == 0
    await conn.close()


async def test_properties_round_trip(broker):
    conn = await connect(broker)
    ch = await conn.channel()
    q = await ch.declare_queue("", exclusive=True)
    await ch.default_exchange.publish(
        Message(b"x", content_type="text/plain", headers={"a": 1, "b": "two"},
                correlation_id="c1", reply_to="r", message_id="id1", priority=3,
                app_id="app", type="t"),
        routing_key=q.name,
    )
    (m,) = await drain(q, 1)
    assert m.content_type == "text/plain"
    assert m.headers == {"a": 1, "b": "two"}
    assert (m.correlation_id, m.reply_to, m.message_id, m.priority) == ("c1", "r", "id1", 3)
    assert m.routing_key == q.name and m.exchange == ""
    await conn.close()


async def test_large_body_split_over_frames(broker):
    conn = await connect(broker)
    ch = await conn.channel()
    q = await ch.declare_queue("", exclusive=True)
    body = bytes(range(256)) * 2000  # 512 KB: several frames each way
    await ch.default_exchange.publish(Message(body), routing_key=q.name)
    (m,) = await drain(q, 1)
    assert m.body == body
    await conn.close()


async def test_round_robin_between_consumers(broker):
    conn = await connect(broker)
    ch1 = await conn.channel()
    ch2 = await conn.channel()
    q1 = await ch1.declare_queue("rr-q", auto_delete=True)
    q2 = await ch2.declare_queue("rr-q", auto_delete=True)
    got: dict[str, list[bytes]] = {"a": [], "b": []}

    async def on(name, m):
        got[name].append(m.body)
        await m.ack()

    await q1.consume(lambda m: on("a", m))
    await q2.consume(lambda m: on("b", m))
    for i in range(20):
        await ch1.default_exchange.publish(Message(b"%d" % i), routing_key="rr-q")
    for _ in range(50):
        if len(got["a"]) + len(got["b"]) == 20:
            break
        await asyncio.sleep(0.05)
    assert len(got["a"]) == 10 and len(got["b"]) == 10
    await conn.close()


async def test_prefetch_limits_unacked(broker):
    conn = await connect(broker)
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=3)
    q = await ch.declare_queue("", exclusive=True)
    for i in range(10):
        await ch.default_exchange.publish(Message(b"%d" % i), routing_key=q.name)
    held = []
    await q.consume(lambda m: held.append(m))
    await asyncio.sleep(0.3)
    assert len(held) == 3
    await held[0].ack()
    await asyncio.sleep(0.2)
    assert len(held) == 4
    await conn.close()


async def test_nack_requeue_keeps_place_and_sets_redelivered(broker):
    conn = await connect(broker)
    ch = await conn.channel()
    q = await ch.declare_queue("", exclusive=True)
    for i in range(3):
        await ch.default_exchange.publish(Message(b"%d" % i), routing_key=q.name)
    first = await q.get()
    assert first.body == b"0" and not first.redelivered
    await first.nack(requeue=True)
    again = await q.get()
    assert again.body == b"0" and again.redelivered
    await again.reject(requeue=False)
    nxt = await q.get()
    assert nxt.body == b"1"
    await nxt.ack()
    await conn.close()


async def test_basic_get_empty_and_count(broker):
    conn = await connect(broker)
    ch = await conn.channel()
    q = await ch.declare_queue("", exclusive=True)
    assert await q.get(fail=False) is None
    await ch.default_exchange.publish(Message(b"a"), routing_key=q.name)
    await ch.default_exchange.publish(Message(b"b"), routing_key=q.name)
    m = await q.get(no_ack=True)
    assert m.body == b"a" and m.message_count == 1
    await conn.close()


async def test_unacked_requeued_when_channel_closes(broker):
    conn = await connect(broker)
    ch = await conn.channel()
    q = await ch.declare_queue("requeue-on-close", auto_delete=False)
    await q.purge()
    await ch.default_exchange.publish(Message(b"keep"), routing_key=q.name)
    m = await q.get()
    assert m.body == b"keep"
    await ch.close()
    ch2 = await conn.channel()
    q2 = await ch2.declare_queue("requeue-on-close", auto_delete=False)
    m2 = await q2.get()
    assert m2.body == b"keep" and m2.redelivered
    await m2.ack()
    await q2.delete()
    await conn.close()


async def test_confirms_and_mandatory_return_before_ack(broker):
    conn = await connect(broker)
    ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
    x = await ch.declare_exchange("conf-x", ExchangeType.DIRECT, auto_delete=True)
    q = await ch.declare_queue("", exclusive=True)
    await q.bind(x, "k")
    ok = await x.publish(Message(b"routed"), routing_key="k", mandatory=True)
    assert ok is not None
    with pytest.raises(aio_pika.exceptions.DeliveryError) as info:
        await x.publish(Message(b"lost"), routing_key="nowhere", mandatory=True)
    # aio-pika raises DeliveryError carrying the basic.return only if it came before the ack
    assert info.value.message is not None and info.value.message.body == b"lost"
    await conn.close()


async def test_immediate_is_refused(broker):
    from pamqp import commands

    from tests.amqp_raw import RawClient

    c = RawClient(broker.port)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="x", immediate=True))
    c.send_content(1, b"x")
    close = c.expect(commands.Connection.Close)
    assert close.reply_code == 540
    c.close()


async def test_publish_to_missing_exchange_closes_channel_404(broker):
    conn = await connect(broker)
    ch = await conn.channel()
    x = await ch.get_exchange("no-such-exchange", ensure=False)
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as info:
        await x.publish(Message(b"x"), routing_key="k")
        await asyncio.sleep(0.2)
        await ch.declare_queue("", exclusive=True)
    assert "no exchange 'no-such-exchange'" in str(info.value)
    assert ch.is_closed
    # the connection survives a channel error
    ch2 = await conn.channel()
    await ch2.declare_queue("", exclusive=True)
    await conn.close()


async def test_tx_commit_and_rollback(broker):
    conn = await connect(broker)
    ch = await conn.channel(publisher_confirms=False)
    q = await ch.declare_queue("", exclusive=True)
    tx = ch.transaction()
    await tx.select()
    await ch.default_exchange.publish(Message(b"rolled"), routing_key=q.name)
    await tx.rollback()
    await ch.default_exchange.publish(Message(b"committed"), routing_key=q.name)
    await asyncio.sleep(0.1)
    probe = await conn.channel()
    pq = await probe.declare_queue(q.name, passive=True)
    assert pq.declaration_result.message_count == 0
    await tx.commit()
    m = await pq.get()
    assert m.body == b"committed"
    await conn.close()


async def test_exclusive_queue_locked_for_other_connections(broker):
    c1 = await connect(broker)
    c2 = await connect(broker)
    ch1 = await c1.channel()
    q = await ch1.declare_queue("excl-q", exclusive=True)
    ch2 = await c2.channel()
    with pytest.raises(aiormq.exceptions.ChannelLockedResource):
        await ch2.declare_queue("excl-q", passive=True)
    await c1.close()
    await asyncio.sleep(0.2)
    ch3 = await c2.channel()
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        await ch3.declare_queue(q.name, passive=True)
    await c2.close()


async def test_queue_delete_cancels_consumer(broker):
    conn = await connect(broker)
    ch = await conn.channel()
    q = await ch.declare_queue("cancel-me", auto_delete=False)
    await q.consume(lambda m: None)
    other = await conn.channel()
    await other.queue_delete("cancel-me")
    await asyncio.sleep(0.2)
    # aiormq drops the consumer on basic.cancel from the server
    assert not ch.channel.consumers
    await conn.close()


async def test_topic_and_fanout_and_headers_routing(broker):
    conn = await connect(broker)
    ch = await conn.channel()
    topic = await ch.declare_exchange("rt-topic", ExchangeType.TOPIC, auto_delete=True)
    fan = await ch.declare_exchange("rt-fan", ExchangeType.FANOUT, auto_delete=True)
    hdr = await ch.declare_exchange("rt-hdr", ExchangeType.HEADERS, auto_delete=True)
    qa = await ch.declare_queue("", exclusive=True)
    qb = await ch.declare_queue("", exclusive=True)
    await qa.bind(topic, "a.*.c")
    await qb.bind(topic, "a.#")
    await qa.bind(fan)
    await qb.bind(hdr, arguments={"x-match": "any", "k": "v", "z": 1})
    await topic.publish(Message(b"t1"), routing_key="a.b.c")
    await topic.publish(Message(b"t2"), routing_key="a.b.c.d")
    await fan.publish(Message(b"f"), routing_key="ignored")
    await hdr.publish(Message(b"h", headers={"k": "v"}), routing_key="")
    await hdr.publish(Message(b"no", headers={"k": "w"}), routing_key="")
    a = [m.body for m in await drain(qa, 2)]
    b = [m.body for m in await drain(qb, 3)]
    assert a == [b"t1", b"f"]
    assert b == [b"t1", b"t2", b"h"]
    await conn.close()
