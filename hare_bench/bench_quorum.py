"""Quorum queue figures for docs/CLUSTER.md and docs/BENCHMARKS.md (issue 21):

    python -m hare_bench.bench_quorum --rounds 5

Three set-ups, alternating in one run (each round rotates their order, so a busy machine hurts
them alike):
- "hare quorum x3": a Hare quorum queue on a three-node local cluster (a private etcd), its
  clients on the leader's node;
- "hare classic": a durable classic queue on one Hare node;
- "rabbitmq quorum": RabbitMQ's own quorum queue, on the one RabbitMQ node answering on 5672
  (left out when none answers).
Each run: one publisher with confirms publishes `--count` persistent messages of `--size`
bytes (at most 1000 unconfirmed) - the confirmed publish rate; then one consumer (prefetch
1000, an ack every 100) drains them - the consume rate. Beside each rate: the brokers' CPU per
message (every node's process, from /proc), the machine's other load, and for the Hare quorum
queue the replication bytes per message (LOG frames its leader sent to its two followers)."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pamqp import commands

from hare_bench.local_cluster import DevCluster
from hare_perf.client import connect
from hare_perf.crew import Crew
from hare_perf.host import loadavg, machine_busy, process_cpu_s
from hare_perf.wire import parse_url
from hare_perf.workers import ConsumerSpec, PublisherSpec, consumer_main, publisher_main

__all__ = ["main"]

_TIMEOUT_S = 600.0
RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/"


@dataclass
class Target:
    label: str
    url: str
    pids: list[int]
    arguments: dict[str, Any]
    api: str = ""  # the management API of the node the clients use (Hare quorum: the leader)
    extra: dict[str, Any] = field(default_factory=dict)


async def _rpc(url: str, method: Any) -> Any:
    client = await connect(parse_url(url), timestamps=False)
    try:
        await client.open_channel(1)
        return await client.rpc(1, method, timeout=120.0)
    finally:
        await client.close()


def _shipped(target: Target, queue: str) -> int:
    if not target.api:
        return 0
    path = f"{target.api}/api/queues/%2F/{queue}"
    req = urllib.request.Request(path, headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(json.loads(resp.read()).get("log_bytes_shipped", 0))


async def run_once(target: Target, count: int, size: int) -> dict[str, float]:
    queue = f"bench-quorum.{time.monotonic_ns()}"
    await _rpc(target.url, commands.Queue.Declare(queue=queue, durable=True,
                                                  arguments=target.arguments))
    out: dict[str, float] = {}
    crew = Crew(_TIMEOUT_S)
    try:
        i = crew.start(publisher_main, PublisherSpec(
            target.url, "", [queue], count, size, _TIMEOUT_S, persistent=True, confirms=True,
            max_inflight=1000), "publisher")
        await crew.ready([i])
        cpu0, (busy0, _), wall0 = process_cpu_s(target.pids), machine_busy(), time.monotonic()
        shipped0 = _shipped(target, queue)
        crew.go([i])
        r = await crew.result(i)
        cpu1, (busy1, _), wall1 = process_cpu_s(target.pids), machine_busy(), time.monotonic()
        shipped1 = _shipped(target, queue)
        out["publish msg_s"] = r["confirmed"] / max((r["t_done"] - r["t_start"]) / 1e9, 1e-9)
        out["publish broker us/msg"] = (cpu1 - cpu0) / count * 1e6
        out["publish others cores"] = max(0.0, (busy1 - busy0 - (cpu1 - cpu0))
                                          / max(wall1 - wall0, 1e-9) - r["cpu_share"])
        if target.api:
            out["replication bytes/msg"] = (shipped1 - shipped0) / count
        j = crew.start(consumer_main, ConsumerSpec(target.url, [queue], [count], _TIMEOUT_S,
                                                   consume_on_go=True, timestamps=False),
                       "consumer")
        await crew.ready([j])
        cpu0, (busy0, _), wall0 = process_cpu_s(target.pids), machine_busy(), time.monotonic()
        crew.go([j])
        c = await crew.result(j)
        cpu1, (busy1, _), wall1 = process_cpu_s(target.pids), machine_busy(), time.monotonic()
        out["consume msg_s"] = c["delivered"] / max((c["t_last"] - c["t_go"]) / 1e9, 1e-9)
        out["consume broker us/msg"] = (cpu1 - cpu0) / count * 1e6
        out["consume others cores"] = max(0.0, (busy1 - busy0 - (cpu1 - cpu0))
                                          / max(wall1 - wall0, 1e-9) - c["cpu_share"])
    finally:
        await crew.close()
        await _rpc(target.url, commands.Queue.Delete(queue=queue))
    return out


def _rabbit() -> Target | None:
    try:
        pid = int(subprocess.run(["pgrep", "-x", "beam.smp"], capture_output=True, text=True,
                                 check=True).stdout.split()[0])
    except (subprocess.CalledProcessError, IndexError, ValueError, FileNotFoundError):
        return None
    return Target("rabbitmq quorum", RABBIT_URL, [pid], {"x-queue-type": "quorum"})


class _SingleNode:
    """One Hare node for the classic queue: its own data directory and port."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.root / "single.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "--port", str(self.port), "--data-dir",
             str(self.root / "single"), "--management-port", "0", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the single Hare node did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)


async def _measure(targets: list[Target], args: argparse.Namespace) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    for r in range(args.rounds):
        results.setdefault("loadavg", []).append(loadavg())
        order = targets[r % len(targets):] + targets[:r % len(targets)]
        for t in order:
            for key, value in (await run_once(t, args.count, args.size)).items():
                results.setdefault(f"{t.label}: {key}", []).append(value)
    results.setdefault("loadavg", []).append(loadavg())
    return results


def summary(results: dict[str, list[float]], labels: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                           for k, v in results.items()}
    base = "hare quorum x3"
    for other in labels:
        if other == base:
            continue
        for kind in ("publish", "consume"):
            ours, theirs = results[f"{base}: {kind} msg_s"], results[f"{other}: {kind} msg_s"]
            ratios = [a / max(b, 1e-9) for a, b in zip(ours, theirs, strict=True)]
            out[f"{kind}: quorum x3 / {other}"] = {
                "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hare_bench.bench_quorum")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--port", type=int, default=6350)
    parser.add_argument("--no-rabbitmq", action="store_true")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="hare-bench-quorum-"))
    cluster = DevCluster(root, 3, args.port, extra=["--log-level", "warning"])
    single = _SingleNode(root, args.port + 10)
    try:
        cluster.start()
        single.start()
        time.sleep(2)  # the links come up
        pids = [p.pid for p in cluster.nodes]
        leader_api = f"http://127.0.0.1:{10000 + args.port}"
        targets = [
            Target("hare quorum x3", cluster.amqp_url(0), pids, {"x-queue-type": "quorum"},
                   api=leader_api),
            Target("hare classic", f"amqp://guest:guest@127.0.0.1:{single.port}/",
                   [single.proc.pid] if single.proc else [], {}),
        ]
        rabbit = None if args.no_rabbitmq else _rabbit()
        if rabbit is not None:
            targets.append(rabbit)
        results = asyncio.run(_measure(targets, args))
    finally:
        single.stop()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    labels = [t.label for t in targets]
    print(json.dumps({"rounds": results, "summary": summary(results, labels),
                      "count": args.count, "size": args.size}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
