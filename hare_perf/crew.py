"""Worker orchestration: a crew of worker processes (publishers, consumers, idle
connections) started together, released together by one "go" and always reaped, and the
control connection that declares a run's queues and exchanges under fresh names and deletes
them afterwards. hare-perf's scenarios and hare_bench's cluster benchmarks both drive
workers through these."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from pamqp import commands

from hare_perf.client import AmqpClient, connect
from hare_perf.wire import parse_url

__all__ = ["Control", "Crew", "with_control"]

# spawn, not fork: the caller may be inside a running event loop (pytest, the broker's own
# tests), and a forked child would inherit that loop's state
_MP = multiprocessing.get_context("spawn")


async def _recv(conn: Connection, timeout: float) -> tuple[str, Any]:
    """A pipe message without blocking the loop (a broker may be running on this loop)."""
    loop = asyncio.get_running_loop()
    if not conn.poll():
        ready: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(conn.fileno(), readable)
        try:
            await asyncio.wait_for(ready, timeout)
        finally:
            loop.remove_reader(conn.fileno())
            # uvloop's add_reader made the fd non-blocking; recv below must wait for it all
            os.set_blocking(conn.fileno(), True)
    try:
        message: tuple[str, Any] = conn.recv()
    except EOFError:
        return ("error", "worker exited without a word")
    return message


class Crew:
    """The worker processes of one run: started together, released together, always reaped."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.members: list[tuple[BaseProcess, Connection, str]] = []

    def start(self, target: Callable[[Connection, Any], None], spec: Any, role: str) -> int:
        parent, child = _MP.Pipe()
        proc = _MP.Process(target=target, args=(child, spec), name=f"hare-perf-{role}")
        proc.start()
        child.close()
        self.members.append((proc, parent, role))
        return len(self.members) - 1

    async def _expect(self, index: int, kind: str) -> Any:
        _, conn, role = self.members[index]
        what, payload = await _recv(conn, self.timeout_s + 30.0)
        if what == "error":
            raise RuntimeError(f"{role}: {payload}")
        if what != kind:
            raise RuntimeError(f"{role}: expected {kind}, got {what}")
        return payload

    async def ready(self, indexes: list[int] | None = None) -> list[Any]:
        indexes = list(range(len(self.members))) if indexes is None else indexes
        return [await self._expect(i, "ready") for i in indexes]

    def go(self, indexes: list[int] | None = None) -> None:
        indexes = list(range(len(self.members))) if indexes is None else indexes
        for i in indexes:
            self.members[i][1].send("go")

    async def result(self, index: int) -> dict[str, Any]:
        result: dict[str, Any] = await self._expect(index, "result")
        return result

    async def close(self) -> None:
        for proc, conn, _ in self.members:
            deadline = time.monotonic() + 10.0
            while proc.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if proc.is_alive():
                proc.terminate()
            proc.join(5.0)
            conn.close()
        self.members.clear()


class Control:
    """Declares and (always) deletes a run's queues and exchanges, under unique names."""

    def __init__(self, client: AmqpClient, scenario: str) -> None:
        self.client = client
        self.prefix = f"hare-perf.{scenario}.{uuid.uuid4().hex[:8]}"
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    async def queue(self, suffix: str = "q", durable: bool = False) -> str:
        name = f"{self.prefix}.{suffix}"
        await self.client.rpc(1, commands.Queue.Declare(queue=name, durable=durable))
        self.queues.append(name)
        return name

    async def stream(self, suffix: str = "s") -> str:
        name = f"{self.prefix}.{suffix}"
        await self.client.rpc(1, commands.Queue.Declare(
            queue=name, durable=True, arguments={"x-queue-type": "stream"}))
        self.queues.append(name)
        return name

    async def exchange(self, kind: str, suffix: str = "x") -> str:
        name = f"{self.prefix}.{suffix}"
        await self.client.rpc(1, commands.Exchange.Declare(exchange=name, exchange_type=kind))
        self.exchanges.append(name)
        return name

    async def bind(self, queue: str, exchange: str, key: str) -> None:
        await self.client.rpc(
            1, commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=key)
        )

    async def depth(self, queue: str) -> int:
        reply = await self.client.rpc(1, commands.Queue.Declare(queue=queue, passive=True))
        assert isinstance(reply, commands.Queue.DeclareOk)
        return int(reply.message_count)

    async def cleanup(self) -> None:
        for queue in self.queues:
            await self.client.rpc(1, commands.Queue.Delete(queue=queue), timeout=120.0)
        for exchange in self.exchanges:
            await self.client.rpc(1, commands.Exchange.Delete(exchange=exchange))


async def with_control(
    url: str, timeout_s: float, scenario: str,
    body: Callable[[Control, Crew], Awaitable[dict[str, float]]],
) -> dict[str, float]:
    """Run `body` with a control connection and a crew; the crew is reaped and what the
    control declared deleted, however `body` ends."""
    client = await connect(parse_url(url), timestamps=False)
    crew = Crew(timeout_s)
    try:
        await client.open_channel(1)
        control = Control(client, scenario)
        try:
            return await body(control, crew)
        finally:
            await crew.close()
            if not client.closed.done():
                await control.cleanup()
    finally:
        await client.close()
