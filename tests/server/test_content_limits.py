"""Memory a client's incomplete messages can hold (issue 9 section 4): max_message_size refused at
the content header, an alarm stops the reading in the middle of a message, and the content
budget keeps the "announce a huge body, never finish it" attack on many connections and channels
below the memory watermark while another client goes on publishing and consuming."""

from __future__ import annotations

import asyncio
import struct
import threading
import time

import aio_pika
import pika
import pytest
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker

from tests.amqp_raw import RawClient, raw_frame, roundtrip_ok
from tests.conftest import BrokerProc, rss

BODY_FRAME = 131072 - 8  # the largest body frame payload under the default frame_max


def _header(channel: int, size: int) -> bytes:
    return raw_frame(2, channel, struct.pack(">HHQ", 60, 0, size) + b"\x00\x00")


def _rss(b: BrokerProc) -> int:
    """The RSS of the processes that serve (every worker holds every binding)."""
    return sum(rss(pid) for pid in b.serving_pids())


# -- max_message_size ---------------------------------------------------------------------------
def test_header_announcing_2_to_62_bytes_is_406_before_any_body(broker):
    c = RawClient(broker.port)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
    c.send(_header(1, 1 << 62))
    close = c.expect(commands.Channel.Close, 1)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        406, "PRECONDITION_FAILED - message size 4611686018427387904 is larger than "
        "configured max size 134217728", 60, 40)
    # body frames already on their way are dropped with the channel
    c.send(raw_frame(3, 1, bytes(BODY_FRAME)) * 8)
    c.send_method(1, commands.Channel.CloseOk())
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    c.expect(commands.Queue.DeclareOk, 1)
    c.close()
    roundtrip_ok(broker.port)


def test_max_message_size_setting_with_pika(broker_factory):
    b = broker_factory(args=["--max-message-size", "64KiB"]).start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url + "%2F?heartbeat=0"))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, bytes(64 * 1024))  # exactly the limit is fine
        method, _, body = ch.basic_get(q, auto_ack=True)
        assert method is not None and len(body) == 64 * 1024
        ch.basic_publish("", q, bytes(64 * 1024 + 1))
        with pytest.raises(ChannelClosedByBroker) as err:
            ch.basic_get(q, auto_ack=True)
        assert err.value.reply_code == 406
        assert "message size 65537 is larger than configured max size 65536" in (
            err.value.reply_text)
        assert conn.is_open
    finally:
        conn.close()


# -- an alarm stops the reading in the middle of a message ---------------------------------------
def test_disk_alarm_stops_reading_in_the_middle_of_a_message(broker_factory):
    """RabbitMQ's reader blocks on a content frame under an alarm, not only once a message is
    complete: a client streaming one huge body cannot fill the broker's memory meanwhile."""
    b = broker_factory(args=["--disk-free-limit", "1000TB"]).start()
    c = RawClient(b.port)
    c.handshake()
    c.open_channel(1)
    size = 100 * 1024 * 1024
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
    c.send(_header(1, size))
    c.expect(commands.Connection.Blocked, 0)  # the alarm is up: a publisher is blocked
    frame = raw_frame(3, 1, bytes(BODY_FRAME))
    rss_before = _rss(b)
    c.sock.settimeout(2.0)
    sent = 0
    try:
        while sent + BODY_FRAME < size:
            c.sock.sendall(frame)
            sent += BODY_FRAME
    except TimeoutError:
        pass
    # what the kernel buffers on both sides holds, not the 100 MiB the client wanted to send
    assert sent < 40 * 1024 * 1024, sent
    assert _rss(b) - rss_before < 40 * 1024 * 1024
    c.close()


# -- the attack: many connections x channels announce big bodies and never finish them ----------
class Attacker(threading.Thread):
    """One connection, `channels` channels, each: basic.publish + a content header announcing
    `size` bytes, then body frames round-robin over the channels, never completing a message."""

    def __init__(self, port: int, channels: int, size: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port, self.channels, self.size, self.stop = port, channels, size, stop
        self.refused = 0  # channel.close 406 seen (huge announcements)
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            c = RawClient(self.port)
            c.handshake()
            for ch in range(1, self.channels + 1):
                c.open_channel(ch)
            for ch in range(1, self.channels + 1):
                c.send_method(ch, commands.Basic.Publish(exchange="", routing_key="nowhere"))
                c.send(_header(ch, self.size))
            burst = b"".join(raw_frame(3, ch, bytes(BODY_FRAME))
                             for ch in range(1, self.channels + 1))
            # never reach the announced size: a complete message would free its bytes
            rounds = (min(self.size, 1 << 40) - 1) // BODY_FRAME
            c.sock.settimeout(0.2)
            view, at, done = memoryview(burst), 0, 0
            while not self.stop.is_set() and done < rounds:
                try:
                    n = c.sock.send(view[at:])
                except TimeoutError:  # the broker stopped reading us: that is the point
                    continue
                self.sent += n
                at += n
                if at == len(burst):
                    at, done = 0, done + 1
            c.sock.settimeout(0.2)
            while True:  # count the 406s that came back
                try:
                    got = c.recv_frame(0.2)
                except (TimeoutError, OSError):
                    break
                if got is None:
                    break
                if isinstance(got[1], commands.Channel.Close) and got[1].reply_code == 406:
                    self.refused += 1
            c.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


class RssWatch(threading.Thread):
    def __init__(self, b: BrokerProc, stop_above: int) -> None:
        super().__init__(daemon=True)
        self.b, self.stop_above = b, stop_above
        self.peak = 0
        self.done = threading.Event()
        self.too_big = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                self.peak = max(self.peak, _rss(self.b))
            except OSError:
                return
            if self.peak > self.stop_above:
                self.too_big.set()  # stop the attack before it takes the test machine down
            time.sleep(0.05)


WATERMARK = 300 * 1024 * 1024
MARGIN = 48 * 1024 * 1024


@pytest.mark.timeout(120)
async def test_unfinished_bodies_on_many_connections_stay_under_the_watermark(broker_factory):
    b = broker_factory(args=["--vm-memory-high-watermark", "300MiB",
                             "--max-message-size", "16MiB"]).start()
    watch = RssWatch(b, WATERMARK + 2 * MARGIN)
    watch.start()
    stop = threading.Event()
    # 2^62-byte announcements (refused at the header) and max-size ones (held, up to the
    # content budget): together they would hold 5 x 10 x 16 MiB = 800 MiB without it
    huge = [Attacker(b.port, 10, 1 << 62, stop) for _ in range(3)]
    held = [Attacker(b.port, 10, 16 * 1024 * 1024, stop) for _ in range(5)]
    for a in huge + held:
        a.start()

    # meanwhile another client publishes persistent messages with confirms and consumes them
    conn = await aio_pika.connect(b.url)
    pub = await conn.channel(publisher_confirms=True)
    await pub.declare_queue("legit", durable=True)
    con = await conn.channel()
    await con.set_qos(prefetch_count=50)
    received: set[int] = set()

    async def on_message(m: aio_pika.abc.AbstractIncomingMessage) -> None:
        received.add(int(m.body[:8].decode()))
        await m.ack()

    await (await con.get_queue("legit")).consume(on_message)
    confirmed: list[int] = []

    async def publish(n: int) -> None:
        await pub.default_exchange.publish(
            aio_pika.Message(b"%08d" % n + bytes(1016),
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key="legit")
        confirmed.append(n)  # publish() returned: the broker confirmed it

    n = 0
    deadline = time.monotonic() + 8.0  # publish while the attack runs, 20 confirms in flight
    while time.monotonic() < deadline and not watch.too_big.is_set():
        await asyncio.gather(*(publish(i) for i in range(n, n + 20)))
        n += 20
    stop.set()
    for a in huge + held:
        a.join(10)
    while len(received) < len(confirmed) and not watch.too_big.is_set():
        await asyncio.sleep(0.05)
    watch.done.set()
    watch.join()
    await conn.close()

    assert not watch.too_big.is_set(), f"RSS reached {watch.peak >> 20} MiB"
    assert watch.peak < WATERMARK + MARGIN, f"RSS peak {watch.peak >> 20} MiB"
    assert len(confirmed) >= 200  # the other client went on while the attack lasted
    assert received == set(confirmed)
    for a in huge + held:
        assert a.error is None, a.error
    assert all(a.refused == 10 for a in huge)
    assert sum(a.sent for a in held) > 48 * 1024 * 1024  # they did try


def test_a_client_may_still_complete_a_large_message_alone(broker_factory):
    """The holder with the most bytes always goes on: a message bigger than the whole content
    budget completes when nobody else holds more."""
    b = broker_factory(args=["--vm-memory-high-watermark", "300MiB",
                             "--partial-content-ratio", "0.02",
                             "--max-message-size", "32MiB"]).start()
    c = RawClient(b.port, timeout=30)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    q = c.expect(commands.Queue.DeclareOk, 1).queue
    size = 24 * 1024 * 1024  # 4x the 6 MiB budget
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key=q))
    c.send_content(1, bytes(size))
    c.send_method(1, commands.Queue.Declare(queue=q, passive=True))
    assert c.expect(commands.Queue.DeclareOk, 1, timeout=30).message_count == 1
    c.close()



# -- a huge headers table -----------------------------------------------------------------------
def test_huge_headers_tables_are_queued_raw_not_decoded(broker_factory):
    """A 120 KiB headers table decodes to some MiB of Python objects: a headers exchange must
    decode it to route, but the queue keeps the raw bytes only."""
    b = broker_factory().start()
    c = RawClient(b.port, timeout=30)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Exchange.Declare(exchange="huge-h", exchange_type="headers"))
    c.expect(commands.Exchange.DeclareOk, 1)
    c.send_method(1, commands.Queue.Declare(queue="huge-q"))
    c.expect(commands.Queue.DeclareOk, 1)
    c.send_method(1, commands.Queue.Bind(queue="huge-q", exchange="huge-h",
                                         arguments={"x-match": "any", "f00000": True}))
    c.expect(commands.Queue.BindOk, 1)
    fields = b"".join(b"\x06f%05dt\x01" % i for i in range(13000))  # 117 KiB, 13,000 fields
    props = b"\x20\x00" + struct.pack(">I", len(fields)) + fields
    before = _rss(b)
    n = 150
    for _ in range(n):
        c.send_method(1, commands.Basic.Publish(exchange="huge-h", routing_key=""))
        c.send(raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 1) + props) + raw_frame(3, 1, b"x"))
    c.send_method(1, commands.Queue.Declare(queue="huge-q", passive=True))
    assert c.expect(commands.Queue.DeclareOk, 1, timeout=60).message_count == n
    grown = _rss(b) - before
    # raw: 150 x 117 KiB = 17 MiB; kept decoded it was ~1.6 MiB a message, 240 MiB
    assert grown < 64 * 1024 * 1024, grown >> 20
    c.close()


def test_huge_headers_tables_held_in_a_transaction_are_kept_raw(broker_factory):
    """An expiration makes the channel decode the block at publish; a transaction holds the
    publish until commit, and what it holds is the raw block, as a queue keeps it."""
    b = broker_factory().start()
    c = RawClient(b.port, timeout=30)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue="huge-tx"))
    c.expect(commands.Queue.DeclareOk, 1)
    c.send_method(1, commands.Tx.Select())
    c.expect(commands.Tx.SelectOk, 1)
    fields = b"".join(b"\x06f%05dt\x01" % i for i in range(13000))  # 117 KiB, 13,000 fields
    props = b"\x21\x00" + struct.pack(">I", len(fields)) + fields + b"\x0560000"
    before = _rss(b)
    n = 150
    for _ in range(n):
        c.send_method(1, commands.Basic.Publish(exchange="", routing_key="huge-tx"))
        c.send(raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 1) + props) + raw_frame(3, 1, b"x"))
    c.send_method(1, commands.Queue.Declare(queue="huge-tx", passive=True))
    assert c.expect(commands.Queue.DeclareOk, 1, timeout=60).message_count == 0
    grown = _rss(b) - before
    # raw: 150 x 117 KiB = 17 MiB; held decoded it was ~1.6 MiB a message, 240 MiB
    assert grown < 64 * 1024 * 1024, grown >> 20
    c.send_method(1, commands.Tx.Commit())
    c.expect(commands.Tx.CommitOk, 1, timeout=60)
    c.send_method(1, commands.Queue.Declare(queue="huge-tx", passive=True))
    assert c.expect(commands.Queue.DeclareOk, 1).message_count == n
    c.close()


# -- thousands of channels, each with a half-sent message ---------------------------------------
def test_thousands_of_channels_each_with_a_half_sent_message(broker_factory):
    """2,000 channels (channel_max 2047) each announce 1 MiB and send 64 KiB of it: 125 MiB
    wanted; the content budget lets one connection hold at most max(budget, max_message_size)."""
    b = broker_factory(args=["--vm-memory-high-watermark", "300MiB",
                             "--max-message-size", "16MiB"]).start()
    c = RawClient(b.port, timeout=30)
    c.handshake()
    n = 2000
    c.send(b"".join(wire_method(ch, commands.Channel.Open()) for ch in range(1, n + 1)))
    for _ in range(n):
        c.expect(commands.Channel.OpenOk)
    before = _rss(b)
    part = raw_frame(3, 1, bytes(64 * 1024))
    c.sock.settimeout(2.0)
    sent = 0
    try:
        for ch in range(1, n + 1):
            frame = part[:1] + struct.pack(">H", ch) + part[3:]
            c.sock.sendall(wire_method(ch, commands.Basic.Publish(exchange="", routing_key="x"))
                           + _header(ch, 1 << 20) + frame)
            sent += 64 * 1024
    except TimeoutError:
        pass  # the broker stopped reading us: the budget at work
    assert _rss(b) - before < 100 * 1024 * 1024, (sent >> 20, _rss(b) - before >> 20)
    assert sent < 100 * 1024 * 1024, sent >> 20  # what socket buffers hold past the budget
    c.close()
    roundtrip_ok(b.port)


def wire_method(channel: int, method: object) -> bytes:
    from pamqp import frame as pframe
    return pframe.marshal(method, channel)  # type: ignore[arg-type]


# -- consumers per channel ----------------------------------------------------------------------
def test_consumer_max_per_channel_is_530_as_rabbitmq(broker_factory):
    b = broker_factory(args=["--consumer-max-per-channel", "3"]).start()
    c = RawClient(b.port)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    q = c.expect(commands.Queue.DeclareOk, 1).queue
    for i in range(3):
        c.send_method(1, commands.Basic.Consume(queue=q, consumer_tag=f"c{i}"))
        c.expect(commands.Basic.ConsumeOk, 1)
    c.send_method(1, commands.Basic.Consume(queue=q, consumer_tag="c3"))
    close = c.expect(commands.Connection.Close, 0)
    assert (close.reply_code, close.reply_text) == (
        530, "NOT_ALLOWED - reached maximum (3) of consumers per channel")
    c.close()


# -- thousands of bindings and consumers -------------------------------------------------------
def test_thousands_of_bindings_and_consumers_are_counted_and_the_alarm_holds(broker_factory):
    """No limit by default, as RabbitMQ: what bounds them is that their memory is in what the
    monitor samples, so the alarm rises and blocks publishers while a client keeps binding."""
    idle = broker_factory(name="idle").start()
    time.sleep(0.5)
    # MiB: 30,000 bindings take ~16 MiB more. Each of N workers watches its own RSS against
    # 1/N of the watermark (docs/ARCHITECTURE.md, "Process tree"), so it is sized per worker.
    pids = idle.serving_pids()
    watermark = ((max(rss(pid) for pid in pids) >> 20) + 8) * len(pids)
    idle.kill()
    b = broker_factory(args=["--vm-memory-high-watermark", f"{watermark}MiB",
                             "--memory-monitor-interval-s", "0.05"]).start()
    publisher = RawClient(b.port)
    publisher.handshake()  # announces connection.blocked
    publisher.open_channel(1)
    c = RawClient(b.port, timeout=30)
    c.handshake()
    # the bindings over 10 channels: with workers each is a write to the metadata store, and
    # a channel's come one after another, one fsync each (~200/s); concurrent ones share one
    channels = range(1, 11)
    for ch in channels:
        c.open_channel(ch)
    c.send_method(1, commands.Queue.Declare(queue="many"))
    c.expect(commands.Queue.DeclareOk, 1)
    _publish_once(publisher)
    with pytest.raises(TimeoutError):
        publisher.recv_frame(timeout=0.5)  # below the watermark: not blocked
    before = _rss(b)
    n = 30000
    c.send(b"".join(wire_method(channels[i % len(channels)], commands.Queue.Bind(
        queue="many", exchange="amq.direct", routing_key=f"k{i}")) for i in range(n)))
    for _ in range(n):  # no connection.blocked among them: this client never publishes
        c.expect(commands.Queue.BindOk)
    bound = _rss(b)
    # measured ~550 bytes (per worker: each holds every binding)
    assert (bound - before) / n < 2048, (bound - before) / n
    m = 5000
    c.send(b"".join(wire_method(1, commands.Basic.Consume(queue="many", consumer_tag=f"c{i}"))
                    for i in range(m)))
    for _ in range(m):
        c.expect(commands.Basic.ConsumeOk, 1)
    assert (_rss(b) - bound) / m < 2048, (_rss(b) - bound) / m  # measured ~130 bytes
    for _ in range(50):  # the monitor samples every 50 ms; a publish under the alarm blocks
        _publish_once(publisher)
        try:
            got = publisher.recv_frame(timeout=0.2)
        except TimeoutError:
            continue
        assert isinstance(got[1], commands.Connection.Blocked), got
        assert got[1].reason == "low on memory"
        break
    else:
        raise AssertionError("the memory alarm never blocked the publisher")
    publisher.close()
    c.close()


def _publish_once(c: RawClient) -> None:
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
    c.send_content(1, b"x")


# -- handshakes never finished ------------------------------------------------------------------
def test_half_open_connections_cost_little_and_are_dropped(broker_factory):
    b = broker_factory(args=["--handshake-timeout-s", "1"]).start()
    before = _rss(b)
    clients = []
    for i in range(300):
        c = RawClient(b.port)
        c.send(b"AMQP\x00\x00"[: i % 7])  # nothing, or part of the protocol header
        clients.append(c)
    grown = _rss(b) - before
    assert grown < 300 * 32 * 1024, grown  # a few KiB each
    # and each is closed once handshake_timeout_s is over
    assert all(c.closed(10.0) for c in clients)
    for c in clients:
        c.close()
    roundtrip_ok(b.port)
