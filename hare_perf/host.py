"""Host measurement on Linux: a process's RSS and CPU time, the machine's busy time, and
what other processes on a shared machine use (so a colleague's test run can be waited out or
reported beside the figures)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

__all__ = [
    "QUIET_CORES",
    "CpuSnapshot",
    "cpu_snapshot",
    "loadavg",
    "machine_busy",
    "others_busy",
    "process_cpu_s",
    "process_tree",
    "rss_kib",
    "settled_rss",
    "wait_quiet",
]

_HZ = os.sysconf("SC_CLK_TCK")
_SETTLE_S = 1.0  # before reading RSS: let the broker finish allocating and collecting


def process_tree(pid: int) -> list[int]:
    """The process and its descendants: a broker may be a parent and its workers (a
    multi-worker hare-server), whose CPU and RSS are the broker's."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            todo += [int(x) for x in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return found


def _rss_one(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def rss_kib(pid: int) -> int:
    """VmRSS of a process and its descendants from /proc (Linux), in KiB."""
    total = _rss_one(pid)
    for child in process_tree(pid)[1:]:
        try:
            total += _rss_one(child)
        except (OSError, RuntimeError):
            pass  # gone meanwhile, or a zombie
    return total


def process_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes have used so far."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            if pid == pids[0]:
                raise
            continue  # a descendant gone meanwhile
        total += (int(fields[11]) + int(fields[12])) / _HZ  # utime, stime
    return total


def machine_busy() -> tuple[float, float]:
    """CPU seconds the whole machine spent in processes (user, nice, system) and in interrupts
    (irq, softirq: mostly loopback TCP, the benchmark's own, charged to no process)."""
    with open("/proc/stat") as stat:
        f = [int(x) for x in stat.readline().split()[1:]]
    return (f[0] + f[1] + f[2]) / _HZ, (f[5] + f[6]) / _HZ


def loadavg() -> float:
    """The machine's one-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


CpuSnapshot = tuple[float, float, float, float]


def cpu_snapshot(pid: int | None) -> CpuSnapshot | None:
    """(wall, machine busy, broker, us) in CPU seconds; None off Linux."""
    try:
        # irq/softirq time is left out of busy: it is the benchmark's own (loopback TCP) and
        # charged to no process, so it must not count as someone else's
        busy = machine_busy()[0]
        broker = process_cpu_s(process_tree(pid)) if pid else 0.0
    except (OSError, ValueError, IndexError):
        return None
    t = os.times()  # our own CPU and that of the workers we have joined
    return time.monotonic(), busy, broker, t.user + t.system + t.children_user + t.children_system


def others_busy(before: CpuSnapshot | None, after: CpuSnapshot | None) -> dict[str, float]:
    """Cores kept busy by neither the broker nor hare-perf during a run (a shared machine's
    noise). Only meaningful with --pid; without it the broker counts as "others"."""
    if before is None or after is None:
        return {}
    wall, busy, broker, ours = (a - b for a, b in zip(after, before, strict=True))
    others = {"others_cpu": max(0.0, (busy - broker - ours) / max(wall, 1e-9))}
    return {"broker_cpu": broker / max(wall, 1e-9), **others} if broker else others


QUIET_CORES = 0.2


async def wait_quiet(pid: int | None, limit_s: float) -> float:
    """Wait until other processes used under QUIET_CORES for one second, or `limit_s` has
    passed; returns what they used in the last second. On a shared machine this keeps a
    colleague's test run out of the figures."""
    deadline = time.monotonic() + limit_s
    while True:
        before = cpu_snapshot(pid)
        await asyncio.sleep(1.0)
        others = others_busy(before, cpu_snapshot(pid)).get("others_cpu", 0.0)
        if others < QUIET_CORES or time.monotonic() >= deadline:
            return others


async def settled_rss(pid: int) -> int:
    """RSS once the broker has had a moment to finish allocating and collecting."""
    await asyncio.sleep(_SETTLE_S)
    return rss_kib(pid)
