"""Memory a consumer costs (docs/BENCHMARKS.md, "Consumers of another worker's queue"): N
consumers on one connection of worker B, first of a queue on B, then of a queue on worker A,
with connection placement off so the second set crosses; each worker's RSS (/api/nodes
mem_used) before and after.

    python -m hare_bench.bench_consumer_memory --consumers 5000"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pika

from hare_bench.server import Server, hare_server

__all__ = ["main"]


def _rss(broker: Server) -> dict[str, int]:
    return {str(n["name"]): int(n["mem_used"]) for n in broker.api("/api/nodes")}


def _node_of(broker: Server, queue: str) -> str:
    return next(str(q["node"]) for q in broker.api("/api/queues") if q["name"] == queue)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hare_bench.bench_consumer_memory")
    parser.add_argument("--consumers", type=int, default=5000)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="hare-consumer-memory-"))
    n = args.consumers
    try:
        with hare_server(root / "data", ["--workers", "2", "--connection-placement=false",
                                         "--queue-master-locator=client-local"]) as broker:
            url = broker.url + "%2F?heartbeat=0"
            conns: dict[str, pika.BlockingConnection] = {}  # one connection on each worker
            for i in itertools.count():
                conn = pika.BlockingConnection(pika.URLParameters(url))
                conn.channel().queue_declare(f"probe-{i}", exclusive=True)
                conns.setdefault(_node_of(broker, f"probe-{i}"), conn)
                if len(conns) == 2:
                    break
            (home, at_home), (near, consuming) = sorted(conns.items())
            at_home.channel().queue_declare("far")
            consuming.channel().queue_declare("near")
            for queue, label in (("near", "on its own worker"), ("far", "of the other worker")):
                ch = consuming.channel()
                time.sleep(1)
                before = _rss(broker)
                for _ in range(n):
                    ch.basic_consume(queue, lambda *_: None)
                time.sleep(2)
                after = _rss(broker)
                grown = [(after[w] - before[w]) / n for w in (home, near)]
                print(f"a consumer of a queue {label}: queue's worker +{grown[0]:,.0f} B, "
                      f"consumer's worker +{grown[1]:,.0f} B, both {sum(grown):,.0f} B",
                      flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
