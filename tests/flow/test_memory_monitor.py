"""MemoryMonitor and the /proc readers, fed real figures through the sampling seams."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.flow.alarm import MEMORY, Alarms
from broker.flow.memory_monitor import MemoryMonitor, process_memory, total_memory

GIB = 1024**3


class Figures:
    """A settable memory figure, read by the monitor as its sample."""

    def __init__(self, used: int) -> None:
        self.used = used
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.used


def make(
    used: int, watermark: str | float = 0.4, **kw: object
) -> tuple[MemoryMonitor, Alarms, Figures]:
    alarms, fig = Alarms(), Figures(used)
    mon = MemoryMonitor(alarms, watermark, sample_used=fig, sample_total=lambda: 10 * GIB, **kw)  # type: ignore[arg-type]
    return mon, alarms, fig


def test_limit_from_fraction_and_absolute() -> None:
    assert make(0, 0.4)[0].limit == 4 * GIB
    assert make(0, "1GiB")[0].limit == GIB
    assert make(0, "1GiB")[0].paging_limit == GIB // 2


def test_alarm_raised_above_the_watermark_and_cleared_below() -> None:
    mon, alarms, fig = make(3 * GIB)
    mon.check()
    assert not alarms.active()
    fig.used = 5 * GIB
    mon.check()
    assert alarms.active() == frozenset({MEMORY})
    fig.used = 4 * GIB - 1
    mon.check()
    assert not alarms.active()


def test_memory_pressure_starts_at_the_paging_ratio() -> None:
    fractions: list[float] = []
    mon, _, fig = make(GIB, on_memory_pressure=fractions.append)
    mon.check()  # 1 GiB < 2 GiB paging threshold: nothing to say
    assert mon.ram_ratio() == 1.0
    assert fractions == []
    fig.used = 4 * GIB
    mon.check()
    assert mon.ram_ratio() == pytest.approx(0.5)
    fig.used = 4 * GIB
    mon.check()  # unchanged: not told again
    fig.used = GIB
    mon.check()
    assert fractions == [pytest.approx(0.5), 1.0]


def test_bad_paging_ratio_is_rejected() -> None:
    with pytest.raises(ValueError):
        make(0, paging_ratio=0.0)


def test_total_memory_reads_meminfo_and_a_lower_cgroup_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree:  100 kB\n")
    v2 = tmp_path / "memory.max"
    v2.write_text("max\n")
    v1 = tmp_path / "limit_in_bytes"
    v1.write_text(f"{1 << 62}\n")  # v1's "no limit"
    assert total_memory(str(meminfo), (str(v2), str(v1))) == 16384000 * 1024
    v2.write_text("1073741824\n")
    assert total_memory(str(meminfo), (str(v2), str(tmp_path / "absent"))) == GIB


def test_process_and_total_memory_on_this_machine() -> None:
    rss, total = process_memory(), total_memory()
    assert 0 < rss < total


async def test_run_samples_until_stopped() -> None:
    mon, alarms, fig = make(5 * GIB, interval=0)
    mon.start()
    while fig.reads < 3:
        await asyncio.sleep(0)
    await mon.stop()
    reads = fig.reads
    await asyncio.sleep(0)
    assert fig.reads == reads  # stopped: no more samples
    assert alarms.is_active(MEMORY)


async def test_a_failing_sample_does_not_end_monitoring() -> None:
    calls = 0

    def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("statm vanished")
        return 5 * GIB

    alarms = Alarms()
    mon = MemoryMonitor(alarms, 0.4, interval=0, sample_used=flaky, sample_total=lambda: 10 * GIB)
    mon.start()
    while calls < 2:
        await asyncio.sleep(0)
    await mon.stop()
    assert alarms.is_active(MEMORY)
