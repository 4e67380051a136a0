"""pika's BlockingConnection against Hare: the basics a pika application relies on."""

from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError, UnroutableError


@pytest.fixture
def conn(broker):
    c = pika.BlockingConnection(pika.URLParameters(broker.url + "%2F?heartbeat=0"))
    yield c
    if c.is_open:
        c.close()


def test_connect_declare_publish_get(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-")
    props = pika.BasicProperties(content_type="text/plain", headers={"n": 7},
                                 correlation_id="c-1", delivery_mode=2)
    ch.basic_publish("", q, b"hello pika", props)
    method, got_props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"hello pika"
    assert method.routing_key == q and method.exchange == "" and method.message_count == 0
    assert got_props.content_type == "text/plain"
    assert got_props.headers == {"n": 7}
    assert got_props.correlation_id == "c-1" and got_props.delivery_mode == 2
    assert ch.basic_get(q) == (None, None, None)
    declared = ch.queue_declare(q, passive=True)
    assert declared.method.message_count == 0


def test_consume_with_ack(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_qos(prefetch_count=2)
    for i in range(5):
        ch.basic_publish("", q, b"job-%d" % i)
    got: list[bytes] = []

    def on_message(chan, method, properties, body):
        got.append(body)
        chan.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(q, on_message)
    deadline = time.monotonic() + 5
    while len(got) < 5 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert got == [b"job-%d" % i for i in range(5)]
    ch.basic_cancel(tag)
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_consume_generator_and_nack_requeue(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"again")
    seen = []
    for method, _props, body in ch.consume(q, inactivity_timeout=2):
        assert method is not None, "no delivery"
        seen.append((body, method.redelivered))
        if len(seen) == 1:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)
            break
    ch.cancel()
    assert seen == [(b"again", False), (b"again", True)]


def test_confirm_delivery_mandatory_unroutable_raises(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"routed", mandatory=True)  # no exception: acked
    with pytest.raises(UnroutableError) as info:
        ch.basic_publish("", "no-such-queue-pika", b"lost", mandatory=True)
    (returned,) = info.value.messages
    assert returned.body == b"lost"
    assert returned.method.reply_code == 312
    # without mandatory an unroutable message is simply confirmed
    ch.basic_publish("", "no-such-queue-pika", b"dropped")
    assert ch.basic_get(q, auto_ack=True)[2] == b"routed"


def test_confirm_delivery_nack_raises(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True,
                         arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    name = q.method.queue
    ch.basic_publish("", name, b"fits")
    with pytest.raises(NackError):
        ch.basic_publish("", name, b"refused")
    assert ch.basic_get(name, auto_ack=True)[2] == b"fits"


def test_channel_error_closes_channel_not_connection(conn):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare("no-such-queue-pika", passive=True)
    assert info.value.reply_code == 404
    assert "no queue 'no-such-queue-pika'" in info.value.reply_text
    assert ch.is_closed and conn.is_open
    ch2 = conn.channel()
    q = ch2.queue_declare("", exclusive=True).method.queue
    ch2.basic_publish("", q, b"fine")
    assert ch2.basic_get(q, auto_ack=True)[2] == b"fine"


def test_close_right_after_a_failing_publish_leaves_the_connection_alive(conn):
    """Issue 16: pika tidies up with channel.close while the broker's channel.close 404 for
    the publish is on its way. The closes cross; the connection and its other channels live
    (it used to die with 504 "expected 'channel.open'")."""
    keep = conn.channel()
    for _ in range(5):
        ch = conn.channel()
        ch.basic_publish("no-such-exchange-pika", "k", b"x")
        with pytest.raises(ChannelClosedByBroker) as err:
            ch.close()
        assert err.value.reply_code == 404
        assert conn.is_open
        keep.queue_declare("", exclusive=True)
        conn.channel().queue_declare("", exclusive=True)


def test_exchange_types_with_pika(conn):
    ch = conn.channel()
    ch.exchange_declare("pika-topic", "topic", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "pika-topic", "logs.*.error")
    for key in ("logs.web.error", "logs.web.info", "logs.db.error"):
        ch.basic_publish("pika-topic", key, key.encode())
    bodies = []
    while True:
        method, _, body = ch.basic_get(q, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    assert bodies == [b"logs.web.error", b"logs.db.error"]
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.exchange_declare("pika-topic", "direct", auto_delete=True)
    assert info.value.reply_code == 406
