"""A slow consumer behind a fast publisher: credit flow pauses the publisher's socket (seen as
the connection's flow state in the management API), memory stays bounded, and once the
consumer speeds up every message arrives, in order."""

from __future__ import annotations

import struct
import threading
import time

from pamqp import commands

from broker.protocol import frames as wire
from tests.amqp_raw import RawClient, publish_numbered
from tests.flow.test_paging_e2e import RssSampler
from tests.mgmt.helpers import MgmtBroker

COUNT = 300_000
BODY = 1024
BATCH = 500


def _blast(port: int, done: threading.Event) -> None:
    c = RawClient(port, timeout=60)
    c.handshake()
    c.open_channel(1)
    publish_numbered(c, "slow-q", COUNT, BODY, BATCH)
    c.send_method(1, commands.Queue.Declare(queue="slow-q", passive=True))
    c.expect(commands.Queue.DeclareOk, 1, timeout=120)
    done.set()
    c.close()


def test_slow_consumer_fast_publisher(tmp_path):
    b = MgmtBroker(tmp_path / "data", ["--vm-memory-high-watermark", "256MiB"]).start()
    try:
        sampler = RssSampler(b.proc.pid)  # type: ignore[union-attr]
        sampler.start()
        con = RawClient(b.port, timeout=30)
        con.handshake()
        con.open_channel(1)
        con.send_method(1, commands.Queue.Declare(queue="slow-q"))
        con.expect(commands.Queue.DeclareOk, 1)
        con.send_method(1, commands.Basic.Qos(prefetch_count=1))
        con.expect(commands.Basic.QosOk, 1)
        con.send_method(1, commands.Basic.Consume(queue="slow-q"))
        con.expect(commands.Basic.ConsumeOk, 1)

        done = threading.Event()
        threading.Thread(target=_blast, args=(b.port, done), daemon=True).start()
        cutter = wire.FrameCutter(131072)
        expected = 0
        pauses = 0
        data, con.buf = con.buf, b""
        slow_until = time.monotonic() + 3.0  # the slow phase: one message at a time
        deadline = time.monotonic() + 180
        while expected < COUNT and time.monotonic() < deadline:
            data = data or con.sock.recv(1 << 20)
            assert data, "the broker closed the consumer"
            chunk, data = data, b""
            last_tag = 0
            for ftype, _ch, payload in cutter.feed(chunk):
                if ftype == 1 and payload[:4] == b"\x00\x3c\x00\x3c":  # basic.deliver
                    last_tag = wire.decode_method(payload).delivery_tag
                elif ftype == 3:
                    assert struct.unpack_from(">Q", payload)[0] == expected
                    expected += 1
            if last_tag:
                if time.monotonic() < slow_until:
                    time.sleep(0.005)
                elif slow_until:
                    slow_until = 0.0  # speed up: a big prefetch from now on
                    con.send_method(1, commands.Basic.Qos(prefetch_count=2000))
                con.send(wire.encode_basic_ack(1, last_tag, True))
            if not pauses:
                conns = b.get("/api/connections")
                pauses = max((c.get("flow_pauses", 0) for c in conns), default=0)
        sampler.stop.set()
        assert expected == COUNT
        assert done.wait(30), "the publisher did not finish"
        if not pauses:
            conns = b.get("/api/connections")
            pauses = max((c.get("flow_pauses", 0) for c in conns), default=0)
        assert pauses > 0, "credit flow never paused the publisher's socket"
        assert sampler.peak < 256 + 64, f"RSS peaked at {sampler.peak:.0f} MB"
        con.close()
    finally:
        b.stop()
