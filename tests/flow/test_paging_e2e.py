"""Issue: a fast publisher must never make the broker exhaust memory. 2,000,000 transient
1 KiB messages into a queue with no consumer under a 256 MiB watermark: RSS stays bounded,
the publisher is never disconnected, then a consumer gets every message once, in order."""

from __future__ import annotations

import struct
import threading
import time

import pytest
from pamqp import commands

from broker.protocol import frames as wire
from tests.amqp_raw import RawClient, publish_numbered

pytestmark = pytest.mark.slow

COUNT = 2_000_000
BODY = 1024
WATERMARK_MB = 256
MARGIN_MB = 64  # interpreter, buffers and allocator slack above the watermark
BATCH = 500  # divides COUNT


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, _rss_mb(self.pid))
            except OSError:
                return
            time.sleep(0.2)


# about 60 s on a quiet 2-core machine, several times that when other work shares the cores
# (the parallel suite drained 1.7M of the 2M in 240 s once): the suite's 120 s default, or a
# tight drain deadline, would fail it for the machine's load, not for what it checks
@pytest.mark.timeout(900)
def test_two_million_messages_stay_under_the_watermark_and_come_back_in_order(broker_factory):
    b = broker_factory(args=["--vm-memory-high-watermark", f"{WATERMARK_MB}MiB"]).start()
    sampler = RssSampler(b.pid)
    sampler.start()
    pub = RawClient(b.port, timeout=30)
    pub.handshake()
    pub.open_channel(1)
    pub.send_method(1, commands.Queue.Declare(queue="paging-q"))
    pub.expect(commands.Queue.DeclareOk, 1)
    pub.sock.settimeout(120)  # a paused reader makes sendall wait: that is the back-pressure
    publish_numbered(pub, "paging-q", COUNT, BODY, BATCH)
    # a synchronous round trip after the last publish: everything before it is enqueued
    pub.send_method(1, commands.Queue.Declare(queue="paging-q", passive=True))
    ok = pub.expect(commands.Queue.DeclareOk, 1, timeout=120)
    assert ok.message_count == COUNT
    publish_peak = sampler.peak

    con = RawClient(b.port, timeout=30)
    con.handshake()
    con.open_channel(1)
    con.send_method(1, commands.Basic.Consume(queue="paging-q", no_ack=True))
    con.expect(commands.Basic.ConsumeOk, 1)
    cutter = wire.FrameCutter(131072)
    expected = 0
    deadline = time.monotonic() + 480
    con.sock.settimeout(30)
    data, con.buf = con.buf, b""  # what the client read past consume-ok
    while expected < COUNT and time.monotonic() < deadline:
        data = data or con.sock.recv(1 << 20)
        assert data, "broker closed the consumer's connection"
        chunk, data = data, b""
        for ftype, _ch, payload in cutter.feed(chunk):
            if ftype == 3:  # body frame: the sequence number leads the body
                seq = struct.unpack_from(">Q", payload)[0]
                assert seq == expected, f"got message {seq}, expected {expected}"
                expected += 1
    sampler.stop.set()
    assert expected == COUNT
    # the publisher was slowed down, never dropped
    pub.send_method(1, commands.Queue.Declare(queue="paging-q", passive=True))
    assert pub.expect(commands.Queue.DeclareOk, 1).message_count == 0
    assert publish_peak < WATERMARK_MB + MARGIN_MB, f"RSS peaked at {publish_peak:.0f} MB"
    assert sampler.peak < WATERMARK_MB + MARGIN_MB, f"RSS peaked at {sampler.peak:.0f} MB"
    pub.close()
    con.close()

