"""`make test` runs the suite in several processes (tests/conftest.py, "Parallel runs"): a
file's tests run in one process, and the heavy tests of different files (tests/spark,
tests/docker, ...) in one process too, the heavy ones first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict

from tests.conftest import ROOT

# cheap files: two of the heavy group's and two with many tests, more than the processes
FILES = ["tests/spark/test_imports.py", "tests/docker/test_dockerfile.py",
         "tests/config/test_config_loader.py", "tests/test_amqp_uri.py"]
LINE = re.compile(r"^\[(gw\d+)\] \[ *\d+%\] PASSED (tests/[^:]+)::")


def test_a_files_tests_and_the_heavy_group_each_run_in_one_process() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v", "-p",
         "no:cacheprovider", *FILES], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=100)
    assert out.returncode == 0, out.stdout[-3000:]
    by_file: dict[str, set[str]] = defaultdict(set)
    order: list[str] = []
    for line in out.stdout.splitlines():
        if (m := LINE.match(line)) is not None:
            by_file[m.group(2)].add(m.group(1))
            order.append(m.group(2))
    assert set(by_file) == set(FILES), out.stdout[-3000:]
    assert all(len(procs) == 1 for procs in by_file.values()), dict(by_file)
    assert by_file[FILES[0]] == by_file[FILES[1]]
    # the heavy group went out first: its process ran nothing before it
    heavy_proc = next(iter(by_file[FILES[0]]))
    ran_there = [f for f in order if heavy_proc in by_file[f]]
    assert set(ran_there[:2]) <= set(FILES[:2]), ran_there[:5]
