"""One writer per socket: frames are appended to a buffer and written with one `writelines`
per loop iteration, so a burst of deliveries and acks becomes one syscall."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

__all__ = ["Writer"]


class Writer:
    __slots__ = (
        "_buf",
        "_loop",
        "_scheduled",
        "_transport",
        "activity",
        "bytes_out",
        "on_resume",
        "paused",
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

    def flush(self) -> None:
        self._scheduled = False
        buf = self._buf
        if not buf:
            return
        self._buf = []
        if self._transport.is_closing():
            return
        self.activity = True
        self._transport.writelines(buf)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        if self.on_resume is not None:
            self.on_resume()
