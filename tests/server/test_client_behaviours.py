"""Behaviours other people's client test suites depend on (issue 9 section 1), each checked
against RabbitMQ 3.10.8 first and tested here through a real client: aio-pika, pika, py-amqp
(kombu's client, reached through kombu) and raw frames where the order of frames is the
point."""

from __future__ import annotations

import aio_pika
import kombu
import pika
import pytest
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker

from tests.amqp_raw import PROTOCOL_HEADER, RawClient, roundtrip_ok
from tests.server.test_channel_rules import call, client, declare_queue, uniq


# -- queue.unbind / exchange.unbind of what no longer exists -------------------------------------
async def test_aiopika_unbind_after_delete_is_ok(broker):
    """aio-pika's clean-up deletes the queue and exchange, then unbinds: unbind-ok, as RabbitMQ."""
    conn = await aio_pika.connect(broker.url)
    ch = await conn.channel()
    x = await ch.declare_exchange(uniq("unbind-x"), aio_pika.ExchangeType.DIRECT)
    q = await ch.declare_queue(uniq("unbind-q"))
    await q.bind(x, "k")
    await q.delete()
    await q.unbind(x, "k")  # the queue is gone
    await x.delete()
    q2 = await ch.declare_queue(uniq("unbind-q2"))
    await q2.unbind(x, "k")  # the exchange is gone
    assert not ch.is_closed
    await conn.close()


def test_raw_unbind_of_missing_queue_or_exchange_is_ok(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Queue.Unbind(queue=uniq("gone-q"), exchange="amq.direct", routing_key="k"),
         commands.Queue.UnbindOk)
    call(c, commands.Queue.Unbind(queue=q, exchange=uniq("gone-x"), routing_key="k"),
         commands.Queue.UnbindOk)
    call(c, commands.Exchange.Unbind(destination=uniq("gone-d"), source="amq.direct"),
         commands.Exchange.UnbindOk)
    call(c, commands.Exchange.Unbind(destination="amq.fanout", source=uniq("gone-s")),
         commands.Exchange.UnbindOk)
    # the default exchange stays off limits, whether or not the queue exists (RabbitMQ: 403)
    c.send_method(1, commands.Queue.Unbind(queue=uniq("gone-q"), exchange="", routing_key="k"))
    close = c.expect(commands.Channel.Close, 1)
    assert (close.reply_code, close.reply_text) == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    c.close()


# -- channel_max counts open channels -----------------------------------------------------------
def _py_amqp(broker) -> kombu.Connection:
    return kombu.Connection(f"amqp://guest:guest@127.0.0.1:{broker.port}//")


def test_py_amqp_opens_channel_65535(broker):
    """The negotiated channel_max (2047) limits how many, not which numbers."""
    with _py_amqp(broker) as kc:
        conn = kc.connection  # py-amqp's Connection
        assert conn.channel_max == 2047
        ch = conn.channel(65535)
        q, _, _ = ch.queue_declare("", exclusive=True)
        ch.basic_publish(ch.prepare_message(b"high"), routing_key=q)
        msg = ch.basic_get(q, no_ack=True)
        assert msg is not None and msg.body == b"high"


def _tuned(port: int, channel_max: int) -> RawClient:
    c = RawClient(port)
    c.send(PROTOCOL_HEADER)
    c.expect(commands.Connection.Start, 0)
    c.send_method(0, commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
    c.expect(commands.Connection.Tune, 0)
    c.send_method(0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=131072,
                                                heartbeat=0))
    c.send_method(0, commands.Connection.Open(virtual_host="/"))
    c.expect(commands.Connection.OpenOk, 0)
    return c


def test_one_channel_more_than_channel_max_is_530(broker):
    c = _tuned(broker.port, 3)
    for n in (65535, 7, 9):
        c.open_channel(n)
    c.send_method(9, commands.Channel.Close(reply_code=200, reply_text="", class_id=0,
                                            method_id=0))
    c.expect(commands.Channel.CloseOk, 9)
    c.open_channel(5)  # a closed channel no longer counts
    c.send_method(6, commands.Channel.Open())
    close = c.expect(commands.Connection.Close, 0)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530, "NOT_ALLOWED - number of channels opened (3) has reached the negotiated "
        "channel_max (3)", 0, 0)
    c.close()
    roundtrip_ok(broker.port)


# -- exchange.declare of the default exchange ---------------------------------------------------
@pytest.mark.parametrize("passive", [True, False])
def test_pika_declare_default_exchange_is_403(broker, passive):
    conn = pika.BlockingConnection(pika.URLParameters(broker.url + "%2F?heartbeat=0"))
    try:
        ch = conn.channel()
        with pytest.raises(ChannelClosedByBroker) as err:
            ch.exchange_declare("", "direct", passive=passive)
        assert err.value.reply_code == 403
        assert err.value.reply_text == (
            "ACCESS_REFUSED - operation not permitted on the default exchange")
        assert conn.is_open
    finally:
        conn.close()


# -- basic.cancel when a queue is deleted -------------------------------------------------------
def test_raw_delete_ok_before_cancel_on_the_same_channel(broker):
    """RabbitMQ's order on the channel that deletes the queue: delete-ok, then basic.cancel."""
    c = client(broker.port)
    q = declare_queue(c, uniq("cancel-order"))
    call(c, commands.Basic.Consume(queue=q, consumer_tag="ct"), commands.Basic.ConsumeOk)
    c.send_method(1, commands.Queue.Delete(queue=q))
    c.expect(commands.Queue.DeleteOk, 1)
    assert c.expect(commands.Basic.Cancel, 1).consumer_tag == "ct"
    # the consumer is gone from the channel: cancelling it now is still cancel-ok, and the tag
    # can be used again
    call(c, commands.Basic.Cancel(consumer_tag="ct"), commands.Basic.CancelOk)
    q2 = declare_queue(c, exclusive=True)
    call(c, commands.Basic.Consume(queue=q2, consumer_tag="ct"), commands.Basic.ConsumeOk)
    c.close()


def test_py_amqp_consumer_cancelled_by_queue_delete(broker):
    """kombu's client: queue_delete on the consuming channel returns its count, then the
    server's basic.cancel reaches the consumer's on_cancel; acking the earlier delivery after
    that is harmless."""
    cancelled: list[str] = []
    got: list = []
    with _py_amqp(broker) as kc:
        conn = kc.connection
        ch = conn.channel()
        q = uniq("py-amqp-cancel")
        ch.queue_declare(q, auto_delete=False)
        for i in range(3):
            ch.basic_publish(ch.prepare_message(b"m%d" % i), routing_key=q)
        ch.basic_qos(0, 1, False)
        ch.basic_consume(q, consumer_tag="pc", callback=got.append, on_cancel=cancelled.append)
        while not got:
            conn.drain_events(timeout=5)
        assert ch.queue_delete(q) == 2  # ready messages; the unacked one is not counted
        while not cancelled:
            conn.drain_events(timeout=5)
        assert cancelled == ["pc"]
        ch.basic_ack(got[0].delivery_tag)
        ch.basic_qos(0, 1, False)  # the channel is still open and answering
