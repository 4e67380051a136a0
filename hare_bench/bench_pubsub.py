"""Micro-benchmark: one publisher and one consumer at full speed together, without sockets.

Run: .venv/bin/python -m hare_bench.bench_pubsub [--messages N] [--per-read K] [--size B]

A Node runs in this process; two Readers get stand-in transports. Every loop iteration the
driver plays both clients the way the socket layer would: it hands the publishing Reader the
next K publishes (what one socket read brings, unless credit flow paused reading), reads what
the broker wrote to the consuming connection, and answers with a multiple basic.ack every
`--ack-every` deliveries (prefetch `--prefetch`), as a client that is never the bottleneck.
So the run shows, deterministically, how the loop shares itself between ingress and egress:
the queue's depth per iteration (`--trace`), its maximum, and the iterations a message takes.

With no I/O the run is repeatable, so instruction counts compare changes to the whole
concurrent path (publish, route, enqueue, deliver, ack):

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python -m hare_bench.bench_pubsub --messages 50000
    (the "Collected" line; subtract a --messages 0 run for the start-up)"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
from pamqp import commands

from broker.config import Settings
from broker.logs import configure_logging
from broker.node import Node
from broker.protocol import frames
from broker.server.reader import Reader
from hare_bench.bench_reader import _Transport, handshake_frames
from hare_perf.scanner import FrameScanner
from hare_perf.wire import encode_ack

__all__ = ["main", "run"]

QUEUE = "bench-pubsub"


class _Recorder(_Transport):
    """A transport that keeps what the broker wrote, for the driver to read back."""

    def __init__(self) -> None:
        super().__init__()
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        super().write(data)
        self.out.append(data)

    def take(self) -> bytes:
        out, self.out = self.out, []
        return b"".join(out)


async def _connect(node: Node, transport: _Transport, *methods: Any) -> Reader:
    reader = Reader(node)
    reader.connection_made(transport)  # type: ignore[arg-type]
    for chunk in handshake_frames(*methods):
        reader.data_received(chunk)
        for _ in range(5):
            await asyncio.sleep(0)
    return reader


async def run(
    data_dir: Path,
    messages: int,
    per_read: int,
    size: int,
    prefetch: int = 1000,
    ack_every: int = 100,
    stall: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """`stall` = (after this many deliveries, this many iterations): the consumer stops
    acking for a while once, as a client process that the machine descheduled."""
    settings = Settings(data_dir=data_dir, port=0, management_port=0, heartbeat_s=0)
    node = Node(settings)
    await node.start()
    try:
        pt, ct = _Transport(), _Recorder()
        pub = await _connect(node, pt, commands.Queue.Declare(queue=QUEUE))
        con = await _connect(
            node,
            ct,
            commands.Basic.Qos(prefetch_count=prefetch),
            commands.Basic.Consume(queue=QUEUE, consumer_tag="bench"),
        )
        queue = node.vhosts["/"].queues[QUEUE]
        ct.take()
        one = b"".join(
            [
                frames.encode_method(1, commands.Basic.Publish(exchange="", routing_key=QUEUE)),
                *frames.encode_content(1, b"\x00\x00", bytes(size), 131072),
            ]
        )
        read = one * per_read
        scanner = FrameScanner(timestamps=False)
        sent = acked = iterations = 0
        depths: list[int] = []
        reads = 0
        started = time.perf_counter()
        while scanner.delivered < messages:
            iterations += 1
            if iterations > 100 * (messages // max(1, per_read) + 100):
                raise RuntimeError(f"stuck: {scanner.delivered}/{messages} delivered")
            if sent < messages and not pt.paused:
                n = min(per_read, messages - sent)
                pub.data_received(read if n == per_read else one * n)
                sent += n
                reads += 1
            stalled = stall[1] and scanner.delivered >= stall[0] and stall[1] > 0
            if stalled:
                stall = (stall[0], stall[1] - 1)
            data = b"" if stalled else ct.take()
            if data:
                scanner.feed(data)
                tag = scanner.last_tag.get(1, 0)
                done = scanner.delivered >= messages
                if tag - acked >= ack_every or (done and tag > acked):
                    con.data_received(encode_ack(1, tag, True))
                    acked = tag
            depths.append(len(queue.bq))
            await asyncio.sleep(0)
        elapsed = time.perf_counter() - started
        publishing = depths[: max(1, len(depths) - 1)]
        pub.connection_lost(None)
        con.connection_lost(None)
        return {
            "messages": messages,
            "elapsed_s": elapsed,
            "iterations": iterations,
            "reads": reads,
            "depth_max": max(publishing, default=0),
            "depth_mean": sum(publishing) / max(1, len(publishing)),
            "depths": depths,
        }
    finally:
        await node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--per-read", type=int, default=850, help="publishes per socket read")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--ack-every", type=int, default=100)
    parser.add_argument("--trace", action="store_true", help="print the depth per iteration")
    args = parser.parse_args()
    configure_logging("warning", "console")
    with tempfile.TemporaryDirectory() as d:
        r = uvloop.run(
            run(Path(d), args.messages, args.per_read, args.size, args.prefetch, args.ack_every)
        )
    if args.trace:
        print(" ".join(str(d) for d in r["depths"]))
    if args.messages:
        print(
            f"{args.messages} messages of {args.size} B, {args.per_read} per read: "
            f"{r['elapsed_s']:.3f} s ({r['elapsed_s'] / args.messages * 1e9:.0f} ns/msg), "
            f"{r['iterations']} iterations, {r['reads']} reads, queue depth max "
            f"{r['depth_max']} mean {r['depth_mean']:.0f}"
        )


if __name__ == "__main__":
    main()
