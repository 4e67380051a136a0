"""Exchange federation between two Hare brokers on this machine: publish N messages to the
upstream's exchange and time them until all are in the downstream's queue (no consumer, so
only the link's work is measured), with the CPU seconds each broker spent meanwhile (a figure
that other load on the machine disturbs less than the rate).

    python -m hare_bench.bench_federation [--count 20000] [--size 100] [--ack-mode on-confirm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

from pamqp import commands

from hare_perf.client import AmqpClient, connect
from hare_perf.wire import PublishBatch, parse_url

__all__ = ["main"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Broker:
    def __init__(self, data: Path, name: str) -> None:
        self.mgmt = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "--port", "0", "--data-dir", str(data),
             "--management-host", "127.0.0.1", "--management-port", str(self.mgmt),
             "--node-name", name, "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        self.port = 0
        for line in self.proc.stdout:
            if "listening on port" in line and not line.startswith("hare-management"):
                self.port = int(line.rsplit(" ", 1)[1])
            if line.startswith("hare-management listening"):
                break
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def api(self, method: str, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.mgmt}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"content-type": "application/json",
                     "authorization": "Basic " + b64encode(b"guest:guest").decode()})
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def cpu_s(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


async def _client(b: _Broker) -> AmqpClient:
    client = await connect(parse_url(b.url))
    await client.open_channel(1)
    return client


async def _declare(b: _Broker) -> None:
    client = await _client(b)
    await client.rpc(1, commands.Exchange.Declare(exchange="bench.fed", exchange_type="direct",
                                                  durable=True))
    await client.rpc(1, commands.Queue.Declare(queue="bench.fed.q", durable=True))
    await client.rpc(1, commands.Queue.Bind(queue="bench.fed.q", exchange="bench.fed",
                                            routing_key="k"))
    await client.close()


async def _depth(client: AmqpClient) -> int:
    ok = await client.rpc(1, commands.Queue.Declare(queue="bench.fed.q", passive=True))
    return int(ok.message_count)


async def _until(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.1)


async def _run(up: _Broker, down: _Broker, count: int, size: int, ack_mode: str) -> None:
    for b in (up, down):
        await _declare(b)
    down.api("PUT", "/api/parameters/federation-upstream/%2F/up",
             {"value": {"uri": up.url, "ack-mode": ack_mode}})
    down.api("PUT", "/api/policies/%2F/bench", {"pattern": "^bench\\.fed$", "definition": {
        "federation-upstream": "up"}, "apply-to": "exchanges"})
    await _until(lambda: [r["status"] for r in down.api("GET", "/api/federation-links")]
                 == ["running"])
    await _until(lambda: any(r["destination"].startswith("federation: ") for r in up.api(
        "GET", "/api/exchanges/%2F/bench.fed/bindings/source")))
    publisher, watcher = await _client(up), await _client(down)
    cpu0 = (up.cpu_s(), down.cpu_s())
    t0 = time.monotonic()
    batch = PublishBatch(1, "bench.fed", ["k"], size, True, publisher.frame_max)
    sent = 0
    while sent < count:
        n = min(batch.size, count - sent)
        publisher.write(batch.stamp(n, 0))
        sent += n
        await publisher.drain()
    published = time.monotonic() - t0
    while await _depth(watcher) < count:
        await asyncio.sleep(0.05)
    elapsed = time.monotonic() - t0
    cpu = (up.cpu_s() - cpu0[0], down.cpu_s() - cpu0[1])
    await publisher.close()
    await watcher.close()
    load = os.getloadavg()
    print(f"ack-mode {ack_mode}, {count:,} x {size} B persistent: published in "
          f"{published:.1f} s, all in the downstream queue after {elapsed:.1f} s "
          f"({count / elapsed:,.0f} msg/s)")
    print(f"CPU: upstream {cpu[0]:.1f} s, downstream (broker + link) {cpu[1]:.1f} s = "
          f"{cpu[1] / count * 1e6:.0f} us per message; load average {load[0]:.1f} on "
          f"{os.cpu_count()} CPUs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--ack-mode", default="on-confirm",
                    choices=("on-confirm", "on-publish", "no-ack"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        up = _Broker(Path(tmp) / "up", "bench-up")
        down = _Broker(Path(tmp) / "down", "bench-down")
        try:
            asyncio.run(_run(up, down, args.count, args.size, args.ack_mode))
        finally:
            down.stop()
            up.stop()


if __name__ == "__main__":
    main()
