"""The memory monitor, after vm_memory_monitor: samples the broker's memory use, raises the
memory alarm above the high watermark and clears it below, and tells the queue layer how much
of their RAM messages the queues should keep (paging starts at paging_ratio of the limit)."""

from __future__ import annotations

import os
from collections.abc import Callable

from broker.config.values import MemoryWatermark, watermark_value
from broker.flow.alarm import MEMORY, Alarms
from broker.flow.periodic import PeriodicCheck

__all__ = ["MemoryMonitor", "process_memory", "total_memory"]

# cgroup v2, then v1; v1 reports "no limit" as a huge number, so anything >= 2**60 is none.
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
_NO_LIMIT = 1 << 60


def total_memory(
    meminfo: str = "/proc/meminfo", cgroup_limits: tuple[str, ...] = _CGROUP_LIMITS
) -> int:
    """Bytes of memory available to this process: MemTotal, or the cgroup limit if lower."""
    total = 0
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024  # the figure is in kB
                break
    if total <= 0:
        raise OSError(f"no MemTotal in {meminfo}")
    for path in cgroup_limits:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < _NO_LIMIT:
            total = min(total, int(text))
    return total


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def process_memory(statm: str = "/proc/self/statm") -> int:
    """Resident set size of this process, in bytes."""
    with open(statm) as f:
        return int(f.read().split()[1]) * _PAGE_SIZE


class MemoryMonitor(PeriodicCheck):
    """`sample_used` and `sample_total` are seams: tests feed real figures through them.

    `on_memory_pressure(fraction)` is called whenever the fraction changes: 1.0 while memory
    use is below the paging threshold (watermark limit x paging_ratio), else threshold/used,
    the share of their RAM messages the queues should keep (see flow/memory_pressure.py)."""

    def __init__(
        self,
        alarms: Alarms,
        watermark: MemoryWatermark | str | float = 0.4,
        *,
        interval: float = 0.25,
        paging_ratio: float = 0.5,
        sample_used: Callable[[], int] = process_memory,
        sample_total: Callable[[], int] = total_memory,
        on_memory_pressure: Callable[[float], None] | None = None,
    ) -> None:
        if not 0.0 < paging_ratio <= 1.0:
            raise ValueError(f"paging_ratio must be in (0, 1]: {paging_ratio}")
        self.alarms = alarms
        self.watermark = (
            watermark if isinstance(watermark, MemoryWatermark)
            else watermark_value(watermark, True)
        )
        self.interval = interval
        self.paging_ratio = paging_ratio
        self.on_memory_pressure = on_memory_pressure
        self._sample_used = sample_used
        self._sample_total = sample_total
        self.total = sample_total()
        self.used = 0
        self._fraction = 1.0

    @property
    def limit(self) -> int:
        """Bytes above which the memory alarm is raised."""
        return self.watermark.limit_bytes(self.total)

    @property
    def paging_limit(self) -> int:
        """Bytes above which queues start paging messages out of RAM."""
        return int(self.limit * self.paging_ratio)

    def refresh_total(self) -> None:
        """Re-read total memory (after a cgroup limit change)."""
        self.total = self._sample_total()

    def ram_ratio(self) -> float:
        """Share of their RAM messages queues should keep: 1.0 means no paging needed."""
        used, paging = self.used, self.paging_limit
        return 1.0 if used <= paging else paging / used

    def check(self) -> None:
        self.used = used = self._sample_used()
        limit = self.limit
        if used > limit:
            self.alarms.raise_alarm(MEMORY, used_bytes=used, limit_bytes=limit)
        else:
            self.alarms.clear_alarm(MEMORY, used_bytes=used, limit_bytes=limit)
        fraction = self.ram_ratio()
        if fraction != self._fraction:
            self._fraction = fraction
            if self.on_memory_pressure is not None:
                self.on_memory_pressure(fraction)
