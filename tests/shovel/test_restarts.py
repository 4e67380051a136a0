"""Either side of a shovel killed (kill -9) and restarted while it moves persistent messages in
on-confirm mode: the shovel shows the failure, reconnects, and every message the source had
confirmed reaches the destination. Duplicates are allowed only for what was in flight (at most
the prefetch count: delivered, published, maybe confirmed, not yet acked at the source); each
test counts them and asserts that bound.

The shovel runs on the broker that is not killed, so what is tested is the reconnect of both
of its connections, not the restart of the shovel with its node (tests/shovel/test_shovel.py
has that)."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import aio_pika
import pytest

from tests.mgmt.helpers import MgmtBroker
from tests.plugin_helpers import queue_depth
from tests.shovel.test_shovel import _shovel, _state

pytestmark = pytest.mark.asyncio

COUNT = 4000
PREFETCH = 100


async def _publish_confirmed(url: str, queue: str, count: int) -> None:
    """`count` persistent messages, each confirmed by the broker (so on disk) before return."""
    async with await aio_pika.connect(url) as conn:
        ch = await conn.channel()  # confirms on: publish returns once confirmed
        await ch.declare_queue(queue, durable=True)
        for start in range(0, count, 200):
            await asyncio.gather(*(ch.default_exchange.publish(
                aio_pika.Message(b"%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                queue) for i in range(start, min(start + 200, count))))


async def _all_bodies(url: str, queue: str, at_least: int, timeout: float = 120.0
                      ) -> list[bytes]:
    """Everything in the queue once it holds at least `at_least` and stops growing."""
    async with asyncio.timeout(timeout):
        while await queue_depth(url, queue) < at_least:
            await asyncio.sleep(0.2)
        last = -1
        while (depth := await queue_depth(url, queue)) != last:  # late duplicates land too
            last = depth
            await asyncio.sleep(1.0)
    got: list[bytes] = []
    async with await aio_pika.connect(url) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue(queue, durable=True)
        while (msg := await q.get(no_ack=True, fail=False)) is not None:
            got.append(msg.body)
    return got


async def _depth_or_0(url: str, queue: str) -> int:
    try:
        return await queue_depth(url, queue)
    except aio_pika.exceptions.ChannelNotFoundEntity:  # the shovel has not declared it yet
        return 0


async def _kill_mid_move(victim: MgmtBroker, dest: MgmtBroker, queue: str) -> None:
    """kill -9 once a quarter of the messages have arrived, then start it again on its port."""
    async with asyncio.timeout(60):
        while await _depth_or_0(dest.url, queue) < COUNT // 4:
            await asyncio.sleep(0.02)
    assert victim.proc is not None
    victim.proc.kill()
    victim.proc.wait()
    victim.proc = None


def _check(bodies: list[bytes], name: str) -> int:
    counts = collections.Counter(bodies)
    missing = [i for i in range(COUNT) if counts[b"%d" % i] == 0]
    assert not missing, f"{len(missing)} confirmed messages lost, first {missing[:5]}"
    duplicates = len(bodies) - COUNT
    print(f"\n{name}: {COUNT} moved, {duplicates} duplicates (prefetch {PREFETCH})")
    assert duplicates <= PREFETCH
    return duplicates


def _definition(src: str, dest: str, queue: str) -> dict[str, object]:
    return {"src-uri": src, "src-queue": queue, "dest-uri": dest, "dest-queue": queue,
            "ack-mode": "on-confirm", "src-prefetch-count": PREFETCH, "reconnect-delay": 0.5}


@pytest.mark.parametrize("killed", ["source", "destination"])
async def test_one_side_killed_and_restarted(tmp_path: Path, killed: str) -> None:
    """The shovel runs on the side that survives (on dest pulling from src, or on src
    pushing to dest); the other side is killed mid-move and started again."""
    src = MgmtBroker(tmp_path / "src").start()
    dest = MgmtBroker(tmp_path / "dest").start()
    queue = f"r{killed[0]}.q"
    try:
        await _publish_confirmed(src.url, queue, COUNT)
        if killed == "source":
            host, victim = dest, src
            _shovel(host, "move", _definition(src.url, "amqp://", queue))
        else:
            host, victim = src, dest
            _shovel(host, "move", _definition("amqp://", dest.url, queue))
        await _kill_mid_move(victim, dest, queue)
        await _state(host, "move", lambda r: r["state"] != "running")
        victim.start()
        await _state(host, "move", lambda r: r["state"] == "running", timeout=60)
        _check(await _all_bodies(dest.url, queue, COUNT), f"{killed} killed")
        assert await queue_depth(src.url, queue) == 0
    finally:
        dest.stop()
        src.stop()
