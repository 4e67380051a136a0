"""DiskMonitor: the disk alarm against disk_free_limit."""

from __future__ import annotations

from pathlib import Path

from broker.flow.alarm import DISK, Alarms
from broker.flow.disk_monitor import DiskMonitor, free_disk


def test_alarm_below_the_limit_and_cleared_at_it(tmp_path: Path) -> None:
    free = [10_000_000]
    alarms = Alarms()
    mon = DiskMonitor(alarms, tmp_path, limit="50MB", sample_free=lambda: free[0])
    assert mon.limit == 50_000_000
    mon.check()
    assert alarms.active() == frozenset({DISK})
    free[0] = 50_000_000
    mon.check()
    assert not alarms.active()


def test_default_limit_and_real_free_space(tmp_path: Path) -> None:
    alarms = Alarms()
    mon = DiskMonitor(alarms, tmp_path)
    assert mon.limit == 50_000_000
    mon.check()
    assert 0 < mon.free <= free_disk(tmp_path) + (1 << 30)  # the same file system, sampled
    huge = DiskMonitor(alarms, tmp_path, limit=1 << 62)
    huge.check()
    assert alarms.is_active(DISK)
