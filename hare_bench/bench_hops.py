"""Micro-benchmark: loop iterations from a publish's read to its delivery's write.

Run: .venv/bin/python -m hare_bench.bench_hops [--rounds N] [--per-read K]

A Node runs in this process; a publishing and a consuming Reader get stand-in transports (as in
bench_pubsub). Each round hands the publisher K publishes in one read, then lets the loop go
round until the consumer's transport has been written to, counting the iterations; the
consumer acks every 100. At a low rate (hare-perf's `latency` row: five publishes a
millisecond) every iteration between the read and the write is an epoll_wait and a task step,
and a point where the machine may run something else, so the count is the deterministic part of
the broker's latency: 3 on main before issue 23's goal 2, 1 after it (docs/BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import uvloop
from pamqp import commands

from broker.config import Settings
from broker.logs import configure_logging
from broker.node import Node
from broker.protocol import frames
from hare_bench.bench_pubsub import QUEUE, _connect, _Recorder
from hare_bench.bench_reader import _Transport
from hare_perf.wire import encode_ack

__all__ = ["main", "run"]


async def run(data_dir: Path, rounds: int,
              per_read: int) -> tuple[list[int], list[int], list[bool]]:
    """(iterations, ns) per round, from the read to the first write to the consumer, and
    whether the read woke the queue's task (a turn it would spend finding nothing to do,
    since the read's callback already gave the queue its publishes)."""
    settings = Settings(data_dir=data_dir, port=0, management_port=0, heartbeat_s=0)
    node = Node(settings)
    await node.start()
    try:
        pt, ct = _Transport(), _Recorder()
        pub = await _connect(node, pt, commands.Queue.Declare(queue=QUEUE))
        con = await _connect(
            node,
            ct,
            commands.Basic.Qos(prefetch_count=1000),
            commands.Basic.Consume(queue=QUEUE, consumer_tag="bench"),
        )
        ct.take()
        mailbox = node.vhosts["/"].queue(QUEUE).mailbox  # type: ignore[attr-defined]
        one = b"".join(
            [
                frames.encode_method(1, commands.Basic.Publish(exchange="", routing_key=QUEUE)),
                *frames.encode_content(1, b"\x00\x00", bytes(256), 131072),
            ]
        )
        hops: list[int] = []
        times: list[int] = []
        woken: list[bool] = []
        tag = 0
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            pub.data_received(one * per_read)
            woken.append(not mailbox.idle)
            n = 0
            while not ct.out:
                await asyncio.sleep(0)
                n += 1
                if n > 1000:
                    raise RuntimeError("no delivery written")
            times.append(time.perf_counter_ns() - t0)
            hops.append(n)
            ct.take()
            tag += per_read
            if tag % 100 < per_read:
                con.data_received(encode_ack(1, tag, True))
            for _ in range(3):  # let everything settle before the next read
                await asyncio.sleep(0)
        pub.connection_lost(None)
        con.connection_lost(None)
        return hops, times, woken
    finally:
        await node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--per-read", type=int, default=5, help="publishes per socket read")
    args = parser.parse_args()
    configure_logging("warning", "console")
    with tempfile.TemporaryDirectory() as d:
        hops, times, woken = uvloop.run(run(Path(d), args.rounds, args.per_read))
    print(
        f"{args.rounds} reads of {args.per_read} publishes: loop iterations from read to "
        f"write min {min(hops)} median {statistics.median(hops):g} max {max(hops)}; "
        f"median {statistics.median(times) / 1000:.1f} us (in-process, no sockets); the "
        f"queue's task woken by {sum(woken)} of the reads"
    )


if __name__ == "__main__":
    main()
