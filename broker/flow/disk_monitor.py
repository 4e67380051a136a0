"""The disk monitor, after rabbit_disk_monitor: free space on the data directory's file
system against disk_free_limit (default 50 MB, as RabbitMQ); below it the disk alarm is
raised, at or above it cleared.

The sample runs on a worker thread (aiofiles): statvfs on a hung network file system blocks
until the server answers, and the broker must go on serving meanwhile (RabbitMQ's disk
monitor is a process of its own for the same reason)."""

from __future__ import annotations

import os
from collections.abc import Callable

import aiofiles.os

from broker.config.sizes import parse_size
from broker.flow.alarm import DISK, Alarms
from broker.flow.periodic import PeriodicCheck

__all__ = ["DEFAULT_DISK_FREE_LIMIT", "DiskMonitor", "free_disk"]

DEFAULT_DISK_FREE_LIMIT = 50_000_000


def free_disk(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged process may still write on the file system holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class DiskMonitor(PeriodicCheck):
    """`sample_free` is a seam for tests (defaults to free_disk(path))."""

    def __init__(
        self,
        alarms: Alarms,
        path: str | os.PathLike[str],
        *,
        limit: int | str = DEFAULT_DISK_FREE_LIMIT,
        interval: float = 1.0,
        sample_free: Callable[[], int] | None = None,
    ) -> None:
        self.alarms = alarms
        self.path = path
        self.limit = parse_size(limit)
        self.interval = interval
        self._sample_free = sample_free or (lambda: free_disk(path))
        self._sample_off_loop = aiofiles.os.wrap(self._sample_free)
        self.free = -1  # bytes free at the last sample; -1 before the first

    def check(self) -> None:
        self._apply(self._sample_free())

    async def tick(self) -> None:
        self._apply(await self._sample_off_loop())

    def _apply(self, free: int) -> None:
        self.free = free
        if free < self.limit:
            self.alarms.raise_alarm(DISK, free_bytes=free, limit_bytes=self.limit)
        else:
            self.alarms.clear_alarm(DISK, free_bytes=free, limit_bytes=self.limit)
