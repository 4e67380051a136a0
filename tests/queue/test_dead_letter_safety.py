"""Headers tables and dead-lettering (issue 9 section 4): a table nested deeper than the limit
is refused at publish (measured before: 14,000 levels were stored, then dead-lettering raised
RecursionError in the TTL timer and the message was gone from both queues); one at the limit
goes through TTL, dead-lettering, a headers exchange and the management API byte for byte; a
property block that does not decode is refused; and a message whose properties cannot be
rewritten (stored before the publish check existed) stays in its queue instead of vanishing."""

from __future__ import annotations

import os
import struct
import time

import pika
import pytest
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker

from broker.message import Message
from broker.protocol.frames import FrameCutter, decode_method
from broker.protocol.properties import MAX_TABLE_DEPTH
from broker.store.queue_index import QueueIndex
from tests.amqp_raw import RawClient, raw_frame
from tests.conftest import BrokerProc
from tests.mgmt.helpers import MgmtBroker


def nested_value(levels: int) -> dict:
    """A table `levels` deep (a dict holding a dict ...)."""
    value: dict = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def raw_nested_headers(depth: int) -> bytes:
    """A property block whose headers table nests `depth` tables in all, built by hand (pamqp's
    encoder recurses and cannot make 14,000 levels)."""
    inner = b""
    for _ in range(depth - 1):
        field = b"\x01a" + b"F" + struct.pack(">I", len(inner)) + inner
        inner = field
    return b"\x20\x00" + struct.pack(">I", len(inner)) + inner


def declare(c: RawClient, queue: str, **arguments) -> None:
    c.send_method(1, commands.Queue.Declare(queue=queue, durable=True, arguments=arguments))
    c.expect(commands.Queue.DeclareOk, 1)


def count(c: RawClient, queue: str) -> int:
    c.send_method(1, commands.Queue.Declare(queue=queue, passive=True))
    return c.expect(commands.Queue.DeclareOk, 1).message_count


def publish_raw(c: RawClient, queue: str, props: bytes, body: bytes) -> None:
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key=queue))
    c.send(raw_frame(2, 1, struct.pack(">HHQ", 60, 0, len(body)) + props))
    c.send(raw_frame(3, 1, body))


def get_raw(c: RawClient, queue: str, no_ack: bool = False) -> tuple[object, bytes, bytes]:
    """(get-ok, raw property block, body) of a basic.get, or (get-empty, b"", b""): frames cut
    here so that the property block stays as the broker sent it."""
    c.send_method(1, commands.Basic.Get(queue=queue, no_ack=no_ack))
    cutter = FrameCutter(131072)
    got: list[tuple[int, int, bytes]] = cutter.feed(c.buf) if c.buf else []
    c.buf = b""
    while not got or (got[0][2][:4] == b"\x00\x3c\x00\x47" and len(got) < 3):
        got += cutter.feed(c.sock.recv(65536))
    method = decode_method(got[0][2])
    if isinstance(method, commands.Basic.GetEmpty):
        return method, b"", b""
    return method, got[1][2][12:], got[2][2]


# -- refused at publish --------------------------------------------------------------------------
def test_pika_headers_nested_past_the_limit_are_406(broker):
    conn = pika.BlockingConnection(pika.URLParameters(broker.url + "%2F?heartbeat=0"))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        with pytest.raises(ChannelClosedByBroker) as err:
            ch.basic_publish("", q, b"x", pika.BasicProperties(
                headers={"n": nested_value(MAX_TABLE_DEPTH)}))  # + the headers table itself
        assert err.value.reply_code == 406
        assert err.value.reply_text == (
            "PRECONDITION_FAILED - headers table refused: field tables nested deeper than "
            f"{MAX_TABLE_DEPTH} levels")
        ch = conn.channel()
        ch.basic_publish("", q, b"y", pika.BasicProperties(
            headers={"n": nested_value(MAX_TABLE_DEPTH - 1)}))
        assert ch.queue_declare(q, passive=True).method.message_count == 1
    finally:
        conn.close()


def test_the_14000_deep_table_of_the_report_is_refused_and_nothing_is_lost(broker):
    c = RawClient(broker.port)
    c.handshake()
    c.open_channel(1)
    src, dlq = f"deep-src-{os.getpid()}", f"deep-dlq-{os.getpid()}"
    declare(c, dlq)
    declare(c, src, **{"x-message-ttl": 50, "x-dead-letter-exchange": "",
                       "x-dead-letter-routing-key": dlq})
    publish_raw(c, src, raw_nested_headers(14000), b"deep")
    close = c.expect(commands.Channel.Close, 1)
    assert close.reply_code == 406 and "nested deeper" in close.reply_text
    c.send_method(1, commands.Channel.CloseOk())
    c.open_channel(1)
    publish_raw(c, src, raw_nested_headers(MAX_TABLE_DEPTH), b"at the limit")
    deadline = time.monotonic() + 10
    while count(c, dlq) < 1:
        assert time.monotonic() < deadline, "the message at the limit was not dead-lettered"
        time.sleep(0.05)
    assert count(c, src) == 0
    _, props, body = get_raw(c, dlq, no_ack=True)
    assert body == b"at the limit"
    # what the publisher sent is copied, not re-encoded: its table is there byte for byte
    assert raw_nested_headers(MAX_TABLE_DEPTH)[6:] in props
    c.close()


def test_method_arguments_nested_too_deep_are_a_frame_error(broker):
    """queue.declare arguments 3,000 tables deep: 501 'cannot decode', not a 541 with a
    RecursionError traceback in the log."""
    c = RawClient(broker.port)
    c.handshake()
    c.open_channel(1)
    table = raw_nested_headers(3000)[2:]
    c.send(raw_frame(1, 1, struct.pack(">HHH", 50, 10, 0) + b"\x05deepq\x00" + table))
    close = c.expect(commands.Connection.Close, 0)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        501, "FRAME_ERROR - cannot decode Queue.Declare: field tables nested too deep", 50, 10)
    c.close()


def test_malformed_property_block_is_502(broker):
    c = RawClient(broker.port)
    c.handshake()
    c.open_channel(1)
    publish_raw(c, "nowhere", b"\x20\x00\x00\x00\x00\x03\x01aZ", b"x")  # unknown type 'Z'
    close = c.expect(commands.Connection.Close, 0)
    assert (close.reply_code, close.class_id, close.method_id) == (502, 60, 40)
    assert close.reply_text == (
        "SYNTAX_ERROR - malformed content header properties: unknown field type b'Z'")
    c.close()


# -- at the limit, through everything ------------------------------------------------------------
def test_table_at_the_limit_through_ttl_headers_exchange_and_management(tmp_path):
    b = MgmtBroker(tmp_path / "data").start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(b.url + "%2F?heartbeat=0"))
        ch = conn.channel()
        ch.exchange_declare("deep-dlx", "headers")
        ch.queue_declare("deep-dst")
        ch.queue_bind("deep-dst", "deep-dlx", arguments={"x-match": "all", "tag": "deep"})
        ch.queue_declare("deep-src", arguments={"x-message-ttl": 50,
                                               "x-dead-letter-exchange": "deep-dlx"})
        nest = nested_value(MAX_TABLE_DEPTH - 1)
        ch.basic_publish("", "deep-src", b"payload", pika.BasicProperties(
            headers={"tag": "deep", "nest": nest}, expiration="60000"))
        deadline = time.monotonic() + 10
        while ch.queue_declare("deep-dst", passive=True).method.message_count < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        got = b.api("POST", "/api/queues/%2F/deep-dst/get",
                    {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
        assert got[0] == 200, got
        headers = got[1][0]["properties"]["headers"]
        assert headers["nest"] == nest
        death = headers["x-death"][0]
        assert (death["reason"], death["queue"], death["original-expiration"]) == (
            "expired", "deep-src", "60000")
        _, props, body = ch.basic_get("deep-dst", auto_ack=True)
        assert body == b"payload" and props.headers["nest"] == nest
        assert props.expiration is None  # an expired message must not expire again
        # CC routes a copy, BCC routes one and is rewritten out of the block
        for q in ("deep-cc", "deep-bcc"):
            ch.queue_declare(q)
        ch.basic_publish("", "deep-nowhere", b"cc", pika.BasicProperties(
            headers={"nest": nest, "CC": ["deep-cc"], "BCC": ["deep-bcc"]}))
        deadline = time.monotonic() + 10
        for q in ("deep-cc", "deep-bcc"):
            while ch.queue_declare(q, passive=True).method.message_count < 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            _, props, body = ch.basic_get(q, auto_ack=True)
            assert body == b"cc" and props.headers["nest"] == nest
            assert props.headers["CC"] == ["deep-cc"] and "BCC" not in props.headers
        conn.close()
    finally:
        b.stop()


# -- a message that cannot be dead-lettered stays ------------------------------------------------
def plant(b: BrokerProc, queue: str, props: bytes, body: bytes) -> None:
    """Append one message to a stopped broker's durable queue the way an older broker that did
    not check property blocks would have stored it."""
    index = QueueIndex(b.queue_dir(queue))
    index.recover()
    seq = index.bounds()[1]
    msg = Message("", queue, props, body)
    index.publish(seq, msg.msg_id, msg.encode())
    index.flush()
    index.sync()
    index.close()


def test_message_that_cannot_be_dead_lettered_stays_where_it_was(tmp_path):
    b = MgmtBroker(tmp_path / "data").start()
    c = RawClient(b.port)
    c.handshake()
    c.open_channel(1)
    declare(c, "legacy-dlq")
    declare(c, "legacy-src", **{"x-dead-letter-exchange": "",
                                "x-dead-letter-routing-key": "legacy-dlq"})
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="legacy-src"))
    c.send_content(1, b"good", commands.Basic.Properties(delivery_mode=2))
    assert count(c, "legacy-src") == 1
    c.close()
    b.stop()
    plant(b, "legacy-src", b"\x20\x00\x00\x00\x00\x03\x01aZ", b"legacy")
    b.start()
    c = RawClient(b.port)
    c.handshake()
    c.open_channel(1)
    assert count(c, "legacy-src") == 2
    ok, _, body = get_raw(c, "legacy-src", no_ack=True)
    assert body == b"good"
    ok, props, body = get_raw(c, "legacy-src")
    assert body == b"legacy" and props == b"\x20\x00\x00\x00\x00\x03\x01aZ"
    c.send_method(1, commands.Basic.Reject(delivery_tag=ok.delivery_tag, requeue=False))
    # not dead-lettered (its properties cannot be rewritten), not lost: back in its queue
    ok, _, body = get_raw(c, "legacy-src")
    assert body == b"legacy" and ok.redelivered
    c.send_method(1, commands.Basic.Nack(delivery_tag=ok.delivery_tag, requeue=True))
    assert count(c, "legacy-dlq") == 0
    # the management API shows it without taking it away
    status, got = b.api("POST", "/api/queues/%2F/legacy-src/get",
                        {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert status == 200 and got[0]["payload"] == "legacy"
    assert "do not decode" in got[0]["properties"]["error"]
    assert count(c, "legacy-src") == 1
    c.close()
    b.stop()
    assert b.log().count("dead-lettering failed, message kept") == 1
