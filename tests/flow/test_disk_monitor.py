"""DiskMonitor: the disk alarm against disk_free_limit."""

from __future__ import annotations

import asyncio
import threading
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


async def test_a_hung_sample_does_not_stop_the_event_loop(tmp_path: Path) -> None:
    """A statvfs that hangs (a network file system whose server is gone) blocks a worker
    thread, not the loop that serves every connection."""
    entered, release, done = threading.Event(), threading.Event(), threading.Event()

    def hung_statvfs() -> int:
        entered.set()
        release.wait(5)  # bounded, so a regression fails instead of hanging the suite
        done.set()
        return 1_000

    alarms = Alarms()
    mon = DiskMonitor(alarms, tmp_path, limit=2_000, interval=0.01, sample_free=hung_statvfs)
    mon.start()
    try:
        while not entered.is_set():
            await asyncio.sleep(0.005)
        # this coroutine runs while the sample is still blocked: the loop was not
        assert not done.is_set()
        assert mon.free == -1 and not alarms.active()
        release.set()
        while mon.free == -1:
            await asyncio.sleep(0.005)
        assert mon.free == 1_000 and alarms.is_active(DISK)
    finally:
        release.set()
        await mon.stop()
