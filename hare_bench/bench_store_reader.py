"""Rows/s of the offline store reader: fill durable queues with persistent messages, stop the
broker (SIGTERM, or kill -9 with --kill), then read the data directory with
spark.read.format("hare-store") on local[2] into Spark's no-op sink (every column of every row
materialised). Needs the spark extra; pyspark is imported only here, inside main().

    python -m hare_bench.bench_store_reader [--count 200000] [--size 100] [--queues 4]

Bodies below 4096 bytes (encoded) are embedded in the queue index; above, in the msg_store."""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
import time
from pathlib import Path

from hare_bench.bench_recovery import fill_queue, start_broker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=200_000, help="messages in all")
    ap.add_argument("--size", type=int, default=100, help="body bytes")
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--kill", action="store_true", help="stop with kill -9 (dirty store)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from broker.spark.local import local_session

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        proc, port, _ = start_broker(data)
        per_queue = args.count // args.queues
        t0 = time.monotonic()
        for n in range(args.queues):
            asyncio.run(fill_queue(port, per_queue, args.size, f"q{n}"))
        fill_s = time.monotonic() - t0
        if args.kill:
            time.sleep(2)  # let the last index batch reach the disk
            proc.send_signal(signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGTERM)
        proc.wait()
        spark = local_session("bench-store-reader", Path(tmp) / "spark", driver_memory="1g")
        times = []
        try:
            for _ in range(args.runs):
                t0 = time.monotonic()
                df = spark.read.format("hare-store").load(str(data))
                df.write.format("noop").mode("overwrite").save()
                times.append(time.monotonic() - t0)
            rows = spark.read.format("hare-store").load(str(data)).count()
        finally:
            spark.stop()
    total = per_queue * args.queues
    assert rows == total, (rows, total)
    best = min(times)
    print(f"messages {total:,} x {args.size} B in {args.queues} queue(s), filled in "
          f"{fill_s:.1f} s, stopped with {'kill -9' if args.kill else 'SIGTERM'}")
    print(f"read: {', '.join(f'{t:.2f}' for t in times)} s -> {total / best:,.0f} rows/s, "
          f"{total * args.size / best / 1e6:,.1f} MB/s of bodies (best run)")


if __name__ == "__main__":
    main()
