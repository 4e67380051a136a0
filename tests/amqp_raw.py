"""A raw AMQP client for protocol-error tests: hand-built frames over a plain socket."""

from __future__ import annotations

import socket
import struct
import time

from pamqp import commands, frame
from pamqp import header as pheader

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


class RawClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method: object) -> None:
        self.send(frame.marshal(method, channel))  # type: ignore[arg-type]

    def send_content(self, channel: int, body: bytes, props: commands.Basic.Properties | None
                     = None, frame_max: int = 131072) -> None:
        hdr = pheader.ContentHeader(0, len(body), props or commands.Basic.Properties())
        self.send(frame.marshal(hdr, channel))
        step = frame_max - 8
        for i in range(0, len(body), step):
            from pamqp.body import ContentBody
            self.send(frame.marshal(ContentBody(body[i:i + step]), channel))

    def recv_frame(self, timeout: float = 5.0) -> tuple[int, object] | None:
        """Next frame as (channel, pamqp object); None when the peer closed the socket."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 7:
                size = struct.unpack(">I", self.buf[3:7])[0]
                if len(self.buf) >= size + 8:
                    _, channel, value = frame.unmarshal(self.buf[: size + 8])
                    self.buf = self.buf[size + 8:]
                    return channel, value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.buf += data

    def recv_raw(self, n: int, timeout: float = 5.0) -> bytes:
        self.sock.settimeout(timeout)
        out = self.buf
        while len(out) < n:
            data = self.sock.recv(n - len(out))
            if not data:
                break
            out += data
        self.buf = b""
        return out

    def expect(self, cls: type, channel: int | None = None, timeout: float = 5.0) -> object:
        """Skip heartbeats; the next frame must be `cls`."""
        while True:
            got = self.recv_frame(timeout)
            assert got is not None, f"socket closed while waiting for {cls.__name__}"
            ch, value = got
            if value.__class__.__name__ == "Heartbeat":
                continue
            assert isinstance(value, cls), f"expected {cls.__name__}, got {value!r}"
            if channel is not None:
                assert ch == channel
            return value

    def closed(self, timeout: float = 5.0) -> bool:
        """True once the server closed the socket (frames before that are skipped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.recv_frame(deadline - time.monotonic()) is None:
                    return True
            except TimeoutError:
                return False
            except OSError:
                return True
        return False

    def handshake(self, user: str = "guest", password: str = "guest", vhost: str = "/",
                  frame_max: int = 131072, heartbeat: int = 0) -> commands.Connection.Tune:
        self.send(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start, 0)
        self.send_method(0, commands.Connection.StartOk(
            client_properties={"product": "raw", "capabilities": {
                "consumer_cancel_notify": True, "connection.blocked": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"))
        tune = self.expect(commands.Connection.Tune, 0)
        self.send_method(0, commands.Connection.TuneOk(
            channel_max=tune.channel_max, frame_max=frame_max, heartbeat=heartbeat))
        self.send_method(0, commands.Connection.Open(virtual_host=vhost))
        self.expect(commands.Connection.OpenOk, 0)
        return tune

    def open_channel(self, n: int = 1) -> None:
        self.send_method(n, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk, n)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def raw_frame(ftype: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    """One frame built by hand: type, channel, size, payload and the given end octet."""
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + end


def roundtrip_ok(port: int, host: str = "127.0.0.1") -> None:
    """A new connection still works: declare a queue, publish to it, basic.get it back."""
    c = RawClient(port, host)
    try:
        c.handshake()
        c.open_channel(1)
        c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
        name = c.expect(commands.Queue.DeclareOk, 1).queue
        c.send_method(1, commands.Basic.Publish(exchange="", routing_key=name))
        c.send_content(1, b"still alive")
        c.send_method(1, commands.Basic.Get(queue=name, no_ack=True))
        c.expect(commands.Basic.GetOk, 1)
        c.expect(pheader.ContentHeader, 1)
        from pamqp.body import ContentBody
        body = c.expect(ContentBody, 1)
        assert body.value == b"still alive"
    finally:
        c.close()


def publish_numbered(c: RawClient, queue: str, count: int, body_size: int,
                     batch: int = 500) -> None:
    """`count` publishes to `queue` on channel 1, pre-encoded in batches; each body starts with
    its number (8 bytes, big-endian). `batch` must divide `count`. A broker that pauses
    reading makes `sendall` wait: that is the back-pressure under test."""
    from broker.protocol import frames as wire

    assert count % batch == 0
    one = b"".join([
        wire.encode_method(1, commands.Basic.Publish(exchange="", routing_key=queue)),
        *wire.encode_content(1, b"\x00\x00", bytes(body_size), 131072),
    ])
    offset = len(one) - 1 - body_size  # the body's first byte (before the frame-end octet)
    template = bytearray(one * batch)
    for start in range(0, count, batch):
        for i in range(batch):
            struct.pack_into(">Q", template, i * len(one) + offset, start + i)
        c.sock.sendall(template)
