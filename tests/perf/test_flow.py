"""The publisher's manners, against a fake broker on loopback: it stops writing on
connection.blocked until connection.unblocked, and it waits (bounded buffer) while the broker
does not read."""

from __future__ import annotations

import asyncio
import time

from pamqp import commands
from pamqp import frame as pamqp_frame

from hare_perf.client import AmqpClient, connect
from hare_perf.scanner import FrameScanner
from hare_perf.wire import PROTOCOL_HEADER, PublishBatch, decode_method, parse_url
from hare_perf.workers import PublisherSpec, _publish

_PUBLISH = (60 << 16) | 40


class FakeBroker:
    """Answers the handshake and channel.open, then counts basic.publish frames. `reading`
    can be cleared to stop reading the socket (TCP back-pressure)."""

    def __init__(self) -> None:
        self.scanner = FrameScanner(timestamps=False)
        self.publishes = 0
        self.writer: asyncio.StreamWriter | None = None
        self.reading = asyncio.Event()
        self.reading.set()
        self.channel_open = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    def send(self, channel: int, method: object) -> None:
        assert self.writer is not None
        self.writer.write(pamqp_frame.marshal(method, channel))  # type: ignore[arg-type]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        assert await reader.readexactly(8) == PROTOCOL_HEADER
        self.send(0, commands.Connection.Start(mechanisms="PLAIN", locales="en_US"))
        while True:
            await self.reading.wait()
            data = await reader.read(65536)
            if not data:
                return
            self.scanner.feed(data)
            for channel, payload in self.scanner.take_methods():
                if int.from_bytes(payload[:4], "big") == _PUBLISH:
                    self.publishes += 1
                    continue
                self.answer(channel, decode_method(payload))

    def answer(self, channel: int, method: object) -> None:
        if isinstance(method, commands.Connection.StartOk):
            self.send(0, commands.Connection.Tune(channel_max=2047, frame_max=131072))
        elif isinstance(method, commands.Connection.Open):
            self.send(0, commands.Connection.OpenOk())
        elif isinstance(method, commands.Channel.Open):
            self.send(channel, commands.Channel.OpenOk())
            self.channel_open.set()
        elif isinstance(method, commands.Connection.Close):
            self.send(0, commands.Connection.CloseOk())

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        assert self.server is not None
        self.server.close()


async def _client(fake: FakeBroker) -> AmqpClient:
    client = await connect(parse_url(f"amqp://guest:guest@127.0.0.1:{fake.port}/"), timeout=5)
    await client.open_channel(1, timeout=5)
    return client


def _spec(count: int) -> PublisherSpec:
    return PublisherSpec("amqp://x@127.0.0.1/", "", ["q"], count, 256, timeout_s=30.0)


async def test_publisher_waits_while_blocked() -> None:
    fake = FakeBroker()
    await fake.start()
    client = await _client(fake)
    try:
        fake.send(0, commands.Connection.Blocked(reason="low on memory"))
        deadline = time.monotonic() + 5
        while client.unblocked.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert client.blocked_count == 1
        batch = PublishBatch(1, "", ["q"], 256, False, client.frame_max)
        task = asyncio.create_task(_publish(client, batch, _spec(5000), time.monotonic() + 30))
        await asyncio.sleep(0.3)
        assert fake.publishes == 0 and not task.done()
        fake.send(0, commands.Connection.Unblocked())
        await asyncio.wait_for(task, 10)
        deadline = time.monotonic() + 5
        while fake.publishes < 5000 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert fake.publishes == 5000
    finally:
        await client.close(timeout=1)
        await fake.close()


async def test_publisher_honours_tcp_back_pressure() -> None:
    fake = FakeBroker()
    await fake.start()
    client = await _client(fake)
    try:
        fake.reading.clear()  # the broker stops reading
        batch = PublishBatch(1, "", ["q"], 256, False, client.frame_max)
        count = 200_000  # ~60 MiB: far more than socket buffers plus our high-water mark
        task = asyncio.create_task(_publish(client, batch, _spec(count), time.monotonic() + 30))
        await asyncio.sleep(0.5)
        assert not task.done()
        assert client.transport is not None
        buffered = client.transport.get_write_buffer_size()
        assert buffered <= (1 << 20) + len(batch.template)  # high-water mark + one batch
        fake.reading.set()
        await asyncio.wait_for(task, 20)
        deadline = time.monotonic() + 10
        while fake.publishes < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert fake.publishes == count
    finally:
        await client.close(timeout=1)
        await fake.close()
