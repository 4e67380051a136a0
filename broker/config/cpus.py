"""How many cores this process may use: its CPU affinity, capped by its cgroup's CPU quota.

`os.cpu_count()` is the machine's; a container started with `--cpus 2` on a 16-core host has
16 in its affinity mask and 2 CPUs' worth of time in its cgroup (cgroup v2 `cpu.max`, v1
`cpu.cfs_quota_us` / `cpu.cfs_period_us`). A quota is rounded up (1.5 CPUs: 2 workers, each
given its share of time by the kernel), as the JVM and .NET count a container's processors.
Plain functions on the files (paths are parameters) so tests feed them sample cgroup trees."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["cgroup_cpu_limit", "usable_cpus"]


def _quota_v2(text: str) -> float | None:
    """cpu.max: "max 100000" (no limit) or "<quota> <period>" in microseconds."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    quota, period = int(parts[0]), int(parts[1])
    return quota / period if quota > 0 and period > 0 else None


def _quota_v1(quota_text: str, period_text: str) -> float | None:
    quota, period = int(quota_text), int(period_text)
    return quota / period if quota > 0 and period > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _ancestors(mount: Path, cgroup_path: str) -> list[Path]:
    """The process's cgroup directory and each parent up to the mount: a limit on any of
    them applies. In a container /proc/self/cgroup may name the host's path while the mount
    is the container's own cgroup: then the mount itself is the one to read."""
    parts = [p for p in cgroup_path.strip("/").split("/") if p]
    dirs = [mount.joinpath(*parts[:i]) for i in range(len(parts), 0, -1)]
    return [d for d in dirs if d.is_dir()] + [mount]


def cgroup_cpu_limit(proc_self_cgroup: Path = Path("/proc/self/cgroup"),
                     cgroup_root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The tightest CPU quota (in CPUs) on this process's cgroup and its ancestors, v2 or v1;
    None when there is none (or no cgroup file system)."""
    membership = _read(proc_self_cgroup)
    if membership is None:
        return None
    limits: list[float] = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2's unified hierarchy
            for d in _ancestors(cgroup_root, path):
                text = _read(d / "cpu.max")
                limit = _quota_v2(text) if text else None
                if limit is not None:
                    limits.append(limit)
        elif "cpu" in controllers.split(","):  # cgroup v1: cpu (often mounted as cpu,cpuacct)
            for mount in (cgroup_root / controllers, cgroup_root / "cpu"):
                if not mount.is_dir():
                    continue
                for d in _ancestors(mount, path):
                    quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
                    limit = _quota_v1(quota, period) if quota and period else None
                    if limit is not None:
                        limits.append(limit)
                break
    return min(limits) if limits else None


def usable_cpus(proc_self_cgroup: Path = Path("/proc/self/cgroup"),
                cgroup_root: Path = Path("/sys/fs/cgroup"),
                affinity: int | None = None) -> int:
    """Cores this process may use: the affinity mask, capped by the cgroup quota (rounded
    up), at least 1."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    limit = cgroup_cpu_limit(proc_self_cgroup, cgroup_root)
    if limit is not None:
        affinity = min(affinity, math.ceil(limit))
    return max(1, affinity)
