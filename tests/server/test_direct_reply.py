"""Direct reply-to (amq.rabbitmq.reply-to) through pika: the reply_to rewrite, replies that
reach the consumer without a queue, and RabbitMQ 3.10.8's answers when it is used wrongly."""

from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, UnroutableError

RT = "amq.rabbitmq.reply-to"


def wait_for(conn: pika.BlockingConnection, cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        conn.process_data_events(time_limit=0.02)


def get_one(ch, queue: str, conn):
    got: list = []
    wait_for(conn, lambda: got.append(ch.basic_get(queue, auto_ack=True)) or got[-1][0])
    return got[-1]


def test_rpc_round_trip(pika_conns):
    client, server = pika_conns(), pika_conns()
    cch, sch = client.channel(), server.channel()
    requests = sch.queue_declare("", exclusive=True).method.queue
    replies: list = []
    tag = cch.basic_consume(
        RT, lambda ch, m, p, b: replies.append((m, p, b)), auto_ack=True)
    assert cch.queue_declare(RT).method.consumer_count == 1  # the pseudo-queue "exists"
    cch.basic_publish("", requests, b"ping", pika.BasicProperties(reply_to=RT,
                                                                   correlation_id="c1"))
    _, props, body = get_one(sch, requests, server)
    assert body == b"ping" and props.correlation_id == "c1"
    assert props.reply_to.startswith(RT + ".") and len(props.reply_to) > len(RT) + 16
    # the reply name "exists" for a passive declare from anywhere while its consumer does
    declared = sch.queue_declare(props.reply_to, passive=True).method
    assert (declared.queue, declared.consumer_count) == (props.reply_to, 1)
    sch.basic_publish("", props.reply_to, b"pong", pika.BasicProperties(correlation_id="c1"))
    wait_for(client, lambda: replies)
    method, rprops, rbody = replies[0]
    assert (rbody, rprops.correlation_id) == (b"pong", "c1")
    assert (method.consumer_tag, method.exchange, method.routing_key) == (
        tag, "", props.reply_to)
    assert not method.redelivered
    # after cancel the name is gone: a reply is dropped, a passive declare is 404
    cch.basic_cancel(tag)
    sch.basic_publish("", props.reply_to, b"late")
    with pytest.raises(ChannelClosedByBroker) as err:
        sch.queue_declare(props.reply_to, passive=True)
    assert err.value.reply_code == 404
    client.process_data_events(time_limit=0.1)
    assert len(replies) == 1


def test_reply_is_unroutable_for_a_mandatory_publisher(pika_conns):
    """As RabbitMQ documents: the reply name is not a queue, so a mandatory reply is also
    returned, and a confirm-mode reply is acked."""
    client, server = pika_conns(), pika_conns()
    cch = client.channel()
    replies: list[bytes] = []
    cch.basic_consume(RT, lambda ch, m, p, b: replies.append(b), auto_ack=True)
    q = cch.queue_declare("", exclusive=True).method.queue
    cch.basic_publish("", q, b"req", pika.BasicProperties(reply_to=RT))
    _, props, _ = get_one(cch, q, client)
    sch = server.channel()
    sch.confirm_delivery()
    sch.basic_publish("", props.reply_to, b"confirmed")
    with pytest.raises(UnroutableError):
        sch.basic_publish("", props.reply_to, b"mandatory", mandatory=True)
    with pytest.raises(UnroutableError):
        sch.basic_publish("", RT + ".no-such-name", b"nobody", mandatory=True)
    wait_for(client, lambda: len(replies) == 2)
    assert replies == [b"confirmed", b"mandatory"]


@pytest.mark.parametrize(("action", "code", "text"), [
    (lambda ch: ch.basic_consume(RT, lambda *a: None, auto_ack=False),
     406, "PRECONDITION_FAILED - reply consumer cannot acknowledge"),
    (lambda ch: [ch.basic_consume(RT, lambda *a: None, auto_ack=True) for _ in range(2)],
     406, "PRECONDITION_FAILED - reply consumer already set"),
    (lambda ch: (ch.basic_publish("", "nowhere", b"x", pika.BasicProperties(reply_to=RT)),
                 ch.queue_declare(RT)),
     406, "PRECONDITION_FAILED - fast reply consumer does not exist"),
    (lambda ch: (ch.basic_cancel(ch.basic_consume(RT, lambda *a: None, auto_ack=True)),
                 ch.basic_publish("", "nowhere", b"x", pika.BasicProperties(reply_to=RT)),
                 ch.queue_declare(RT)),
     406, "PRECONDITION_FAILED - fast reply consumer does not exist"),
    (lambda ch: ch.basic_get(RT), 404, f"NOT_FOUND - no queue '{RT}' in vhost '/'"),
    (lambda ch: ch.queue_bind(RT, "amq.direct", "k"), 404,
     f"NOT_FOUND - no queue '{RT}' in vhost '/'"),
    (lambda ch: ch.queue_declare(RT + ".garbage", passive=True), 404,
     f"NOT_FOUND - no queue '{RT}.garbage' in vhost '/'"),
    (lambda ch: ch.queue_declare(RT + ".garbage"), 404,
     f"NOT_FOUND - no queue '{RT}.garbage' in vhost '/'"),
])
def test_misuse_gets_rabbitmq_errors(pika_conns, action, code, text):
    ch = pika_conns().channel()
    with pytest.raises(ChannelClosedByBroker) as err:
        action(ch)
    assert (err.value.reply_code, err.value.reply_text) == (code, text)


def test_closing_the_channel_frees_the_name(pika_conns):
    client, other = pika_conns(), pika_conns()
    cch = client.channel()
    cch.basic_consume(RT, lambda *a: None, auto_ack=True)
    q = cch.queue_declare("", exclusive=True).method.queue
    cch.basic_publish("", q, b"req", pika.BasicProperties(reply_to=RT))
    name = get_one(cch, q, client)[1].reply_to
    och = other.channel()
    assert och.queue_declare(name, passive=True).method.queue == name
    cch.close()
    with pytest.raises(ChannelClosedByBroker) as err:
        och.queue_declare(name, passive=True)
    assert err.value.reply_code == 404


def test_ordinary_reply_to_is_left_alone(pika_conns):
    c = pika_conns()
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for reply_to in ("my.replies", RT + ".x", "x." + RT):
        ch.basic_publish("", q, b"r", pika.BasicProperties(reply_to=reply_to))
        assert get_one(ch, q, c)[1].reply_to == reply_to
