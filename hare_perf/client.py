"""A raw AMQP 0-9-1 client for load generation: an asyncio.Protocol that does the handshake
itself, feeds every read to the FrameScanner, and decodes through pamqp only the rare methods
the scanner sets aside. Publishing writes pre-encoded batches straight to the transport,
honouring TCP back-pressure (pause_writing) and connection.blocked."""

from __future__ import annotations

import asyncio
import collections
import socket
from collections.abc import Callable
from typing import cast

from pamqp import base, commands

from hare_perf.scanner import FrameScanner
from hare_perf.wire import (
    PROTOCOL_HEADER,
    BrokerUrl,
    decode_method,
    encode_method,
)

__all__ = ["AmqpClient", "BrokerClosed", "connect"]

_HEARTBEAT = bytes((8, 0, 0, 0, 0, 0, 0, 0xCE))
_CLIENT_PROPERTIES = {
    "product": "hare-perf",
    "capabilities": {
        "publisher_confirms": True,
        "connection.blocked": True,
        "consumer_cancel_notify": True,
        "basic.nack": True,
    },
}


class BrokerClosed(Exception):
    """The broker closed the connection or a channel (carries its reply code and text)."""


class AmqpClient(asyncio.Protocol):
    """One connection. `on_data` (if set) runs after each read has been scanned: that is
    where a consumer acks and notices it is done, without a task per message."""

    def __init__(self, timestamps: bool = True) -> None:
        self.scanner = FrameScanner(timestamps=timestamps)
        self.transport: asyncio.Transport | None = None
        self.on_data: Callable[[], None] | None = None
        self.unblocked = asyncio.Event()
        self.unblocked.set()
        self.blocked_count = 0
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.frame_max = 131072
        self._waiters: dict[int, collections.deque[asyncio.Future[base.Frame]]] = {}
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self._progress: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.transport is not None:
            return
        # uvloop's transports quack like asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # pause at 1 MiB buffered: bounded memory, yet deep enough to keep the socket full
        self.transport.set_write_buffer_limits(high=1 << 20, low=1 << 18)

    def data_received(self, data: bytes) -> None:
        scanner = self.scanner
        try:
            scanner.feed(data)
        except Exception as exc:
            self._fail(exc)
            return
        if scanner.methods:
            for channel, payload in scanner.take_methods():
                self._dispatch(channel, payload)
        if scanner.heartbeats:
            scanner.heartbeats = 0
            self.write(_HEARTBEAT)
        if self.on_data is not None:
            self.on_data()
        progress = self._progress
        if progress is not None and not progress.done():
            progress.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or BrokerClosed("connection lost"))
        self.resume_writing()

    @property
    def paused(self) -> bool:
        """The transport's buffer is above its high-water mark."""
        return self._paused

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    # -- slow path ------------------------------------------------------------------------
    def _dispatch(self, channel: int, payload: bytes) -> None:
        method = decode_method(payload)
        if isinstance(method, commands.Connection.Blocked):
            self.blocked_count += 1
            self.unblocked.clear()
        elif isinstance(method, commands.Connection.Unblocked):
            self.unblocked.set()
        elif isinstance(method, commands.Connection.Close):
            self.write(encode_method(0, commands.Connection.CloseOk()))
            self._fail(BrokerClosed(f"connection closed: {method.reply_code} {method.reply_text}"))
        elif isinstance(method, commands.Channel.Close):
            self.write(encode_method(channel, commands.Channel.CloseOk()))
            self._fail_channel(
                channel, BrokerClosed(f"channel closed: {method.reply_code} {method.reply_text}")
            )
        elif isinstance(method, commands.Basic.Cancel):
            self._fail(BrokerClosed(f"consumer {method.consumer_tag} cancelled by the broker"))
        else:
            waiters = self._waiters.get(channel)
            if waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(method)

    def _fail_channel(self, channel: int, exc: BaseException) -> None:
        for waiter in self._waiters.pop(channel, ()):
            if not waiter.done():
                waiter.set_exception(exc)
                waiter.exception()  # a waiter nobody awaits any more must not log at exit

    def _fail(self, exc: BaseException) -> None:
        for channel in list(self._waiters):
            self._fail_channel(channel, exc)
        if not self.closed.done():
            self.closed.set_exception(exc)
            self.closed.exception()  # mark retrieved: a clean close is also "an exception"
        progress = self._progress
        if progress is not None and not progress.done():
            progress.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    # -- API ------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport's buffer is above its high-water mark."""
        while self._paused:
            self.check_open()
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    async def progress(self, timeout: float) -> None:
        """Wait for the next read (or the timeout): how a confirm-bound publisher waits."""
        self.check_open()
        self._progress = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._progress, timeout)
        except TimeoutError:
            pass

    def check_open(self) -> None:
        if self.closed.done():
            exc = self.closed.exception()
            raise exc if exc is not None else BrokerClosed("connection closed")

    def expect(self, channel: int) -> asyncio.Future[base.Frame]:
        waiter: asyncio.Future[base.Frame] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(channel, collections.deque()).append(waiter)
        return waiter

    async def rpc(self, channel: int, method: base.Frame, timeout: float = 30.0) -> base.Frame:
        """Send a synchronous method and wait for its reply (replies come in order)."""
        self.check_open()
        waiter = self.expect(channel)
        self.write(encode_method(channel, method))
        return await asyncio.wait_for(waiter, timeout)

    async def handshake(self, url: BrokerUrl, timeout: float) -> None:
        start = self.expect(0)
        self.write(PROTOCOL_HEADER)
        method = await asyncio.wait_for(start, timeout)
        if not isinstance(method, commands.Connection.Start):
            raise BrokerClosed(f"expected connection.start, got {method.name}")
        tune = self.expect(0)
        response = f"\0{url.user}\0{url.password}"
        self.write(
            encode_method(
                0,
                commands.Connection.StartOk(
                    client_properties=_CLIENT_PROPERTIES,
                    mechanism="PLAIN",
                    response=response,
                    locale="en_US",
                ),
            )
        )
        method = await asyncio.wait_for(tune, timeout)
        if not isinstance(method, commands.Connection.Tune):
            raise BrokerClosed(f"expected connection.tune, got {method.name}")
        self.frame_max = min(method.frame_max or 131072, 131072)
        self.scanner.frame_max = self.frame_max
        channel_max = method.channel_max or 2047
        # heartbeat 0: a load run is short and the scanner would only have to answer them
        self.write(
            encode_method(
                0,
                commands.Connection.TuneOk(
                    channel_max=channel_max, frame_max=self.frame_max, heartbeat=0
                ),
            )
        )
        reply = await self.rpc(0, commands.Connection.Open(virtual_host=url.vhost), timeout)
        if not isinstance(reply, commands.Connection.OpenOk):
            raise BrokerClosed(f"expected connection.open-ok, got {reply.name}")

    async def open_channel(self, channel: int = 1, timeout: float = 30.0) -> None:
        await self.rpc(channel, commands.Channel.Open(), timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Polite connection.close, then the socket, whatever the broker answers. With
        timeout 0, no close handshake: the socket is dropped (a publisher whose unread
        publishes would keep the broker busy past the measurement)."""
        if self.transport is None or self.transport.is_closing():
            return
        if timeout <= 0:
            self.transport.abort()
            return
        try:
            bye = commands.Connection.Close(
                reply_code=200, reply_text="bye", class_id=0, method_id=0
            )
            await self.rpc(0, bye, timeout)
        except (TimeoutError, BrokerClosed, ConnectionError):
            pass
        finally:
            self.transport.close()


async def connect(url: BrokerUrl, timeout: float = 30.0, timestamps: bool = True) -> AmqpClient:
    loop = asyncio.get_running_loop()
    tls = url.ssl_context()
    transport, client = await asyncio.wait_for(
        loop.create_connection(
            lambda: AmqpClient(timestamps), url.host, url.port, ssl=tls,
            server_hostname=url.host if tls is not None else None,
        ),
        timeout,
    )
    if client.transport is None:  # uvloop may call connection_made only on the next tick
        client.connection_made(transport)
    try:
        await client.handshake(url, timeout)
    except BaseException:
        if client.transport is not None:
            client.transport.close()
        raise
    return client
