"""SIGTERM to a hare-server while it starts (tests/test_daemon.py, tests/cluster): a data
directory whose recovery takes a moment, a process spawned on it, a signal at a log line."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hare_bench.bench_recovery import fill_queue
from tests.conftest import ROOT, BrokerProc

QUEUES = 4
PER_QUEUE = 50_000  # 200,000 index entries to read back: a start that takes a moment


def fill(broker: BrokerProc) -> None:
    """QUEUES durable queues of PER_QUEUE persistent messages each, all on disk."""
    for i in range(QUEUES):
        asyncio.run(fill_queue(broker.port, PER_QUEUE, 100, queue=f"slow-{i}"))


def spawn(b: BrokerProc) -> subprocess.Popen[str]:
    """`b`'s command line, not waited for: its log goes to b.log_path, its stdout is kept."""
    cmd = [sys.executable, "-m", "broker", "--port", "0", "--data-dir", str(b.data_dir),
           "--log-format", "json", "--management-port", "0", *b.args]
    b.log_path.write_text("")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=b.log_path.open("a"),
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **b.env},
                            cwd=ROOT)


def term_at(proc: subprocess.Popen[str], log: Path, event: str, timeout: float = 60.0
            ) -> tuple[int, str]:
    """SIGTERM to `proc` as soon as its log holds `event`; (exit code, its stdout)."""
    deadline = time.monotonic() + timeout
    while f'"event": "{event}"' not in log.read_text():
        assert proc.poll() is None, f"exited before {event!r}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {event!r} in the log"
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out


def stopped_while_starting(b: BrokerProc, event: str) -> str:
    """`b` spawned and sent SIGTERM at `event` of its start: the start stopped cleanly (exit 0,
    no "listening" line, the shutdown noted in the log). Returns the log."""
    code, out = term_at(spawn(b), b.log_path, event)
    log = b.log_path.read_text()
    assert code == 0, log[-3000:]
    assert "listening" not in out
    assert '"event": "shutdown requested while starting"' in log
    return log
