"""Close handshakes on the wire (raw frames): crossing channel.close and connection.close, and
what the broker does with bytes that arrive after connection.close-ok. RabbitMQ 3.10.8 answers
every sequence here the same way (see tests/conformance for the recorded table)."""

from __future__ import annotations

import socket

from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody

from tests.amqp_raw import RawClient, raw_frame, roundtrip_ok

CH_CLOSE = commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
CONN_CLOSE = commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)


def opened(broker, *channels: int) -> RawClient:
    c = RawClient(broker.port)
    c.handshake()
    for n in channels:
        c.open_channel(n)
    return c


def publish_frames(channel: int, exchange: str, body: bytes = b"hi") -> bytes:
    return (
        pframe.marshal(commands.Basic.Publish(exchange=exchange, routing_key="k"), channel)
        + pframe.marshal(pheader.ContentHeader(0, len(body), commands.Basic.Properties()), channel)
        + pframe.marshal(ContentBody(body), channel)
    )


def assert_channel_works(c: RawClient, n: int) -> None:
    c.send_method(n, commands.Exchange.Declare(exchange="amq.direct", passive=True))
    c.expect(commands.Exchange.DeclareOk, n)


def test_publish_error_crossing_client_close_in_one_write(broker):
    """The issue's case: publish to a missing exchange and channel.close in one write. The
    404 close comes first, then close-ok for the client's close; the channel waits for the
    client's close-ok, then the number is free and the connection's other channels live."""
    c = opened(broker, 1, 2)
    c.send(publish_frames(1, "no-such-exchange") + pframe.marshal(CH_CLOSE, 1))
    assert c.expect(commands.Channel.Close, 1).reply_code == 404
    c.expect(commands.Channel.CloseOk, 1)
    c.send_method(1, commands.Channel.CloseOk())
    c.open_channel(1)
    assert_channel_works(c, 1)
    assert_channel_works(c, 2)
    c.close()


def test_crossing_close_with_frames_between(broker):
    """Frames after the failing one and before the client's close are dropped, not answered;
    so are frames after the client's close and before its close-ok."""
    c = opened(broker, 1)
    qos = pframe.marshal(commands.Basic.Qos(prefetch_count=5), 1)
    c.send(publish_frames(1, "no-such-exchange") + qos + publish_frames(1, "") + qos
           + pframe.marshal(CH_CLOSE, 1) + qos)
    assert c.expect(commands.Channel.Close, 1).reply_code == 404
    c.expect(commands.Channel.CloseOk, 1)  # no qos-ok before or after it
    c.send(qos + pframe.marshal(commands.Channel.CloseOk(), 1)
           + pframe.marshal(commands.Channel.Open(), 1))
    c.expect(commands.Channel.OpenOk, 1)
    assert_channel_works(c, 1)
    c.close()


def test_client_close_crossing_a_server_close_sent_later(broker):
    """Client-first order: the client's close is on its way when the server's close for an
    earlier error goes out; the client then answers the server's close with close-ok."""
    c = opened(broker, 1)
    c.send_method(1, commands.Queue.Declare(queue="no-such-queue-x", passive=True))
    c.send_method(1, CH_CLOSE)
    c.send_method(1, commands.Channel.CloseOk())
    assert c.expect(commands.Channel.Close, 1).reply_code == 404
    c.expect(commands.Channel.CloseOk, 1)
    c.open_channel(1)
    assert_channel_works(c, 1)
    c.close()


def test_channel_open_while_waiting_for_close_ok_is_504(broker):
    """The number is not free until the client's close-ok: RabbitMQ answers a channel.open
    there with 504 "second 'channel.open' seen"."""
    c = opened(broker, 1)
    c.send_method(1, commands.Queue.Declare(queue="no-such-queue-y", passive=True))
    assert c.expect(commands.Channel.Close, 1).reply_code == 404
    c.send_method(1, commands.Channel.Open())
    close = c.expect(commands.Connection.Close, 0)
    assert close.reply_code == 504 and "second 'channel.open'" in close.reply_text


def test_close_ok_on_an_open_channel_is_503(broker):
    c = opened(broker, 1)
    c.send_method(1, commands.Channel.CloseOk())
    close = c.expect(commands.Connection.Close, 0)
    assert close.reply_code == 503 and (close.class_id, close.method_id) == (20, 41)


def test_connection_close_crossing_a_server_connection_close(broker):
    """The server closes the connection (505, a body frame on an unopened channel) while the
    client's connection.close is on its way: the client's close gets close-ok, and the
    socket closes on the client's close-ok."""
    c = opened(broker, 1)
    c.send(raw_frame(3, 7, b"x"))
    assert c.expect(commands.Connection.Close, 0).reply_code == 505
    c.send_method(0, CONN_CLOSE)
    c.expect(commands.Connection.CloseOk, 0)
    c.send_method(0, commands.Connection.CloseOk())
    assert c.recv_frame(5.0) is None
    c.close()
    roundtrip_ok(broker.port)


def test_connection_close_crossing_in_the_same_read(broker):
    """The same, with the client's close in the same read as the frame that failed."""
    c = opened(broker, 1)
    c.send(raw_frame(3, 7, b"x") + pframe.marshal(CONN_CLOSE, 0))
    assert c.expect(commands.Connection.Close, 0).reply_code == 505
    c.expect(commands.Connection.CloseOk, 0)
    c.send_method(0, commands.Connection.CloseOk())
    assert c.recv_frame(5.0) is None
    c.close()


def test_after_close_ok_the_broker_keeps_reading(broker):
    """Two threads closing one connection: each close gets close-ok, what else the client
    writes is read and dropped, and the socket ends with the client's, never with a reset."""
    c = opened(broker, 1)
    c.send(pframe.marshal(CONN_CLOSE, 0) * 2)
    c.expect(commands.Connection.CloseOk, 0)
    c.expect(commands.Connection.CloseOk, 0)
    c.send(publish_frames(1, "", b"z" * 1000) * 50)  # a thread still publishing
    c.send_method(0, CONN_CLOSE)  # still read: a third close still gets close-ok
    c.expect(commands.Connection.CloseOk, 0)
    c.sock.shutdown(socket.SHUT_WR)
    assert c.recv_frame(5.0) is None  # ConnectionResetError would propagate from recv
    c.close()
    roundtrip_ok(broker.port)


def test_close_ok_after_the_close_handshake_ends_the_connection(broker):
    c = opened(broker, 1)
    c.send_method(0, CONN_CLOSE)
    c.expect(commands.Connection.CloseOk, 0)
    c.send_method(1, commands.Basic.Qos(prefetch_count=1))  # dropped, not answered
    c.send_method(0, commands.Connection.CloseOk())
    assert c.recv_frame(5.0) is None
    c.close()


def test_fatal_frame_error_half_closes_at_once(broker):
    """A frame the broker cannot cut (bad end octet): connection.close, then the end of the
    stream right away, while what the client still sends is read and dropped."""
    c = opened(broker, 1)
    c.send(raw_frame(1, 1, b"\x00\x3c\x00\x0a", end=b"\x00"))
    assert c.expect(commands.Connection.Close, 0).reply_code == 501
    assert c.recv_frame(5.0) is None  # EOF, before the client closed anything
    c.send(b"\x00" * 100_000)  # still read (and dropped): a closed socket would reset
    c.sock.shutdown(socket.SHUT_WR)
    assert c.sock.recv(10) == b""
    c.close()
    roundtrip_ok(broker.port)


def test_what_a_channel_owes_goes_out_before_connection_close(broker):
    """The reader fails the connection at once (a body frame on an unopened channel), while
    channel 1 still has a queue.declare to answer: declare-ok first, then connection.close,
    never a channel's frame after it (RabbitMQ's terminate_channels)."""
    c = opened(broker, 1)
    c.send(pframe.marshal(commands.Queue.Declare(queue="", exclusive=True), 1)
           + raw_frame(3, 7, b"x"))
    c.expect(commands.Queue.DeclareOk, 1)
    assert c.expect(commands.Connection.Close, 0).reply_code == 505
    c.send_method(0, commands.Connection.CloseOk())
    assert c.recv_frame(5.0) is None
    c.close()


def test_close_ok_waits_for_a_channel_error_in_flight(broker):
    """A client's connection.close right behind a frame that fails its channel: the
    channel.close 404 goes out before connection.close-ok, not after it."""
    c = opened(broker, 1)
    c.send(pframe.marshal(commands.Queue.Declare(queue="no-such-queue-z", passive=True), 1)
           + pframe.marshal(CONN_CLOSE, 0))
    assert c.expect(commands.Channel.Close, 1).reply_code == 404
    c.expect(commands.Connection.CloseOk, 0)
    c.close()
