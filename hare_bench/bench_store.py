"""Micro-benchmark of the message store: `python -m hare_bench.bench_store`.

Writes N bodies (yielding to the loop every `--burst` writes, as queues do), waits until every
one is confirmed durable, then reads them all back and removes them: three in four first, which
makes the store combine files, then the rest. Prints messages per second for each phase and
how many batches (fsyncs) the writes took."""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from pathlib import Path

import structlog

from broker.store.msg_store import MsgStore

__all__ = ["main"]


class _Counter:
    def __init__(self) -> None:
        self.durable = 0
        self.batches = 0
        self.done = asyncio.Event()
        self.target = 0

    def msgs_durable(self, msg_ids: list[int]) -> None:
        self.durable += len(msg_ids)
        self.batches += 1
        if self.durable >= self.target:
            self.done.set()

    def msgs_failed(self, msg_ids: list[int], error: OSError) -> None:
        raise SystemExit(f"write failed: {error}")


async def run(
    directory: Path, messages: int, size: int, fsync: str, burst: int
) -> dict[str, float]:
    store = MsgStore(directory, fsync=fsync)
    await store.start()
    client = _Counter()
    client.target = messages
    payload = b"x" * size
    t0 = time.perf_counter()
    for i in range(1, messages + 1):
        store.write(i, payload, client)
        if i % burst == 0:
            await asyncio.sleep(0)
    await client.done.wait()
    t_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(1, messages + 1):
        store.read(i)
    t_read = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.remove_many(i for i in range(1, messages + 1) if i % 4)  # 75% garbage: compaction
    await store.gc_idle()
    store.remove_many(range(4, messages + 1, 4))
    await store.gc_idle()
    t_remove = time.perf_counter() - t0
    stats = store.stats()
    await store.stop()
    return {
        "write_msgs_per_s": messages / t_write,
        "write_mib_per_s": messages * size / t_write / 2**20,
        "batches": client.batches,
        "read_msgs_per_s": messages / t_read,
        "remove_msgs_per_s": messages / t_remove,  # includes the compactions it caused
        "compactions": stats["compactions"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--fsync", choices=["always", "batch", "never"], default="batch")
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--dir", type=Path, default=None, help="default: a temporary directory")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        result = asyncio.run(run(Path(d), args.messages, args.size, args.fsync, args.burst))
    print(f"msg_store {args.messages} x {args.size} B, fsync={args.fsync}")
    for key, value in result.items():
        print(f"  {key:20s} {value:12,.0f}")


if __name__ == "__main__":
    main()
