"""Resource alarms end to end: connection.blocked with its reason, publishers stop being read,
consumers keep being served, blocked_timeout closes with 320."""

from __future__ import annotations

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.amqp_raw import RawClient


def test_memory_alarm_blocks_publisher_and_keeps_consumers(broker_factory):
    # 1 MiB is far below any Python process: the alarm is up from the first sample
    b = broker_factory(args=["--vm-memory-high-watermark", "1MiB",
                             "--memory-monitor-interval-s", "0.05"]).start()
    c = RawClient(b.port)
    c.handshake()
    c.open_channel(1)
    # not a publisher yet: no connection.blocked (RabbitMQ tells publishing connections only)
    c.send_method(1, commands.Queue.Declare(queue="alarm-q"))
    c.expect(commands.Queue.DeclareOk, 1)
    c.send_method(1, commands.Basic.Consume(queue="alarm-q", no_ack=True))
    c.expect(commands.Basic.ConsumeOk, 1)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="alarm-q"))
    c.send_content(1, b"first")
    # the first publish is read (RabbitMQ blocks after it), and still delivered to the consumer
    got = [c.recv_frame()[1] for _ in range(2)]
    blocked = next(f for f in got if isinstance(f, commands.Connection.Blocked))
    assert blocked.reason == "low on memory"
    deliver = next(f for f in got if isinstance(f, commands.Basic.Deliver))
    assert deliver.routing_key == "alarm-q"
    # later publishes are not read while the alarm lasts: no delivery comes back
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="alarm-q"))
    c.send_content(1, b"second")
    try:
        got = c.recv_frame(timeout=1.0)
    except TimeoutError:
        got = None
    assert got is None or not isinstance(got[1], commands.Basic.Deliver)
    c.close()


def test_blocked_timeout_closes_with_320(broker_factory):
    b = broker_factory(args=["--vm-memory-high-watermark", "1MiB",
                             "--memory-monitor-interval-s", "0.05",
                             "--blocked-timeout-s", "0.5"]).start()
    c = RawClient(b.port)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
    c.send_content(1, b"x")
    c.expect(commands.Connection.Blocked, 0)
    close = c.expect(commands.Connection.Close, 0, timeout=5)
    assert close.reply_code == 320
    assert "blocked" in close.reply_text and "low on memory" in close.reply_text
    c.close()


def test_no_alarm_no_blocked_frame(broker):
    c = RawClient(broker.port)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
    c.send_content(1, b"x")
    c.send_method(
        1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    )
    # the next frame is close-ok: no connection.blocked came first
    c.expect(commands.Channel.CloseOk, 1)
    c.close()


def test_a_connection_that_never_publishes_is_not_told_blocked(broker_factory):
    """RabbitMQ's reader blocks (and sends connection.blocked to) a connection only when it
    publishes under an alarm: a consumer's connection goes on untouched (pika closes a
    connection blocked longer than its blocked_connection_timeout)."""
    b = broker_factory(args=["--vm-memory-high-watermark", "1MiB",
                             "--memory-monitor-interval-s", "0.05"]).start()
    consumer, publisher = RawClient(b.port), RawClient(b.port)
    for c in (consumer, publisher):
        c.handshake()
        c.open_channel(1)
    consumer.send_method(1, commands.Queue.Declare(queue="alarm-c"))
    consumer.expect(commands.Queue.DeclareOk, 1)
    consumer.send_method(1, commands.Basic.Consume(queue="alarm-c", no_ack=True))
    consumer.expect(commands.Basic.ConsumeOk, 1)
    publisher.send_method(1, commands.Basic.Publish(exchange="", routing_key="alarm-c"))
    publisher.send_content(1, b"m")
    publisher.expect(commands.Connection.Blocked, 0)
    # the consumer's next frame is its delivery, not connection.blocked
    assert consumer.expect(commands.Basic.Deliver, 1).routing_key == "alarm-c"
    consumer.expect(ContentHeader, 1)
    consumer.expect(ContentBody, 1)
    consumer.send_method(1, commands.Queue.Declare(queue="alarm-c", passive=True))
    consumer.expect(commands.Queue.DeclareOk, 1)
    consumer.close()
    publisher.close()
