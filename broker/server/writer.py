"""One writer per socket: frames are appended to a buffer and written as one joined buffer
per loop iteration, so a burst of deliveries and acks becomes one syscall."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

__all__ = ["FULL_BYTES", "Writer"]

FULL_BYTES = 1 << 20


class Writer:
    __slots__ = (
        "_buf",
        "_loop",
        "_scheduled",
        "_transport",
        "_waiters",
        "activity",
        "bytes_out",
        "full",
        "on_resume",
        "paused",
        "queued",
        "shut",
    )

    def __init__(self, transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buf: list[bytes] = []
        self._scheduled = False
        self.paused = False  # the transport's buffer is above its high-water mark
        self.on_resume: Callable[[], None] | None = None
        self.bytes_out = 0
        self.activity = False  # something was written since the last heartbeat tick
        self.queued = 0  # bytes of message bodies buffered here since the last flush
        self.full = False  # queued passed FULL_BYTES: deliveries wait for the next flush
        self.shut = False  # our half of the socket is closed: nothing more goes out
        self._waiters: list[asyncio.Future[None]] = []  # wait_writable()

    def send(self, data: bytes) -> None:
        self._buf.append(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def send_many(self, parts: Iterable[bytes]) -> None:
        self._buf.extend(parts)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def send_delivery(self, parts: list[bytes], size: int) -> None:
        """A delivery's frames, and its body's size counted as `note_queued` does (one call
        per delivery instead of two)."""
        self._buf.extend(parts)
        queued = self.queued + size + 64
        self.queued = queued
        if queued > FULL_BYTES:
            self.full = True
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def note_queued(self, size: int) -> None:
        """Count a delivery's body; past FULL_BYTES the channel stops taking deliveries until
        this buffer reaches the transport (whose own high-water mark then takes over)."""
        self.queued += size
        if self.queued > FULL_BYTES:
            self.full = True

    def flush(self) -> None:
        self._scheduled = False
        buf = self._buf
        was_full = self.full
        self.queued = 0
        self.full = False
        if buf:
            self._buf = []
            if self.shut or self._transport.is_closing():
                return
            self.activity = True
            data = b"".join(buf)  # one buffer for the kernel, and its size for send_oct
            self.bytes_out += len(data)
            self._transport.write(data)
        if was_full and not self.paused:
            if self.on_resume is not None:
                self.on_resume()
            self._wake()

    def shutdown(self) -> None:
        """Write what is buffered, then close our half of the socket (FIN): the peer reads
        everything sent so far and then the end, while we can still read what it sends."""
        self.flush()
        self.shut = True
        transport = self._transport
        if not transport.is_closing() and transport.can_write_eof():
            transport.write_eof()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        if self.on_resume is not None:
            self.on_resume()
        self._wake()

    @property
    def pending(self) -> bool:
        """Frames are buffered here, not yet handed to the transport."""
        return bool(self._buf)

    @property
    def writable(self) -> bool:
        """Neither above the transport's high-water mark nor FULL_BYTES of bodies this turn."""
        return not (self.paused or self.full)

    def wait_writable(self) -> asyncio.Future[None]:
        """Done once writable again, or once the connection is gone (`abandon`)."""
        fut = self._loop.create_future()
        self._waiters.append(fut)
        return fut

    def abandon(self) -> None:
        """The connection is gone: nobody waits for it to drain any more."""
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
