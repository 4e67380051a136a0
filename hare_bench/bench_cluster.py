"""Cluster figures for docs/BENCHMARKS.md, on a private etcd and two local nodes.

    python -m hare_bench.bench_cluster --rounds 5

1. Aggregate throughput of `--pairs` load generators (hare-perf's raw-socket workers, each
   publisher and each consumer a process of its own, all released together by one "go"),
   every pair on a queue of its own: all against hare-1 ("1 node": its queues all there) or
   alternately against hare-1 and hare-2 ("2 nodes": each queue on the node its clients use,
   client-local). The clients are the same in both set-ups; only the broker side differs.
   Loads: publish-only (`--count` messages a publisher; rate = all messages over the first
   start to the last publisher's round trip) and steady (a publisher and a consumer a queue at
   full speed for `--duration` s; rate = deliveries a second). Rounds alternate the order of
   the two set-ups, so a busy machine hurts both alike (`--wait-quiet S` first waits for a
   quiet second, as hare-perf's option does). Each run records the cores used by
   each node's process, by the clients, and by everything else on the machine (others'
   work), from /proc, over the measuring window: is a core the limit, and whose?
2. The cost of the link: broker CPU (both nodes, from /proc) per message for a publish to a
   queue on the node the publisher uses against one forwarded to the other node, and for a
   delivery to a consumer on the queue's node against one on the other node."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pamqp import commands

from hare_bench.local_cluster import DevCluster
from hare_perf.client import connect
from hare_perf.crew import Crew
from hare_perf.host import loadavg, machine_busy, process_cpu_s, wait_quiet
from hare_perf.wire import parse_url
from hare_perf.workers import ConsumerSpec, PublisherSpec, consumer_main, publisher_main

__all__ = ["main"]

_TIMEOUT_S = 300.0
LOADS = ("publish-only", "steady")


class _Snapshot:
    """Wall clock, each node's CPU and the machine's busy time at one instant."""

    def __init__(self, pids: list[int]) -> None:
        self.wall = time.monotonic()
        self.nodes = [process_cpu_s([pid]) for pid in pids]
        self.busy, self.irq = machine_busy()


async def _queues(cluster: DevCluster, homes: list[int], delete: list[str] | None = None,
                  ) -> list[str]:
    """Declare one queue a generator, each through (so homed on) its node; or delete them."""
    names = delete or [f"bench-cluster.{time.monotonic_ns()}.{i}" for i in range(len(homes))]
    for node in sorted(set(homes)):
        client = await connect(parse_url(cluster.amqp_url(node)), timestamps=False)
        try:
            await client.open_channel(1)
            for name, home in zip(names, homes, strict=True):
                if home != node:
                    continue
                method = (commands.Queue.Delete(queue=name) if delete
                          else commands.Queue.Declare(queue=name))
                await client.rpc(1, method, timeout=120.0)
        finally:
            await client.close()
    return names


async def _landed(cluster: DevCluster, homes: list[int], names: list[str],
                  expected: int) -> int:
    """Messages the queues hold, waited for (10 s at most) until `expected` have landed: a
    publish-only rate counts only messages the brokers took."""
    deadline = time.monotonic() + 10.0
    while True:
        total = 0
        for name, home in zip(names, homes, strict=True):
            client = await connect(parse_url(cluster.amqp_url(home)), timestamps=False)
            try:
                await client.open_channel(1)
                reply = await client.rpc(1, commands.Queue.Declare(queue=name, passive=True))
                assert isinstance(reply, commands.Queue.DeclareOk)
                total += int(reply.message_count)
            finally:
                await client.close()
        if total >= expected or time.monotonic() > deadline:
            return total
        await asyncio.sleep(0.1)


async def aggregate(cluster: DevCluster, homes: list[int], load: str, count: int, size: int,
                    duration_s: float) -> dict[str, float]:
    """One run: a generator per entry of `homes` (the node its clients connect to and its
    queue lives on), all started at once. Returns msg/s and the cores each party used."""
    urls = [cluster.amqp_url(h) for h in homes]
    names = await _queues(cluster, homes)
    crew = Crew(_TIMEOUT_S)
    try:
        pubs = [crew.start(publisher_main,
                           PublisherSpec(u, "", [q], count, size, _TIMEOUT_S,
                                         duration_s=duration_s if load == "steady" else 0.0),
                           f"publisher-{i}")
                for i, (u, q) in enumerate(zip(urls, names, strict=True))]
        cons = [] if load != "steady" else [
            crew.start(consumer_main, ConsumerSpec(u, [q], [1 << 62], _TIMEOUT_S,
                                                   timestamps=False, duration_s=duration_s),
                       f"consumer-{i}")
            for i, (u, q) in enumerate(zip(urls, names, strict=True))]
        await crew.ready()
        pids = [p.pid for p in cluster.nodes]
        before = _Snapshot(pids)
        crew.go()
        rps = [await crew.result(i) for i in pubs]
        rcs = [await crew.result(i) for i in cons]
        after = _Snapshot(pids)
    finally:
        await crew.close()
    if load == "steady":
        window = max(max(r["t_last"] for r in rcs) - min(r["t_go"] for r in rcs), 1) / 1e9
        rate = sum(r["delivered"] for r in rcs) / window
        landed = float(sum(r["delivered"] for r in rcs))
    else:
        window = max(max(r["t_done"] for r in rps) - min(r["t_start"] for r in rps), 1) / 1e9
        rate = count * len(rps) / window
        landed = float(await _landed(cluster, homes, names, count * len(rps)))
    wall = max(after.wall - before.wall, 1e-9)
    nodes = [(a - b) / wall for a, b in zip(after.nodes, before.nodes, strict=True)]
    clients = sum(r["cpu_share"] for r in (*rps, *rcs))
    machine = (after.busy - before.busy) / wall
    irq = (after.irq - before.irq) / wall
    await _queues(cluster, homes, delete=names)
    return {"msg_s": rate, "messages": landed,
            **{f"hare-{i + 1} cores": c for i, c in enumerate(nodes)},
            "clients cores": clients, "irq cores": irq,
            "others cores": max(0.0, machine - sum(nodes) - clients)}


async def _publish(url: str, queue: str, count: int, size: int) -> None:
    crew = Crew(_TIMEOUT_S)
    try:
        i = crew.start(publisher_main, PublisherSpec(url, "", [queue], count, size, _TIMEOUT_S,
                                                     confirms=True), "publisher")
        await crew.ready([i])
        crew.go([i])
        await crew.result(i)
    finally:
        await crew.close()


async def _consume(url: str, queue: str, count: int) -> None:
    crew = Crew(_TIMEOUT_S)
    try:
        i = crew.start(consumer_main, ConsumerSpec(url, [queue], [count], _TIMEOUT_S,
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
        [queue] = await _queues(cluster, [1])  # homed on hare-2 either way
        await asyncio.sleep(0.5)  # hare-1 learns of it through etcd
        before = process_cpu_s(pids)
        await _publish(pub_url, queue, count, size)
        out[f"publish_{label}_us"] = (process_cpu_s(pids) - before) / count * 1e6
        before = process_cpu_s(pids)
        await _consume(con_url, queue, count)
        out[f"deliver_{label}_us"] = (process_cpu_s(pids) - before) / count * 1e6
        await _queues(cluster, [1], delete=[queue])
    return out


async def _measure(cluster: DevCluster, args: argparse.Namespace) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}

    def keep(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    setups = {"1 node": [0] * args.pairs, "2 nodes": [i % 2 for i in range(args.pairs)]}
    for r in range(args.rounds):
        keep("loadavg", loadavg())
        for load in LOADS:
            if args.wait_quiet > 0:
                keep(f"{load} others before", await wait_quiet(None, args.wait_quiet))
            order = list(setups.items())
            if r % 2:
                order.reverse()
            for label, homes in order:
                run = await aggregate(cluster, homes, load, args.count, args.size,
                                      args.duration)
                for key, value in run.items():
                    keep(f"{load} {label} {key}", value)
        for key, value in (await link_cost(cluster, args.link_count, args.size)).items():
            keep(key, value)
    keep("loadavg", loadavg())
    return results


def summary(results: dict[str, list[float]]) -> dict[str, Any]:
    """Medians (with min and max) of every figure; the 2-node/1-node ratio of each round's
    pair of runs and of the medians; forwarded/local CPU ratios."""
    out: dict[str, Any] = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                           for k, v in results.items()}
    for load in LOADS:
        one, two = results[f"{load} 1 node msg_s"], results[f"{load} 2 nodes msg_s"]
        ratios = [b / max(a, 1e-9) for a, b in zip(one, two, strict=True)]
        out[f"{load} ratio"] = {
            "of medians": statistics.median(two) / max(statistics.median(one), 1e-9),
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    for kind in ("publish", "deliver"):
        out[f"{kind} forwarded/local"] = (statistics.median(results[f"{kind}_forwarded_us"])
                                          / max(statistics.median(results[f"{kind}_local_us"]),
                                                1e-9))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hare_bench.bench_cluster")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=2,
                        help="load generators (a publisher, and for steady a consumer, each "
                             "a process) on a queue each; spread over the nodes in turn")
    parser.add_argument("--count", type=int, default=200_000,
                        help="publish-only: messages a publisher")
    parser.add_argument("--duration", type=float, default=10.0, help="steady: seconds")
    parser.add_argument("--link-count", type=int, default=100_000,
                        help="link cost: messages a measure")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--port", type=int, default=5780)
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                        help="before each pair of runs wait up to S seconds for a second in "
                             "which other processes use under 0.2 cores")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="hare-bench-cluster-"))
    cluster = DevCluster(root, 2, args.port, extra=["--log-level", "warning"])
    try:
        cluster.start()
        time.sleep(2)  # the link comes up
        results = asyncio.run(_measure(cluster, args))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"rounds": results, "summary": summary(results)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
