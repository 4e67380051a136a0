"""A connection's other channel closing, by the client or by the server with an error (a
passive declare's 404, as a probe does), leaves the consuming channel receiving everything
while publishers keep going: nothing the closed channel held (writer, credit, reader
back-pressure) is left stuck for the connection's live channels."""

from __future__ import annotations

import asyncio
import threading

import aio_pika
import aiormq
import pika
import pytest
from aio_pika import Message

N = 3000
BODY = b"x" * 512


async def _probe(conn: aio_pika.abc.AbstractConnection, how: str, queue: str,
                 body: bytes = BODY) -> None:
    """Open a second channel on the consumer's connection, use it, and have it closed."""
    ch = await conn.channel(publisher_confirms=False)
    if how == "publish-then-404":  # the closed channel's publishes spent the reader's credit
        for _ in range(300):
            await ch.default_exchange.publish(Message(body), routing_key=queue)
    if how in ("server-404", "publish-then-404"):
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await ch.declare_queue("no-such-queue-probe", passive=True)
        assert ch.is_closed
        return
    q = await ch.declare_queue(queue, passive=True)
    tmp = await ch.declare_queue("", exclusive=True)
    await ch.default_exchange.publish(Message(b"t"), routing_key=tmp.name)
    assert (await tmp.get(timeout=5)).body == b"t"
    assert q.name == queue
    await ch.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("no_ack", [False, True], ids=["manual-ack", "no-ack"])
@pytest.mark.parametrize("how", ["client-close", "server-404", "publish-then-404"])
@pytest.mark.parametrize("publisher", ["same-connection", "other-connection"])
async def test_consumer_keeps_receiving_after_sibling_channel_closes(broker, how, no_ack,
                                                                      publisher):
    await _consume_through_probes(broker, how, no_ack, publisher, BODY, N)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["client-close", "server-404"])
async def test_big_bodies_fill_the_writer_while_sibling_channel_closes(broker, how):
    """Bodies big enough that the consumer's writer goes full and the socket paused while the
    sibling closes: the wake-up on drain must still reach the consuming channel."""
    await _consume_through_probes(broker, how, False, "same-connection", b"y" * 200_000, 200)


async def _consume_through_probes(broker, how: str, no_ack: bool, publisher: str, body: bytes,
                                  n: int) -> None:
    conn = await aio_pika.connect(broker.url)
    pub_conn = conn if publisher == "same-connection" else await aio_pika.connect(broker.url)
    try:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=100)
        q = await ch.declare_queue("", exclusive=True)
        got = 0
        done = asyncio.Event()

        async def on_message(m: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal got
            got += 1
            if not no_ack:
                await m.ack()
            if got >= n:
                done.set()

        await q.consume(on_message, no_ack=no_ack)
        pub_ch = await pub_conn.channel()

        async def publish() -> None:
            for i in range(n):
                await pub_ch.default_exchange.publish(Message(body), routing_key=q.name)
                if i % 200 == 0:
                    await asyncio.sleep(0)

        pub = asyncio.create_task(publish())
        while got < 100:  # the consumer is under way before the probes
            await asyncio.sleep(0.01)
        for _ in range(5):
            await _probe(conn, how, q.name, body)
        await asyncio.wait_for(pub, 30)
        deadline = asyncio.get_running_loop().time() + 30
        await asyncio.wait_for(done.wait(), 30)
        extra = 5 * 300 if how == "publish-then-404" else 0
        while got < n + extra:
            await asyncio.sleep(0.01)
            if asyncio.get_running_loop().time() > deadline:
                break
        assert got == n + extra
        # the consuming channel still answers, and a fresh sibling works too
        await ch.declare_queue(q.name, passive=True)
        await _probe(conn, "client-close", q.name)
    finally:
        if pub_conn is not conn:
            await pub_conn.close()
        await conn.close()


@pytest.mark.parametrize("how", ["client-close", "server-404"])
@pytest.mark.parametrize("auto_ack", [False, True], ids=["manual-ack", "no-ack"])
def test_pika_consumer_keeps_receiving_after_sibling_channel_closes(broker, pika_conns, how,
                                                                    auto_ack):
    conn = pika_conns()
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    q = ch.queue_declare("", exclusive=True).method.queue
    stop = threading.Event()

    def publish() -> None:  # pika's BlockingConnection is one thread's: its own connection
        p = pika.BlockingConnection(pika.URLParameters(broker.url + "%2F?heartbeat=0"))
        pc = p.channel()
        for _ in range(N):
            pc.basic_publish("", q, BODY)
        p.close()
        stop.set()

    t = threading.Thread(target=publish)
    t.start()
    got = 0
    probes = 0
    for method, _props, _body in ch.consume(q, auto_ack=auto_ack, inactivity_timeout=10):
        assert method is not None, f"consumer stalled after {got} of {N}"
        got += 1
        if not auto_ack:
            ch.basic_ack(method.delivery_tag)
        if got % 300 == 0 and probes < 5:
            probes += 1
            other = conn.channel()
            if how == "server-404":
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                    other.queue_declare("no-such-queue-probe", passive=True)
                assert err.value.reply_code == 404
            else:
                other.queue_declare(q, passive=True)
                other.basic_get(q, auto_ack=False)  # held by the channel, requeued at close
                other.close()
        if got == N:
            break
    ch.cancel()
    t.join(30)
    assert stop.is_set() and got == N and probes == 5


def test_raw_consumer_keeps_receiving_while_probe_channel_awaits_close_ok(broker):
    """Raw frames: the probe's channel is closed by the server (404) and the client never
    answers close-ok; the consuming channel 1 and publishing channel 3 carry on regardless."""
    from pamqp import commands

    from tests.amqp_raw import RawClient

    c = RawClient(broker.port)
    c.handshake()
    for n in (1, 2, 3):
        c.open_channel(n)
    c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    q = c.expect(commands.Queue.DeclareOk, 1).queue
    c.send_method(1, commands.Basic.Qos(prefetch_count=100))
    c.expect(commands.Basic.QosOk, 1)
    c.send_method(1, commands.Basic.Consume(queue=q))
    c.expect(commands.Basic.ConsumeOk, 1)
    got = 0
    total = 2000
    probe_closed = False
    for batch in range(total // 100):
        if batch == 2:
            c.send_method(2, commands.Queue.Declare(queue="no-such-queue-probe", passive=True))
        for _ in range(100):
            c.send_method(3, commands.Basic.Publish(exchange="", routing_key=q))
            c.send_content(3, BODY)
        want = (batch + 1) * 100
        while got < want:
            ch, value = c.recv_frame(10)
            if isinstance(value, commands.Channel.Close):
                assert (ch, value.reply_code) == (2, 404)  # left unanswered on purpose
                probe_closed = True
            elif isinstance(value, commands.Basic.Deliver):
                assert ch == 1
                got += 1
                c.send_method(1, commands.Basic.Ack(delivery_tag=value.delivery_tag))
    assert got == total and probe_closed
    c.close()
