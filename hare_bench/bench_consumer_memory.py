"""Memory a consumer costs (docs/BENCHMARKS.md, "Consumers of another worker's queue"): N
consumers on one connection of worker B, first of a queue on B, then of a queue on worker A,
with connection placement off so the second set crosses; each worker's RSS before and after.

    python -m hare_bench.bench_consumer_memory --consumers 5000"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pika

from broker.node.supervisor import WORKER_ENV

__all__ = ["main"]


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _workers(parent: int) -> dict[str, int]:
    """Node name suffix (w1, w2) -> worker pid, from each child's environment."""
    found = {}
    for pid in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if entry.startswith(WORKER_ENV.encode() + b"="):
                found[f"w{json.loads(entry.split(b'=', 1)[1])['index']}"] = int(pid)
    return found


def _node_of(mgmt: int, queue: str) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{mgmt}/api/queues",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=10) as answer:
        rows = json.load(answer)
    return next(str(q["node"]).rsplit("-", 1)[1] for q in rows if q["name"] == queue)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hare_bench.bench_consumer_memory")
    parser.add_argument("--consumers", type=int, default=5000)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="hare-consumer-memory-"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        mgmt = probe.getsockname()[1]
    broker = subprocess.Popen(
        [sys.executable, "-m", "broker", "--workers", "2", "--port", "0",
         "--management-port", str(mgmt), "--data-dir", str(root / "data"),
         "--connection-placement=false", "--queue-master-locator=client-local"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert broker.stdout is not None
        line = broker.stdout.readline()
        if "listening on port" not in line:
            raise RuntimeError("broker did not start")
        url = f"amqp://guest:guest@127.0.0.1:{int(line.rsplit(' ', 1)[1])}/%2F?heartbeat=0"
        conns: dict[str, pika.BlockingConnection] = {}  # one connection on each worker
        for i in itertools.count():
            conn = pika.BlockingConnection(pika.URLParameters(url))
            conn.channel().queue_declare(f"probe-{i}", exclusive=True)
            conns.setdefault(_node_of(mgmt, f"probe-{i}"), conn)
            if len(conns) == 2:
                break
        (home, at_home), (near, consuming) = sorted(conns.items())
        at_home.channel().queue_declare("far")
        consuming.channel().queue_declare("near")
        pids = _workers(broker.pid)
        for queue, label in (("near", "on its own worker"), ("far", "of the other worker")):
            ch = consuming.channel()
            time.sleep(1)
            before = _rss(pids[home]), _rss(pids[near])
            for _ in range(args.consumers):
                ch.basic_consume(queue, lambda *_: None)
            time.sleep(2)
            grown = [(_rss(pids[home]) - before[0]) / args.consumers,
                     (_rss(pids[near]) - before[1]) / args.consumers]
            print(f"a consumer of a queue {label}: queue's worker +{grown[0]:,.0f} B, "
                  f"consumer's worker +{grown[1]:,.0f} B, both {sum(grown):,.0f} B", flush=True)
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(60)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
