"""Start-up time after a crash: fill a durable queue with N persistent messages, kill -9 the
broker, start it again and time it until it accepts connections; report seconds and the peak
RSS (VmHWM) of the recovering process.

    python -m hare_bench.bench_recovery [--count 1000000] [--size 100]

Small bodies are embedded in the queue index; with --size above 4096 they go to the
msg_store instead."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pamqp import commands

from hare_perf.client import connect
from hare_perf.wire import PublishBatch, parse_url

__all__ = ["fill_queue", "start_broker"]


def start_broker(data: Path) -> tuple[subprocess.Popen[str], int, float]:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "--port", "0", "--data-dir", str(data),
         "--management-port", "0", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on port" in line:
            return proc, int(line.rsplit(" ", 1)[1]), time.monotonic() - t0
    raise RuntimeError("broker did not start")


def _hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def fill_queue(port: int, count: int, size: int,
                     queue: str = "recovery-q") -> None:
    client = await connect(parse_url(f"amqp://guest:guest@127.0.0.1:{port}/"))
    await client.open_channel(1)
    await client.rpc(1, commands.Queue.Declare(queue=queue, durable=True))
    batch = PublishBatch(1, "", [queue], size, True, client.frame_max)
    sent = 0
    while sent < count:
        n = min(batch.size, count - sent)
        client.write(batch.stamp(n, 0))
        sent += n
        await client.drain()
    ok = await client.rpc(1, commands.Queue.Declare(queue=queue, passive=True), 600)
    assert ok.message_count == count, ok.message_count
    await client.close()


async def _depth(port: int) -> int:
    client = await connect(parse_url(f"amqp://guest:guest@127.0.0.1:{port}/"))
    await client.open_channel(1)
    ok = await client.rpc(1, commands.Queue.Declare(queue="recovery-q", passive=True), 600)
    await client.close()
    return int(ok.message_count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        proc, port, _ = start_broker(data)
        t0 = time.monotonic()
        asyncio.run(fill_queue(port, args.count, args.size))
        fill_s = time.monotonic() - t0
        time.sleep(2)  # let the last index batch reach the disk
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc, port, start_s = start_broker(data)
        depth = asyncio.run(_depth(port))
        hwm = _hwm_mb(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        proc, port, clean_s = start_broker(data)
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    print(f"messages {args.count:,} x {args.size} B persistent, filled in {fill_s:.1f} s")
    print(f"dirty start (kill -9): {start_s:.2f} s to accept connections, "
          f"{depth:,} messages recovered, peak RSS {hwm:.0f} MB")
    print(f"clean start after SIGTERM: {clean_s:.2f} s")


if __name__ == "__main__":
    main()
