"""usable_cpus: the affinity mask capped by the cgroup CPU quota, on sample cgroup trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config.cpus import cgroup_cpu_limit, usable_cpus


def _tree(tmp_path: Path, membership: str, files: dict[str, str]) -> tuple[Path, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text(membership)
    root = tmp_path / "fs"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    root.mkdir(exist_ok=True)
    return proc, root


def test_v2_container_with_two_cpus(tmp_path: Path) -> None:
    """docker run --cpus 2: cpu.max "200000 100000" at the container's cgroup root."""
    proc, root = _tree(tmp_path, "0::/\n", {"cpu.max": "200000 100000\n"})
    assert cgroup_cpu_limit(proc, root) == 2.0
    assert usable_cpus(proc, root, affinity=16) == 2


def test_v2_no_limit_is_the_affinity(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, "0::/user.slice/app\n",
                       {"user.slice/app/cpu.max": "max 100000\n", "cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit(proc, root) is None
    assert usable_cpus(proc, root, affinity=4) == 4


def test_v2_parent_limit_applies_and_fractions_round_up(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, "0::/kubepods/pod1/ctr\n", {
        "kubepods/pod1/ctr/cpu.max": "max 100000\n",
        "kubepods/pod1/cpu.max": "150000 100000\n",  # 1.5 CPUs on the pod
        "kubepods/cpu.max": "800000 100000\n",
    })
    assert cgroup_cpu_limit(proc, root) == 1.5
    assert usable_cpus(proc, root, affinity=8) == 2


def test_v1_cfs_quota(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    })
    assert usable_cpus(proc, root, affinity=16) == 3


def test_v1_unlimited_and_host_path_not_mounted(tmp_path: Path) -> None:
    """-1 is no quota; a path of the host's that the container cannot see reads the mount."""
    proc, root = _tree(tmp_path, "2:cpu:/docker/xyz\n", {
        "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_limit(proc, root) is None
    proc, root = _tree(tmp_path / "b", "2:cpu:/docker/xyz\n", {
        "cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert usable_cpus(proc, root, affinity=2) == 1  # half a CPU: still one worker


def test_no_cgroup_file_system(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "missing", tmp_path) is None
    assert usable_cpus(tmp_path / "missing", tmp_path, affinity=3) == 3


def test_workers_setting_accepts_auto() -> None:
    from broker.config import ConfigError, load_settings

    assert load_settings([], env={"HARE_WORKERS": "auto"}).workers == 0
    assert load_settings(["--workers", "3"], env={}).workers == 3
    assert load_settings([], env={}).workers == 0  # the default: auto
    with pytest.raises(ConfigError, match="expected auto or an integer"):
        load_settings(["--workers", "many"], env={})
