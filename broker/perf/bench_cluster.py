"""Cluster figures for docs/BENCHMARKS.md, on a private etcd and two local nodes.

    python -m broker.perf.bench_cluster --rounds 3

1. Aggregate throughput, two load generators (hare-perf processes) at once: both against
   hare-1 ("1 node": its queues all there) or one per node ("2 nodes": each queue on the node
   its client uses). Rounds alternate the two set-ups, so a busy machine hurts both alike.
2. The cost of the link: broker CPU (both nodes, from /proc) per message for a publish to a
   queue on the node the publisher uses against one forwarded to the other node, and for a
   delivery to a consumer on the queue's node against one on the other node."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pamqp import commands

from broker.perf.client import connect
from broker.perf.local_cluster import DevCluster
from broker.perf.scenarios import _Crew
from broker.perf.wire import parse_url
from broker.perf.workers import ConsumerSpec, PublisherSpec, consumer_main, publisher_main

__all__ = ["main"]

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def _hare_perf(url: str, scenario: str, count: int, size: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "broker.perf.cli", "--url", url, scenario, "--count", str(count),
         "--size", str(size), "--json"], stdout=subprocess.PIPE, text=True)


def aggregate(urls: list[str], scenario: str, count: int, size: int,
              pids: list[int]) -> tuple[float, list[float]]:
    """Messages per second summed over one hare-perf per URL, started together, and the
    share of a core each node's process used meanwhile (is the broker the bottleneck?)."""
    before = [_cpu([pid]) for pid in pids]
    start = time.monotonic()
    procs = [_hare_perf(u, scenario, count, size) for u in urls]
    total = 0.0
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        total += float(json.loads(out)[0]["median"]["msg_s"])
    wall = time.monotonic() - start
    return total, [(_cpu([pid]) - b) / wall for pid, b in zip(pids, before, strict=True)]


async def _declare(url: str, queue: str, delete: bool = False) -> None:
    client = await connect(parse_url(url), timestamps=False)
    try:
        await client.open_channel(1)
        if delete:
            await client.rpc(1, commands.Queue.Delete(queue=queue))
        else:
            await client.rpc(1, commands.Queue.Declare(queue=queue))
    finally:
        await client.close()


async def _publish(url: str, queue: str, count: int, size: int) -> None:
    crew = _Crew(300.0)
    try:
        i = crew.start(publisher_main, PublisherSpec(url, "", [queue], count, size, 300.0,
                                                     confirms=True), "publisher")
        await crew.ready([i])
        crew.go([i])
        await crew.result(i)
    finally:
        await crew.close()


async def _consume(url: str, queue: str, count: int) -> None:
    crew = _Crew(300.0)
    try:
        i = crew.start(consumer_main, ConsumerSpec(url, [queue], [count], 300.0,
                                                   timestamps=False), "consumer")
        await crew.ready([i])
        crew.go([i])
        await crew.result(i)
    finally:
        await crew.close()


async def link_cost(cluster: DevCluster, count: int, size: int) -> dict[str, float]:
    """Broker CPU microseconds per message (both nodes), local against forwarded."""
    pids = [p.pid for p in cluster.nodes]
    home, far = cluster.amqp_url(1), cluster.amqp_url(0)
    out: dict[str, float] = {}
    for label, pub_url, con_url in (("local", home, home), ("forwarded", far, far)):
        queue = f"bench-cluster.{label}.{time.monotonic_ns()}"
        await _declare(home, queue)  # homed on hare-2 either way
        await asyncio.sleep(0.5)  # hare-1 learns of it through etcd
        before = _cpu(pids)
        await _publish(pub_url, queue, count, size)
        out[f"publish_{label}_us"] = (_cpu(pids) - before) / count * 1e6
        before = _cpu(pids)
        await _consume(con_url, queue, count)
        out[f"deliver_{label}_us"] = (_cpu(pids) - before) / count * 1e6
        await _declare(home, queue, delete=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.perf.bench_cluster")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=100_000, help="messages per generator")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--port", type=int, default=5780)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="hare-bench-cluster-"))
    cluster = DevCluster(root, 2, args.port, extra=["--log-level", "warning"])
    results: dict[str, list[float]] = {}
    try:
        cluster.start()
        time.sleep(2)  # the link comes up
        one = [cluster.amqp_url(0)] * 2
        two = [cluster.amqp_url(0), cluster.amqp_url(1)]
        for r in range(args.rounds):
            for scenario in ("publish-only", "pubsub"):
                order = [("1 node", one), ("2 nodes", two)]
                if r % 2:
                    order.reverse()
                pids = [p.pid for p in cluster.nodes]
                for label, urls in order:
                    rate, cores = aggregate(urls, scenario, args.count, args.size, pids)
                    results.setdefault(f"{scenario} {label}", []).append(rate)
                    for i, share in enumerate(cores):
                        results.setdefault(f"{scenario} {label} hare-{i + 1} cores",
                                           []).append(share)
            for key, value in asyncio.run(link_cost(cluster, args.count // 2,
                                                    args.size)).items():
                results.setdefault(key, []).append(value)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    medians: dict[str, Any] = {k: statistics.median(v) for k, v in results.items()}
    for scenario in ("publish-only", "pubsub"):
        medians[f"{scenario} ratio"] = (medians[f"{scenario} 2 nodes"]
                                        / max(medians[f"{scenario} 1 node"], 1e-9))
    for kind in ("publish", "deliver"):
        medians[f"{kind} forwarded/local"] = (medians[f"{kind}_forwarded_us"]
                                              / max(medians[f"{kind}_local_us"], 1e-9))
    print(json.dumps({"rounds": results, "median": medians}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
