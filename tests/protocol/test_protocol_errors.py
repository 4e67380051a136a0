"""Protocol errors on the wire, with hand-built frames (RawClient): the reply code the broker
closes the connection with, as RabbitMQ, and that the broker keeps serving other clients."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands

from tests.amqp_raw import PROTOCOL_HEADER, RawClient, raw_frame, roundtrip_ok


def opened(broker, channel: int | None = 1, **kw) -> RawClient:
    c = RawClient(broker.port)
    c.handshake(**kw)
    if channel:
        c.open_channel(channel)
    return c


def expect_connection_close(
    c: RawClient, code: int, fragment: str = ""
) -> commands.Connection.Close:
    """The next (non-heartbeat) frame is connection.close `code`; answer close-ok, socket goes."""
    close = c.expect(commands.Connection.Close, 0)
    assert close.reply_code == code, close
    if fragment:
        assert fragment in close.reply_text, close.reply_text
    try:
        c.send_method(0, commands.Connection.CloseOk())
    except OSError:
        pass  # a fatal frame error: the broker closed the socket right after connection.close
    assert c.closed(3.0)
    c.close()
    return close


# -- protocol header ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x00\x00\x08\x00",  # 0-8
        b"AMQP\x01\x01\x00\x0a",  # 0-10
        b"AMQP\x00\x01\x00\x00",  # 1-0
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # garbage: someone's browser
        b"\x00\x01\x02\x03\x04\x05\x06\x07\xff\xfe",
    ],
)
def test_bad_protocol_header_gets_ours_back_and_close(broker, header):
    c = RawClient(broker.port)
    c.send(header)
    assert c.recv_raw(8) == PROTOCOL_HEADER
    assert c.closed(3.0)
    c.close()
    roundtrip_ok(broker.port)


def test_header_in_pieces_is_accepted(broker):
    c = RawClient(broker.port)
    for i in range(8):
        c.send(PROTOCOL_HEADER[i : i + 1])
    start = c.expect(commands.Connection.Start, 0)
    assert (start.version_major, start.version_minor) == (0, 9)
    c.close()


def test_truncated_header_then_close(broker):
    c = RawClient(broker.port)
    c.send(b"AMQP\x00")
    c.close()
    roundtrip_ok(broker.port)


def test_truncated_frame_then_close(broker):
    c = opened(broker)
    frame = raw_frame(1, 1, struct.pack(">HH", 60, 40) + b"\x00" * 40)
    c.send(frame[:11])
    c.close()
    roundtrip_ok(broker.port)


def test_truncated_content_then_close_publishes_nothing(broker):
    c = opened(broker)
    c.send_method(1, commands.Queue.Declare(queue="raw-trunc-content"))
    c.expect(commands.Queue.DeclareOk, 1)
    c.send_method(1, commands.Queue.Purge(queue="raw-trunc-content"))
    c.expect(commands.Queue.PurgeOk, 1)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="raw-trunc-content"))
    from pamqp import frame as pframe
    from pamqp import header as pheader

    c.send(pframe.marshal(pheader.ContentHeader(0, 100, commands.Basic.Properties()), 1))
    c.send(raw_frame(3, 1, b"x" * 50))  # half of the announced body
    c.close()
    d = opened(broker)
    d.send_method(1, commands.Queue.Delete(queue="raw-trunc-content"))
    ok = d.expect(commands.Queue.DeleteOk, 1)
    assert ok.message_count == 0
    d.close()


# -- frame level: 501 FRAME_ERROR ---------------------------------------------------------------
def test_garbage_after_open_is_frame_error(broker):
    c = opened(broker)
    c.send(b"\x01\x00\x01\x00\x00\x00\x04abcd\x00" + b"\x17" * 30)
    expect_connection_close(c, 501)
    roundtrip_ok(broker.port)


def test_oversized_frame_is_501(broker):
    c = opened(broker, frame_max=4096)
    # the header alone announces a frame larger than frame_max: refused before the payload
    # (a payload of frame_max itself is let through, as RabbitMQ does)
    c.send(struct.pack(">BHI", 3, 1, 4097))
    close = expect_connection_close(c, 501)
    assert "frame_max" in close.reply_text or "too large" in close.reply_text
    roundtrip_ok(broker.port)


def test_oversized_content_body_frame_is_501(broker):
    c = opened(broker, frame_max=4096)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
    from pamqp import frame as pframe
    from pamqp import header as pheader

    c.send(pframe.marshal(pheader.ContentHeader(0, 10000, commands.Basic.Properties()), 1))
    c.send(raw_frame(3, 1, b"y" * 10000))
    expect_connection_close(c, 501)
    roundtrip_ok(broker.port)


def test_wrong_frame_end_is_501(broker):
    c = opened(broker)
    c.send(raw_frame(1, 1, struct.pack(">HH", 20, 20) + b"\x01", end=b"\x00"))
    close = expect_connection_close(c, 501)
    assert "frame end" in close.reply_text
    roundtrip_ok(broker.port)


@pytest.mark.parametrize("ftype", [0, 4, 5, 9, 0xFF])
def test_unknown_frame_type_is_501(broker, ftype):
    c = opened(broker)
    c.send(raw_frame(ftype, 1, b"hello"))
    expect_connection_close(c, 501)
    roundtrip_ok(broker.port)


def test_heartbeat_on_nonzero_channel_is_505(broker):
    c = opened(broker)
    c.send(raw_frame(8, 1, b""))
    close = expect_connection_close(c, 505)
    assert "heartbeat" in close.reply_text
    roundtrip_ok(broker.port)


def test_heartbeat_on_unopened_nonzero_channel_is_505(broker):
    c = opened(broker, channel=None)
    c.send(raw_frame(8, 3, b""))
    expect_connection_close(c, 505)


def test_heartbeat_with_a_payload_is_501(broker):
    c = opened(broker)
    c.send(raw_frame(8, 0, b"xx"))
    expect_connection_close(c, 501)


def test_heartbeat_on_channel_zero_is_fine(broker):
    c = opened(broker)
    c.send(raw_frame(8, 0, b""))
    c.send_method(1, commands.Basic.Qos(prefetch_count=1))
    c.expect(commands.Basic.QosOk, 1)
    c.close()


# -- content assembly: 505 UNEXPECTED_FRAME -----------------------------------------------------
def test_content_header_without_publish_is_505(broker):
    c = opened(broker)
    from pamqp import frame as pframe
    from pamqp import header as pheader

    c.send(pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1))
    expect_connection_close(c, 505)
    roundtrip_ok(broker.port)


def test_body_without_header_is_505(broker):
    c = opened(broker)
    c.send(raw_frame(3, 1, b"abc"))
    expect_connection_close(c, 505)
    roundtrip_ok(broker.port)


def test_body_after_publish_without_header_is_505(broker):
    c = opened(broker)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="x"))
    c.send(raw_frame(3, 1, b"abc"))
    expect_connection_close(c, 505)
    roundtrip_ok(broker.port)


def test_method_while_expecting_header_is_505(broker):
    c = opened(broker)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="x"))
    c.send_method(1, commands.Basic.Qos(prefetch_count=1))
    expect_connection_close(c, 505)
    roundtrip_ok(broker.port)


def test_method_while_expecting_body_is_505(broker):
    c = opened(broker)
    from pamqp import frame as pframe
    from pamqp import header as pheader

    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="x"))
    c.send(pframe.marshal(pheader.ContentHeader(0, 10, commands.Basic.Properties()), 1))
    c.send(raw_frame(3, 1, b"12345"))
    c.send_method(1, commands.Basic.Qos(prefetch_count=1))
    expect_connection_close(c, 505)
    roundtrip_ok(broker.port)


def test_body_longer_than_announced_is_505(broker):
    c = opened(broker)
    from pamqp import frame as pframe
    from pamqp import header as pheader

    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="x"))
    c.send(pframe.marshal(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1))
    c.send(raw_frame(3, 1, b"12345"))
    expect_connection_close(c, 505)


# -- channels: 504 CHANNEL_ERROR ----------------------------------------------------------------
def test_method_on_unopened_channel_is_504(broker):
    c = opened(broker, channel=None)
    c.send_method(5, commands.Queue.Declare(queue="", exclusive=True))
    close = expect_connection_close(c, 504)
    assert "channel.open" in close.reply_text
    roundtrip_ok(broker.port)


def test_content_on_unopened_channel_is_505(broker):
    """What a new channel's assembler says to a frame that is not a method (RabbitMQ)."""
    c = opened(broker)
    c.send(raw_frame(3, 2, b"abc"))
    expect_connection_close(c, 505)


def test_channel_open_twice_is_504(broker):
    c = opened(broker)
    c.send_method(1, commands.Channel.Open())
    close = expect_connection_close(c, 504)
    assert "second 'channel.open'" in close.reply_text
    assert (close.class_id, close.method_id) == (20, 10)
    roundtrip_ok(broker.port)


def test_channel_max_counts_open_channels(broker):
    """channel_max limits how many channels are open, not their numbers (RabbitMQ)."""
    c = RawClient(broker.port)
    c.send(PROTOCOL_HEADER)
    c.expect(commands.Connection.Start, 0)
    c.send_method(0, commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
    c.expect(commands.Connection.Tune, 0)
    c.send_method(0, commands.Connection.TuneOk(channel_max=4, frame_max=131072, heartbeat=0))
    c.send_method(0, commands.Connection.Open(virtual_host="/"))
    c.expect(commands.Connection.OpenOk, 0)
    for n in (4, 5, 6, 65535):  # any numbers, as long as no more than 4 are open
        c.open_channel(n)
    c.send_method(7, commands.Channel.Open())
    close = expect_connection_close(c, 530)
    assert "channel_max" in close.reply_text
    roundtrip_ok(broker.port)


def test_channel_reopened_after_close(broker):
    c = opened(broker)
    c.send_method(
        1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
    )
    c.expect(commands.Channel.CloseOk, 1)
    c.open_channel(1)
    c.send_method(1, commands.Basic.Qos(prefetch_count=1))
    c.expect(commands.Basic.QosOk, 1)
    c.close()


# -- methods: 540 NOT_IMPLEMENTED, 501 FRAME_ERROR (cannot decode), 503 COMMAND_INVALID ---------
def test_unknown_method_on_channel_is_540(broker):
    c = opened(broker)
    c.send(raw_frame(1, 1, struct.pack(">HH", 60, 99)))
    close = expect_connection_close(c, 540)
    assert (close.class_id, close.method_id) == (60, 99)
    roundtrip_ok(broker.port)


def test_unknown_class_on_channel_zero_is_540(broker):
    c = opened(broker, channel=None)
    c.send(raw_frame(1, 0, struct.pack(">HH", 99, 1)))
    expect_connection_close(c, 540)
    roundtrip_ok(broker.port)


@pytest.mark.parametrize(
    "payload",
    [
        struct.pack(">HH", 50, 10) + b"\x00",  # queue.declare cut inside its arguments
        struct.pack(">HH", 50, 10) + b"\x00\x00\x05ab",  # shortstr longer than the frame
        struct.pack(">HH", 40, 10) + b"\x00\x00\x01x\x06direct\x00\x00\x00\x00\x40",  # table
        struct.pack(">HH", 60, 10) + b"\x00",  # basic.qos too short
        struct.pack(">HH", 60, 80) + b"\x00\x00",  # basic.ack too short (fast path)
        struct.pack(">H", 60),  # method id cut
    ],
)
def test_malformed_method_is_501(broker, payload):
    c = opened(broker)
    c.send(raw_frame(1, 1, payload))
    expect_connection_close(c, 501)
    roundtrip_ok(broker.port)


def test_malformed_publish_is_501(broker):
    c = opened(broker)
    c.send(raw_frame(1, 1, struct.pack(">HH", 60, 40) + b"\x00\x00\x09ab"))
    from pamqp import frame as pframe
    from pamqp import header as pheader

    c.send(pframe.marshal(pheader.ContentHeader(0, 0, commands.Basic.Properties()), 1))
    expect_connection_close(c, 501)
    roundtrip_ok(broker.port)


def test_malformed_connection_method_is_501(broker):
    c = opened(broker, channel=None)
    c.send(raw_frame(1, 0, struct.pack(">HH", 10, 50) + b"\x01"))  # connection.close cut
    expect_connection_close(c, 501)


def test_channel_method_before_open_is_refused(broker):
    """505 as RabbitMQ after tune-ok; before it RabbitMQ only drops the socket (a difference
    docs/CONFORMANCE.md lists)."""
    c = RawClient(broker.port)
    c.send(PROTOCOL_HEADER)
    c.expect(commands.Connection.Start, 0)
    c.send_method(1, commands.Channel.Open())
    expect_connection_close(c, 505)
    roundtrip_ok(broker.port)


def test_connection_method_out_of_order_is_504(broker):
    c = RawClient(broker.port)
    c.send(PROTOCOL_HEADER)
    c.expect(commands.Connection.Start, 0)
    c.send_method(0, commands.Connection.Open(virtual_host="/"))
    expect_connection_close(c, 504)
    roundtrip_ok(broker.port)


def test_connection_level_method_on_channel_is_503(broker):
    """connection.* on a non-zero channel: RabbitMQ treats it as command_invalid."""
    c = opened(broker)
    c.send_method(1, commands.Connection.Close(reply_code=200, reply_text="x", class_id=0,
                                                 method_id=0))
    close = expect_connection_close(c, 503)
    assert (close.class_id, close.method_id) == (10, 50)
    roundtrip_ok(broker.port)


def test_many_errors_leave_the_broker_serving(broker):
    for _ in range(20):
        c = opened(broker)
        c.send(raw_frame(7, 1, b"zz"))
        c.close()
    roundtrip_ok(broker.port)


# -- content framing that is legal --------------------------------------------------------------
def _header(channel: int, size: int) -> bytes:
    from pamqp import frame as pframe
    from pamqp import header as pheader

    return pframe.marshal(pheader.ContentHeader(0, size, commands.Basic.Properties()), channel)


def _get_body(c: RawClient, queue: str, ch: int = 1) -> bytes | None:
    from pamqp import header as pheader
    from pamqp.body import ContentBody

    c.send_method(ch, commands.Basic.Get(queue=queue, no_ack=True))
    m = c.recv_frame()[1]
    if isinstance(m, commands.Basic.GetEmpty):
        return None
    assert isinstance(m, commands.Basic.GetOk), m
    hdr = c.expect(pheader.ContentHeader, ch)
    body = b""
    while len(body) < hdr.body_size:
        body += c.expect(ContentBody, ch).value
    return body


def test_content_frames_of_two_channels_interleave(broker):
    c = opened(broker)
    c.open_channel(2)
    c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    q = c.expect(commands.Queue.DeclareOk, 1).queue
    publish = commands.Basic.Publish(exchange="", routing_key=q)
    from pamqp import frame as pframe

    c.send(pframe.marshal(publish, 1) + _header(1, 6) + raw_frame(3, 1, b"one-")
           + pframe.marshal(publish, 2) + _header(2, 3) + raw_frame(3, 2, b"two")
           + raw_frame(3, 1, b"ch"))
    bodies = {_get_body(c, q), _get_body(c, q)}
    assert bodies == {b"one-ch", b"two"}
    c.close()


def test_empty_body_and_many_small_body_frames(broker):
    c = opened(broker)
    c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    q = c.expect(commands.Queue.DeclareOk, 1).queue
    from pamqp import frame as pframe

    publish = pframe.marshal(commands.Basic.Publish(exchange="", routing_key=q), 1)
    c.send(publish + _header(1, 0))  # no body frame at all
    c.send(publish + _header(1, 100) + b"".join(raw_frame(3, 1, b"%02d" % i) for i in range(50)))
    assert _get_body(c, q) == b""
    assert _get_body(c, q) == b"".join(b"%02d" % i for i in range(50))
    c.close()


def test_frames_after_channel_error_are_dropped_until_close_ok(broker):
    c = opened(broker)
    c.send_method(1, commands.Queue.Declare(queue="no-such-q-raw", passive=True))
    close = c.expect(commands.Channel.Close, 1)
    assert close.reply_code == 404
    # before close-ok: a publish and a method on that channel are ignored, not answered
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="x"))
    c.send_content(1, b"ignored")
    c.send_method(1, commands.Basic.Qos(prefetch_count=1))
    c.send_method(1, commands.Channel.CloseOk())
    c.open_channel(1)
    c.send_method(1, commands.Basic.Qos(prefetch_count=2))
    c.expect(commands.Basic.QosOk, 1)
    c.close()


def test_crossing_channel_close(broker):
    """Server and client close the same channel at once: the client's close gets close-ok,
    and the channel waits for the client's close-ok to its own close (as RabbitMQ)."""
    c = opened(broker)
    c.send_method(1, commands.Queue.Declare(queue="no-such-q-raw", passive=True))
    c.send_method(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0,
                                            method_id=0))
    c.expect(commands.Channel.Close, 1)
    c.expect(commands.Channel.CloseOk, 1)
    c.send_method(1, commands.Channel.CloseOk())
    c.open_channel(1)
    c.close()


def test_frames_after_connection_close_are_ignored(broker):
    c = opened(broker)
    c.send(raw_frame(1, 1, struct.pack(">HH", 60, 99)))  # 540: the connection is closing
    close = c.expect(commands.Connection.Close, 0)
    assert close.reply_code == 540
    c.send_method(1, commands.Basic.Qos(prefetch_count=1))
    c.send_method(1, commands.Channel.Open())
    c.send_method(0, commands.Connection.CloseOk())
    while True:  # nothing else comes (no qos-ok, no open-ok) before the socket closes
        got = c.recv_frame(3.0)
        if got is None:
            break
        assert got[1].__class__.__name__ == "Heartbeat", got
    c.close()
