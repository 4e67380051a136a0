"""Queue and consumer x-argument validation through pika, with RabbitMQ 3.10.8's reply codes and
texts, and x-queue-type: stream accepted as a classic queue, with a warning."""

from __future__ import annotations

import itertools

import pytest
from pika.exceptions import ChannelClosedByBroker

_n = itertools.count(1)


@pytest.fixture
def conn(pika_conns):
    return pika_conns()


def refused(conn, name: str, arguments: dict, **kw) -> tuple[int, str]:
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.queue_declare(name, arguments=arguments, **kw)
    return err.value.reply_code, err.value.reply_text


@pytest.mark.parametrize(("arguments", "detail"), [
    ({"x-max-priority": 256}, "{max_value_exceeded,256}"),
    ({"x-max-priority": -1}, "{value_negative,-1}"),
    ({"x-max-priority": "5"}, '"expected integer, got longstr"'),
    ({"x-max-priority": True}, '"expected integer, got bool"'),
    ({"x-single-active-consumer": "true"}, "{unacceptable_type,longstr}"),
    ({"x-single-active-consumer": 1}, "{unacceptable_type,signedint}"),
    ({"x-queue-type": "foo"}, "\"unsupported queue type 'foo'\""),
    ({"x-queue-type": 1}, "{unacceptable_type,signedint}"),
    ({"x-queue-mode": "foo"}, "\"unsupported queue mode 'foo'\""),
    ({"x-queue-mode": 5}, "{unacceptable_type,signedint}"),
    ({"x-message-ttl": "x"}, '"expected integer, got longstr"'),
    ({"x-expires": 0}, "{value_zero,0}"),
    ({"x-max-length": -1}, "{value_negative,-1}"),
    ({"x-overflow": "nope"}, "invalid_overflow"),
    ({"x-dead-letter-routing-key": "a"}, "routing_key_but_no_dlx_defined"),
    ({"x-message-ttl": 2**32}, "{value_too_large,4294967296}"),
    ({"x-expires": 2**32}, "{value_too_large,4294967296}"),
    ({"x-queue-mode": "bogus"}, "\"unsupported queue mode 'bogus'\""),
    ({"x-queue-version": 3}, "\"unsupported queue version '3'\""),
])
def test_invalid_queue_arguments_are_406(conn, arguments, detail):
    name = f"args-{next(_n)}"
    key = next(iter(arguments))
    assert refused(conn, name, arguments) == (
        406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/': {detail}"
    )


def test_redeclare_compares_only_the_arguments_rabbitmq_knows(conn):
    """An unknown argument is kept but not compared; a known one is (406)."""
    name = f"args-{next(_n)}"
    ch = conn.channel()
    ch.queue_declare(name, exclusive=True, arguments={"x-made-up": "a", "x-max-length": 5})
    ch.queue_declare(name, exclusive=True, arguments={"x-made-up": "b", "x-max-length": 5})
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.queue_declare(name, exclusive=True, arguments={"x-max-length": 6})
    assert err.value.reply_code == 406 and "x-max-length" in err.value.reply_text


@pytest.mark.parametrize("value", [0, 1, 10, 255])
def test_max_priority_range_accepted(conn, value):
    ch = conn.channel()
    ok = ch.queue_declare("", exclusive=True, arguments={"x-max-priority": value})
    assert ok.method.queue.startswith("amq.gen-")


@pytest.mark.parametrize(("kw", "prop"), [
    ({"durable": False}, "non-durable"),
    ({"durable": True, "exclusive": True}, "exclusive-owner"),
    ({"durable": True, "auto_delete": True}, "auto-delete"),
])
@pytest.mark.parametrize("qtype", ["quorum", "stream"])
def test_replicated_types_need_rabbitmq_properties(conn, qtype, kw, prop):
    name = f"typed-{next(_n)}"
    assert refused(conn, name, {"x-queue-type": qtype}, **kw) == (
        406, f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{name}' in vhost '/'"
    )


@pytest.mark.parametrize(("qtype", "key"), [
    ("quorum", "x-max-priority"), ("stream", "x-max-priority"),
    ("stream", "x-single-active-consumer"),
])
def test_replicated_types_refuse_what_rabbitmq_refuses(conn, qtype, key):
    name = f"typed-{next(_n)}"
    value = 5 if key == "x-max-priority" else True
    assert refused(conn, name, {"x-queue-type": qtype, key: value}, durable=True) == (
        406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/' of "
             f"queue type rabbit_{qtype}_queue"
    )


def test_a_stream_redeclared_with_another_type_is_inequivalent(broker, conn):
    """x-queue-type stream is a stream (tests/queue/test_stream_queue.py); a redeclare
    compares the type as any argument."""
    name = f"stream-{next(_n)}"
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    assert err.value.reply_code == 406
    assert "inequivalent arg 'x-queue-type'" in err.value.reply_text
    conn.channel().queue_delete(name)


def test_classic_type_is_the_same_as_none(conn):
    name = f"classic-{next(_n)}"
    ch = conn.channel()
    ch.queue_declare(name, auto_delete=True)
    ch.queue_declare(name, auto_delete=True, arguments={"x-queue-type": "classic"})
    ch.queue_delete(name)
    ch.queue_declare(name, auto_delete=True, arguments={"x-queue-type": "classic"})
    ch.queue_declare(name, auto_delete=True)
    ch.queue_delete(name)


@pytest.mark.parametrize(("value", "got"), [("5", "longstr"), (True, "bool")])
def test_consumer_priority_must_be_an_integer(conn, value, got):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.basic_consume(q, lambda *a: None, arguments={"x-priority": value})
    assert (err.value.reply_code, err.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{q}' in vhost '/': "
             f'"expected integer, got {got}"'
    )


@pytest.mark.parametrize(("qtype", "key", "value"), [
    ("classic", "x-delivery-limit", 3),
    ("classic", "x-quorum-initial-group-size", 3),
    ("classic", "x-dead-letter-strategy", "at-least-once"),
    ("classic", "x-queue-leader-locator", "balanced"),
    ("classic", "x-max-in-memory-length", 5),
    ("classic", "x-max-age", "1D"),
    ("quorum", "x-queue-mode", "lazy"),
    ("quorum", "x-queue-version", 2),
    ("quorum", "x-queue-master-locator", "min-masters"),
    ("quorum", "x-max-age", "1D"),
    ("stream", "x-message-ttl", 1000),
    ("stream", "x-dead-letter-exchange", "dlx"),
])
def test_arguments_of_another_queue_type_are_refused(conn, qtype, key, value):
    """RabbitMQ 3.10.8: an argument that some queue type takes but this one does not."""
    name = f"typed-{next(_n)}"
    arguments = {key: value} if qtype == "classic" else {"x-queue-type": qtype, key: value}
    assert refused(conn, name, arguments, durable=True) == (
        406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/' of "
             f"queue type rabbit_{qtype}_queue"
    )


@pytest.mark.parametrize(("arguments", "detail"), [
    ({"x-quorum-initial-group-size": 0}, "{value_zero,0}"),
    ({"x-quorum-initial-group-size": "x"}, '"expected integer, got longstr"'),
    ({"x-queue-leader-locator": "nope"}, "invalid_queue_locator_arg"),
    ({"x-queue-leader-locator": 5}, "{unacceptable_type,signedint}"),
    ({"x-dead-letter-strategy": "bad"}, "invalid_dlx_strategy"),
    ({"x-dead-letter-strategy": 3}, "{unacceptable_type,signedint}"),
    ({"x-max-in-memory-length": -1}, "{value_negative,-1}"),
])
def test_quorum_arguments_checked_as_rabbitmq(conn, arguments, detail):
    name = f"quorum-args-{next(_n)}"
    key = next(iter(arguments))
    assert refused(conn, name, {"x-queue-type": "quorum", **arguments}, durable=True) == (
        406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/': {detail}"
    )


def test_argument_values_are_checked_before_properties(conn):
    """RabbitMQ checks the arguments first, then auto-delete, exclusive, non-durable."""
    name = f"typed-{next(_n)}"
    assert refused(conn, name, {"x-queue-type": "quorum", "x-max-priority": 5}) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{name}' in vhost "
             "'/' of queue type rabbit_quorum_queue")
    assert refused(conn, name, {"x-queue-type": "quorum"}, auto_delete=True) == (
        406, f"PRECONDITION_FAILED - invalid property 'auto-delete' for queue '{name}' in vhost "
             "'/'")
