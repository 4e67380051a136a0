"""A check run every `interval` seconds in one asyncio task, shared by the monitors."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

__all__ = ["PeriodicCheck"]

_log = structlog.get_logger("broker.flow")


class PeriodicCheck:
    """Subclasses implement `check()` (synchronous: sample, compare, raise or clear), and
    `tick()` when sampling may block and must leave the event loop.
    The owner either awaits `run()` in its own TaskGroup or uses `start()`/`stop()`."""

    interval: float
    _task: asyncio.Task[None] | None = None

    def check(self) -> None:
        raise NotImplementedError

    async def tick(self) -> None:
        self.check()

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # a failed sample (say /proc unreadable) must not end monitoring
                _log.exception("monitor check failed", monitor=type(self).__name__)
            await asyncio.sleep(self.interval)

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self.run(), name=type(self).__name__
            )
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
