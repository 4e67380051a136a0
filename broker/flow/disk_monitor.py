"""The disk monitor, after rabbit_disk_monitor: free space on the data directory's file
system against disk_free_limit (default 50 MB, as RabbitMQ); below it the disk alarm is
raised, at or above it cleared."""

from __future__ import annotations

import os
from collections.abc import Callable

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
        self.free = -1

    def check(self) -> None:
        self.free = free = self._sample_free()
        if free < self.limit:
            self.alarms.raise_alarm(DISK, free_bytes=free, limit_bytes=self.limit)
        else:
            self.alarms.clear_alarm(DISK, free_bytes=free, limit_bytes=self.limit)
