"""The processes that make load. Each worker runs its own uvloop, connects, gets ready, says
("ready", info) on its pipe, waits for "go", does a bounded amount of work (a count and a
deadline), and answers ("result", dict) or ("error", text). Timings are time.monotonic_ns(),
which is one clock for every process on the machine, so the orchestrator can subtract a
publisher's start from a consumer's last delivery."""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import uvloop
from pamqp import commands

from hare_perf.client import AmqpClient, BrokerClosed, connect
from hare_perf.wire import PublishBatch, encode_ack, parse_url

__all__ = [
    "ConsumerSpec",
    "IdleSpec",
    "PublisherSpec",
    "consumer_main",
    "idle_main",
    "publisher_main",
]

_TICK_S = 0.001  # pacing granularity: libuv timers have millisecond resolution


@dataclass(slots=True)
class PublisherSpec:
    url: str
    exchange: str
    routing_keys: list[str]
    count: int
    size: int
    timeout_s: float
    persistent: bool = False
    confirms: bool = False
    max_inflight: int = 1000
    rate: float = 0.0  # msg/s; 0 = as fast as the broker takes them
    wait_queue: str | None = None  # poll this queue's depth until `count` have landed
    batch_bytes: int = 65536
    duration_s: float = 0.0  # steady state: publish for this long from "go", count ignored


@dataclass(slots=True)
class ConsumerSpec:
    url: str
    queues: list[str]  # one connection (one channel, one consumer) per queue
    expected: list[int]  # deliveries to wait for on each queue
    timeout_s: float
    prefetch: int = 1000
    ack_every: int = 100
    consume_on_go: bool = False  # drain: start consuming only when told to
    timestamps: bool = True
    duration_s: float = 0.0  # steady state: count deliveries for this long from "go"
    arguments: dict[str, Any] | None = None  # basic.consume's (a stream's x-stream-offset)


@dataclass(slots=True)
class IdleSpec:
    url: str
    connections: int
    timeout_s: float
    parallel: int = 50  # handshakes in flight at once, so the listen backlog never overflows


def _run(pipe: Connection, body: Callable[[Connection], Awaitable[dict[str, Any]]]) -> None:
    try:
        result = uvloop.run(body(pipe))
        pipe.send(("result", result))
    except BaseException as exc:  # report anything, the orchestrator decides
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if not isinstance(exc, BrokerClosed | TimeoutError | OSError):
            detail += "\n" + traceback.format_exc()
        pipe.send(("error", detail))
    finally:
        pipe.close()


async def _ready_then_go(pipe: Connection, info: Any, timeout: float) -> None:
    """Tell the orchestrator we are ready, then wait for its go without blocking the loop."""
    pipe.send(("ready", info))
    loop = asyncio.get_running_loop()
    got: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not got.done():
            got.set_result(None)

    loop.add_reader(pipe.fileno(), readable)
    try:
        await asyncio.wait_for(got, timeout)
    finally:
        loop.remove_reader(pipe.fileno())
        # uvloop's add_reader made the fd non-blocking; the result may be MBs of latencies
        os.set_blocking(pipe.fileno(), True)
    message = pipe.recv()
    if message != "go":
        raise RuntimeError(f"orchestrator said {message!r}")


def _share(cpu0: float, wall0: float) -> float:
    """This process's CPU use since (cpu0, wall0), as a share of one core."""
    return (time.process_time() - cpu0) / max(time.monotonic() - wall0, 1e-9)


# -- publisher ----------------------------------------------------------------------------
def publisher_main(pipe: Connection, spec: PublisherSpec) -> None:
    _run(pipe, lambda p: _publisher(p, spec))


async def _publisher(pipe: Connection, spec: PublisherSpec) -> dict[str, Any]:
    url = parse_url(spec.url)
    deadline = time.monotonic() + spec.timeout_s
    client = await connect(url, timeout=30.0, timestamps=False)
    try:
        await client.open_channel(1)
        if spec.confirms:
            await client.rpc(1, commands.Confirm.Select())
        batch = PublishBatch(
            1,
            spec.exchange,
            spec.routing_keys,
            spec.size,
            spec.persistent,
            client.frame_max,
            spec.batch_bytes,
        )
        await _ready_then_go(pipe, None, spec.timeout_s)
        cpu0, wall0 = time.process_time(), time.monotonic()
        t_start = time.monotonic_ns()
        if spec.duration_s:
            return await _publish_steady(client, batch, spec, cpu0, wall0)
        await _publish(client, batch, spec, deadline)
        t_written = time.monotonic_ns()
        # A round trip on the publishing channel: its reply comes after the broker has taken
        # every publish before it. Without it, a close could time out while MBs of publishes
        # still sit in socket buffers, and the process would exit with them unsent.
        left = max(1.0, deadline - time.monotonic())
        await client.rpc(1, commands.Basic.Qos(prefetch_count=0), timeout=left)
        confirms = client.scanner.confirms
        if spec.confirms:
            while confirms.settled < spec.count:
                _check_deadline(deadline, f"confirms: {confirms.settled}/{spec.count}")
                await client.progress(min(1.0, max(0.0, deadline - time.monotonic())))
        if spec.wait_queue is not None:
            await _wait_depth(client, spec.wait_queue, spec.count, deadline)
        t_done = time.monotonic_ns()
        return {
            "published": spec.count,
            "t_start": t_start,
            "t_written": t_written,
            "t_done": t_done,
            "cpu_share": _share(cpu0, wall0),
            "confirmed": confirms.settled - confirms.nacked,
            "nacked": confirms.nacked,
            "blocked": client.blocked_count,
        }
    finally:
        await client.close(0.0 if spec.duration_s else 5.0)


def _check_deadline(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"publisher ran out of time ({what})")


async def _publish(
    client: AmqpClient, batch: PublishBatch, spec: PublisherSpec, deadline: float
) -> None:
    count = spec.count
    confirms = client.scanner.confirms
    sent = 0
    t0 = time.monotonic_ns()
    ns_per_msg = 1e9 / spec.rate if spec.rate else 0.0
    monotonic_ns = time.monotonic_ns
    while sent < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"publisher ran out of time ({sent}/{count} sent)")
        if not client.unblocked.is_set():
            # connection.blocked: not one more byte until connection.unblocked
            await asyncio.wait_for(client.unblocked.wait(), max(0.0, deadline - time.monotonic()))
            continue
        n = min(batch.size, count - sent)
        if spec.confirms:
            room = spec.max_inflight - (sent - confirms.settled)
            if room <= 0:
                await client.progress(min(1.0, max(0.0, deadline - time.monotonic())))
                continue
            n = min(n, room)
        now = monotonic_ns()
        if ns_per_msg:
            due = int((now - t0) / ns_per_msg) + 1 - sent
            if due <= 0:
                await asyncio.sleep(_TICK_S)
                continue
            n = min(n, due)
        client.write(batch.stamp(n, now))
        sent += n
        # TCP back-pressure: wait below the high-water mark; otherwise yield once so reads
        # (confirms, connection.blocked) are handled between batches
        await client.drain()
        await asyncio.sleep(0)
    client.check_open()


async def _publish_steady(
    client: AmqpClient, batch: PublishBatch, spec: PublisherSpec, cpu0: float, wall0: float
) -> dict[str, Any]:
    """Publish as fast as the broker takes them (TCP back-pressure, connection.blocked and,
    with confirms, at most max_inflight unconfirmed) until the window closes. The messages
    left in socket buffers at the end are the broker's to read or drop: the orchestrator
    deletes the queue and the connection closes without a round trip."""
    t_start = time.monotonic_ns()
    t_end = t_start + int(spec.duration_s * 1e9)
    confirms = client.scanner.confirms
    monotonic_ns = time.monotonic_ns
    sent = 0
    while True:
        now = monotonic_ns()
        if now >= t_end:
            break
        left = (t_end - now) / 1e9
        if not client.unblocked.is_set():
            try:
                await asyncio.wait_for(client.unblocked.wait(), left)
            except TimeoutError:
                break
            continue
        n = batch.size
        if spec.confirms:
            room = spec.max_inflight - (sent - confirms.settled)
            if room <= 0:
                await client.progress(min(left, 1.0))
                continue
            n = min(n, room)
        client.write(batch.stamp(n, now))
        sent += n
        if client.paused:
            try:
                await asyncio.wait_for(client.drain(), left)
            except TimeoutError:
                break
        else:
            await asyncio.sleep(0)
    client.check_open()
    return {
        "published": sent,
        "t_start": t_start,
        "t_done": monotonic_ns(),
        "cpu_share": _share(cpu0, wall0),
        "confirmed": confirms.settled - confirms.nacked,
        "nacked": confirms.nacked,
        "blocked": client.blocked_count,
    }


async def _wait_depth(client: AmqpClient, queue: str, count: int, deadline: float) -> None:
    """Without confirms, the broker has taken the messages when the queue holds them all: a
    passive declare on the publishing channel is answered after every earlier publish."""
    while True:
        reply = await client.rpc(1, commands.Queue.Declare(queue=queue, passive=True))
        assert isinstance(reply, commands.Queue.DeclareOk)
        if reply.message_count >= count:
            return
        _check_deadline(deadline, f"queue depth {reply.message_count}/{count}")
        await asyncio.sleep(0.002)


# -- consumer -----------------------------------------------------------------------------
def consumer_main(pipe: Connection, spec: ConsumerSpec) -> None:
    _run(pipe, lambda p: _consumer(p, spec))


class _Consumer:
    """One connection consuming one queue: acks `multiple` every `ack_every` deliveries and
    resolves `done` when it has what it expected."""

    def __init__(self, client: AmqpClient, expected: int, ack_every: int) -> None:
        self.client = client
        self.expected = expected
        self.ack_every = ack_every
        self.acked = 0
        self.t_first = 0
        self.t_last = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        client.on_data = self.on_data
        if expected == 0:
            self.done.set_result(None)

    def on_data(self) -> None:
        scanner = self.client.scanner
        delivered = scanner.delivered
        if not delivered:
            return
        if not self.t_first:
            self.t_first = time.monotonic_ns()
        self.t_last = time.monotonic_ns()
        tag = scanner.last_tag.get(1, 0)
        finished = delivered >= self.expected
        if tag - self.acked >= self.ack_every or (finished and tag > self.acked):
            self.client.write(encode_ack(1, tag, True))
            self.acked = tag
        if finished and not self.done.done():
            self.done.set_result(None)


async def _consumer(pipe: Connection, spec: ConsumerSpec) -> dict[str, Any]:
    url = parse_url(spec.url)
    deadline = time.monotonic() + spec.timeout_s
    clients: list[AmqpClient] = []
    consumers: list[_Consumer] = []
    try:
        for expected in spec.expected:
            client = await connect(url, timestamps=spec.timestamps)
            clients.append(client)
            await client.open_channel(1)
            await client.rpc(1, commands.Basic.Qos(prefetch_count=spec.prefetch))
            consumers.append(_Consumer(client, expected, spec.ack_every))

        async def subscribe() -> None:
            for client, queue in zip(clients, spec.queues, strict=True):
                await client.rpc(1, commands.Basic.Consume(queue=queue, consumer_tag="perf",
                                                           arguments=spec.arguments))

        if not spec.consume_on_go:
            await subscribe()
        await _ready_then_go(pipe, None, spec.timeout_s)
        cpu0, wall0 = time.process_time(), time.monotonic()
        t_go = time.monotonic_ns()
        if spec.consume_on_go:
            await subscribe()
        if spec.duration_s:
            return await _consume_steady(clients, consumers, spec.duration_s, t_go, cpu0, wall0)
        pending = [c.done for c in consumers] + [c.closed for c in clients]
        waiting = {c.done for c in consumers}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                got = sum(c.client.scanner.delivered for c in consumers)
                raise TimeoutError(f"consumer ran out of time ({got}/{sum(spec.expected)})")
            finished, _ = await asyncio.wait(
                pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            for fut in finished:
                if fut in waiting:
                    waiting.discard(fut)
                    pending.remove(fut)
                else:
                    fut.result()  # a closed connection: raise its reason
        t_last = max(c.t_last for c in consumers)
        latencies = b"".join(c.client.scanner.latencies_ns.tobytes() for c in consumers)
        return {
            "delivered": sum(c.client.scanner.delivered for c in consumers),
            "t_go": t_go,
            "t_first": min((c.t_first for c in consumers if c.t_first), default=t_go),
            "t_last": t_last,
            "latencies_ns": latencies,
            "cpu_share": _share(cpu0, wall0),
        }
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


async def _consume_steady(
    clients: list[AmqpClient],
    consumers: list[_Consumer],
    duration_s: float,
    t_go: int,
    cpu0: float,
    wall0: float,
) -> dict[str, Any]:
    """Consume until the window closes; what arrived by then is the figure (deliveries and
    their latencies), whatever the broker still holds."""
    closed = [c.closed for c in clients]
    finished, _ = await asyncio.wait(closed, timeout=duration_s)
    for fut in finished:
        fut.result()  # a connection the broker closed: raise its reason
    t_end = time.monotonic_ns()
    scanners = [c.client.scanner for c in consumers]
    return {
        "delivered": sum(s.delivered for s in scanners),
        "t_go": t_go,
        "t_last": t_end,
        "latencies_ns": b"".join(s.latencies_ns.tobytes() for s in scanners),
        "cpu_share": _share(cpu0, wall0),
    }


# -- idle connections ---------------------------------------------------------------------
def idle_main(pipe: Connection, spec: IdleSpec) -> None:
    _run(pipe, lambda p: _idle(p, spec))


async def _idle(pipe: Connection, spec: IdleSpec) -> dict[str, Any]:
    url = parse_url(spec.url)
    clients: list[AmqpClient] = []
    gate = asyncio.Semaphore(spec.parallel)

    async def one() -> None:
        async with gate:
            client = await connect(url, timeout=spec.timeout_s, timestamps=False)
            clients.append(client)
            await client.open_channel(1, timeout=spec.timeout_s)

    try:
        t0 = time.monotonic_ns()
        await asyncio.wait_for(
            asyncio.gather(*(one() for _ in range(spec.connections))), spec.timeout_s
        )
        t_open = time.monotonic_ns()
        await _ready_then_go(pipe, {"t0": t0, "t_open": t_open}, spec.timeout_s)
        alive = sum(1 for c in clients if not c.closed.done())
        return {"opened": len(clients), "alive": alive, "t0": t0, "t_open": t_open}
    finally:
        closing = [c.close(timeout=10.0) for c in clients]
        for start in range(0, len(closing), spec.parallel):
            await asyncio.gather(*closing[start : start + spec.parallel], return_exceptions=True)
