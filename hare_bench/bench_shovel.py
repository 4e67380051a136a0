"""Shovel throughput and delayed-message memory, in one run (docs/BENCHMARKS.md, "Shovels").

    python -m hare_bench.bench_shovel [--count 20000] [--size 256] [--delayed 1000000]

1. Throughput of a shovel moving `--count` persistent messages already in a durable queue, in
   on-confirm mode with prefetch 1000 (the plugin's default), queue to queue:
   Hare -> Hare and RabbitMQ -> Hare with Hare's shovel (defined on the destination Hare), and
   RabbitMQ -> RabbitMQ and RabbitMQ -> Hare with RabbitMQ's own shovel (rabbitmq_shovel,
   defined with rabbitmqctl), when a RabbitMQ answers on 127.0.0.1:5672 with guest/guest and
   rabbitmqctl is on the PATH. The rate counts from the first message seen at the destination
   to the last, so connection set-up and CLI start-up are left out for both.
2. RSS of a fresh Hare before and after `--delayed` persistent messages are held by an
   x-delayed-message exchange (x-delay one hour, so all are pending), beside a fresh Hare
   holding the same count in a plain durable queue.

Every figure is printed with the machine's one-minute load average beside it (the machine is
shared; compare figures of one run)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

from pamqp import body as pbody
from pamqp import commands, frame, header
from pamqp.common import FieldTable

from hare_perf.client import AmqpClient, connect
from hare_perf.host import loadavg, rss_kib
from hare_perf.wire import parse_url

RABBIT = "amqp://guest:guest@127.0.0.1:5672/%2F"
PREFETCH = 1000
_SETTLE_S = 5.0


class Hare:
    """A hare-server subprocess with its AMQP and management ports."""

    def __init__(self, data: Path) -> None:
        with socket.socket() as s:  # management port 0 means no management listener
            s.bind(("127.0.0.1", 0))
            mgmt_port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "--port", "0", "--data-dir", str(data),
             "--management-host", "127.0.0.1", "--management-port", str(mgmt_port),
             "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        ports = []
        for line in self.proc.stdout:
            if "listening on port" in line:
                ports.append(int(line.rsplit(" ", 1)[1]))
                if len(ports) == 2:
                    break
        self.port, self.mgmt_port = ports
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def put_shovel(self, name: str, value: dict[str, object] | None) -> None:
        """Define the shovel; None: delete it."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.mgmt_port}/api/parameters/shovel/%2F/{name}",
            data=None if value is None else json.dumps({"value": value}).encode(),
            method="PUT" if value is not None else "DELETE",
            headers={"content-type": "application/json",
                     "authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
        urllib.request.urlopen(req, timeout=10).close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


async def _client(url: str) -> AmqpClient:
    client = await connect(parse_url(url))
    await client.open_channel(1)
    return client


async def depth(url: str, queue: str) -> int:
    client = await _client(url)
    try:
        ok = await client.rpc(1, commands.Queue.Declare(queue=queue, durable=True), 600)
        assert isinstance(ok, commands.Queue.DeclareOk)
        return ok.message_count or 0
    finally:
        await client.close()


def _publishes(exchange: str, key: str, size: int, count: int,
               headers: FieldTable | None) -> bytes:
    props = commands.Basic.Properties(delivery_mode=2, headers=headers)
    one = b"".join((
        frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=key), 1),
        frame.marshal(header.ContentHeader(0, size, props), 1),
        frame.marshal(pbody.ContentBody(bytes(size)), 1)))
    return one * count


async def fill(url: str, queue: str, count: int, size: int, *, exchange: str = "",
               headers: FieldTable | None = None) -> None:
    """`count` persistent messages published through `exchange` (to `queue` by the default
    exchange); returns once the channel has handled them all (a declare after them)."""
    client = await _client(url)
    await client.rpc(1, commands.Queue.Declare(queue=queue, durable=True))
    batch = _publishes(exchange, queue, size, 500, headers)
    sent = 0
    while sent < count:
        n = min(500, count - sent)
        client.write(batch if n == 500 else _publishes(exchange, queue, size, n, headers))
        sent += n
        await client.drain()
    await client.rpc(1, commands.Queue.Declare(queue=queue, passive=True), 600)
    await client.close()


async def timed_move(dest_url: str, queue: str, count: int,
                     start: Callable[[], None]) -> tuple[float, float]:
    """(messages/s from the first arrival to the last, load average meanwhile)."""
    start()
    first: float | None = None
    async with asyncio.timeout(600):
        while True:
            n = await depth(dest_url, queue)
            now = time.monotonic()
            if first is None and n > 0:
                first, first_n = now, n
            if n >= count:
                break
            await asyncio.sleep(0.05)
    assert first is not None
    moved = count - first_n
    return (moved / (now - first) if now > first else float("inf")), loadavg()


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


def rabbit_shovel(name: str, src_queue: str, dest_uri: str, dest_queue: str) -> None:
    rabbitmqctl("set_parameter", "shovel", name, json.dumps({
        "src-uri": "amqp://", "src-queue": src_queue, "dest-uri": dest_uri,
        "dest-queue": dest_queue, "ack-mode": "on-confirm", "src-prefetch-count": PREFETCH}))


async def delete_queue(url: str, queue: str) -> None:
    client = await _client(url)
    await client.rpc(1, commands.Queue.Delete(queue=queue))
    await client.close()


async def rabbit_answers() -> bool:
    if shutil.which("rabbitmqctl") is None:
        return False
    try:
        await (await _client(RABBIT)).close()
        return True
    except Exception:
        return False


async def throughput(tmp: Path, count: int, size: int) -> None:
    print(f"shovel throughput: {count:,} persistent x {size} B, on-confirm, prefetch {PREFETCH}")
    src, dest = Hare(tmp / "src"), Hare(tmp / "dest")
    try:
        runs: list[tuple[str, str, str, Callable[[], None]]] = [
            ("Hare -> Hare, Hare's shovel", src.url, "b.hh", lambda: dest.put_shovel(
                "hh", {"src-uri": src.url, "src-queue": "b.hh", "dest-uri": "amqp://",
                       "dest-queue": "b.hh", "src-prefetch-count": PREFETCH}))]
        if await rabbit_answers():
            hare_from_rabbit = f"amqp://guest:guest@127.0.0.1:{dest.port}/%2F"
            runs += [
                ("RabbitMQ -> Hare, Hare's shovel", RABBIT, "b.rh", lambda: dest.put_shovel(
                    "rh", {"src-uri": RABBIT, "src-queue": "b.rh", "dest-uri": "amqp://",
                           "dest-queue": "b.rh", "src-prefetch-count": PREFETCH})),
                ("RabbitMQ -> RabbitMQ, RabbitMQ's shovel", RABBIT, "b.rr",
                 lambda: rabbit_shovel("bench-rr", "b.rr", "amqp://", "b.rr.dest")),
                ("RabbitMQ -> Hare, RabbitMQ's shovel", RABBIT, "b.rh2",
                 lambda: rabbit_shovel("bench-rh", "b.rh2", hare_from_rabbit, "b.rh2")),
            ]
        else:
            print("  (no RabbitMQ with rabbitmqctl on 127.0.0.1:5672: its rows are left out)")
        for label, src_url, queue, start in runs:
            await fill(src_url, queue, count, size)
            dest_url, dest_queue = (RABBIT, "b.rr.dest") if queue == "b.rr" else (dest.url,
                                                                                   queue)
            rate, load = await timed_move(dest_url, dest_queue, count, start)
            print(f"  {label:42} {rate:9,.0f} msg/s   load {load:.2f}")
            if queue in ("b.rr", "b.rh2"):  # the shovel is gone before its queues
                rabbitmqctl("clear_parameter", "shovel",
                            "bench-rr" if queue == "b.rr" else "bench-rh")
            else:
                dest.put_shovel("hh" if queue == "b.hh" else "rh", None)
            await asyncio.sleep(1)
            for url, q in {(src_url, queue), (dest_url, dest_queue)}:
                await delete_queue(url, q)
    finally:
        src.stop()
        dest.stop()


async def held(tmp: Path, name: str, count: int, size: int,
               setup: Callable[[str], Awaitable[None]], exchange: str,
               headers: FieldTable | None) -> None:
    hare = Hare(tmp / name)
    try:
        await setup(hare.url)
        time.sleep(_SETTLE_S)
        before, load_before = rss_kib(hare.proc.pid), loadavg()
        t0 = time.monotonic()
        await fill(hare.url, "held", count, size, exchange=exchange, headers=headers)
        fill_s = time.monotonic() - t0
        time.sleep(_SETTLE_S)
        after, load_after = rss_kib(hare.proc.pid), loadavg()
        print(f"  {name:34} RSS {before / 1024:6.0f} -> {after / 1024:6.0f} MiB "
              f"(+{(after - before) / count * 1024:.0f} B/message; filled in {fill_s:.0f} s)"
              f"   load {load_before:.2f} -> {load_after:.2f}")
    finally:
        hare.stop()


async def delayed_memory(tmp: Path, count: int, size: int) -> None:
    print(f"memory: {count:,} persistent x {size} B held")

    async def delayed_exchange(url: str) -> None:
        client = await _client(url)
        await client.rpc(1, commands.Exchange.Declare(
            exchange="delayed", exchange_type="x-delayed-message", durable=True,
            arguments={"x-delayed-type": "direct"}))
        await client.rpc(1, commands.Queue.Declare(queue="held", durable=True))
        await client.rpc(1, commands.Queue.Bind(queue="held", exchange="delayed",
                                                routing_key="held"))
        await client.close()

    async def plain_queue(url: str) -> None:
        client = await _client(url)
        await client.rpc(1, commands.Queue.Declare(queue="held", durable=True))
        await client.close()

    await held(tmp, "x-delayed-message, x-delay 1 h", count, size, delayed_exchange, "delayed",
               {"x-delay": 3_600_000})
    await held(tmp, "plain durable queue", count, size, plain_queue, "", None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--delayed", type=int, default=1_000_000)
    ap.add_argument("--delayed-size", type=int, default=100)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.count:
            asyncio.run(throughput(Path(tmp), args.count, args.size))
        if args.delayed:
            asyncio.run(delayed_memory(Path(tmp), args.delayed, args.delayed_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
