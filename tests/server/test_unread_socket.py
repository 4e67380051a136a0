"""A client that never reads its socket (issue 9 section 4): neither deliveries to an unlimited
prefetch consumer nor pipelined basic.get can pull a queue into the broker's write buffers. What
waits stays in the queue, and all of it arrives once the client reads."""

from __future__ import annotations

import time

from pamqp import commands

from broker.protocol import frames as wire
from tests.amqp_raw import RawClient, publish_numbered

COUNT = 500
BODY = 100 * 1024  # one body frame each; 50 MiB in all, which the broker would otherwise buffer


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096


def fill_queue(port: int, queue: str) -> None:
    c = RawClient(port, timeout=60)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue=queue))
    c.expect(commands.Queue.DeclareOk, 1)
    publish_numbered(c, queue, COUNT, BODY, batch=100)
    c.send_method(1, commands.Queue.Declare(queue=queue, passive=True))
    assert c.expect(commands.Queue.DeclareOk, 1, timeout=60).message_count == COUNT
    c.close()


def _ready(port: int, queue: str) -> int:
    c = RawClient(port)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue=queue, passive=True))
    n = c.expect(commands.Queue.DeclareOk, 1).message_count
    c.close()
    return n


def read_all(c: RawClient, want: int) -> list[int]:
    """Read deliveries / get-oks until `want` bodies came; their numbers, in order."""
    cutter = wire.FrameCutter(131072)
    got: list[int] = []
    current = b""
    data, c.buf = c.buf, b""
    c.sock.settimeout(30)
    while len(got) < want:
        data = data or c.sock.recv(1 << 20)
        assert data, "the broker closed the connection"
        for ftype, _ch, payload in cutter.feed(data):
            if ftype == 3:
                current += payload
                if len(current) == BODY:
                    got.append(int.from_bytes(current[:8], "big"))
                    current = b""
        data = b""
    return got


def test_consumer_that_never_reads_gets_no_more_than_its_socket_holds(broker_factory):
    b = broker_factory().start()
    fill_queue(b.port, "unread-consume")
    before = rss(b.pid)
    c = RawClient(b.port)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Basic.Consume(queue="unread-consume"))  # no prefetch limit
    time.sleep(1.0)  # the broker delivers what it can; the client reads nothing
    ready = _ready(b.port, "unread-consume")
    assert ready > COUNT // 2, ready  # most wait in the queue, not in buffers
    assert rss(b.pid) - before < 32 * 1024 * 1024
    assert read_all(c, COUNT) == list(range(COUNT))
    c.close()


def test_pipelined_basic_get_waits_for_the_client_to_read(broker_factory):
    b = broker_factory().start()
    fill_queue(b.port, "unread-get")
    before = rss(b.pid)
    c = RawClient(b.port)
    c.handshake()
    c.open_channel(1)
    c.send(b"".join(wire.encode_method(1, commands.Basic.Get(queue="unread-get", no_ack=True))
                    for _ in range(COUNT)))
    time.sleep(1.0)
    ready = _ready(b.port, "unread-get")
    assert ready > COUNT // 2, ready  # the gets wait for the client to read
    assert rss(b.pid) - before < 32 * 1024 * 1024
    assert read_all(c, COUNT) == list(range(COUNT))
    assert _ready(b.port, "unread-get") == 0
    c.close()
