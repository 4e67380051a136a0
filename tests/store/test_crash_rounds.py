"""kill -9 at random moments while a publisher sends persistent messages with confirms to
durable queues and a consumer acks: after each restart every confirmed message is either in its
queue exactly once, in order, or was acked by the consumer before the crash."""

from __future__ import annotations

import asyncio
import random

import aio_pika
import pytest
from aio_pika import DeliveryMode, ExchangeType, Message

pytestmark = pytest.mark.asyncio

QUEUES = ("crash-a", "crash-b")


async def _setup(url: str) -> None:
    conn = await aio_pika.connect(url)
    ch = await conn.channel()
    x = await ch.declare_exchange("crash-x", ExchangeType.FANOUT, durable=True)
    for name in QUEUES:
        q = await ch.declare_queue(name, durable=True)
        await q.bind(x)
    await conn.close()


async def _publisher(url: str, start: int, confirmed: set[int], size: int) -> None:
    conn = await aio_pika.connect(url)
    ch = await conn.channel(publisher_confirms=True)
    x = await ch.get_exchange("crash-x")
    pad = b"p" * size
    n = start

    async def one(i: int) -> None:
        await x.publish(Message(b"%08d" % i + pad, delivery_mode=DeliveryMode.PERSISTENT), "")
        confirmed.add(i)

    while True:  # until the broker dies under us
        await asyncio.gather(*(one(i) for i in range(n, n + 50)))
        n += 50


async def _consumer(url: str, acked: set[int]) -> None:
    conn = await aio_pika.connect(url)
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=20)
    q = await ch.declare_queue(QUEUES[0], durable=True)
    async with q.iterator() as it:
        async for m in it:
            # noted before the ack goes out: a kill may land after the broker took the ack
            # but before this task would run again
            acked.add(int(m.body[:8]))
            await m.ack()


async def _drain(url: str, name: str) -> list[int]:
    conn = await aio_pika.connect(url)
    ch = await conn.channel()
    q = await ch.declare_queue(name, durable=True)
    out = []
    while (m := await q.get(fail=False, no_ack=True)) is not None:
        out.append(int(m.body[:8]))
    await conn.close()
    return out


@pytest.mark.parametrize("size", [200, 6000])  # bodies in the index / in the msg_store
async def test_kill_9_rounds_lose_no_confirmed_message(fresh_broker, size):
    rng = random.Random(size)
    fresh_broker.start()
    await _setup(fresh_broker.url)
    start = 0
    for _ in range(3):
        confirmed: set[int] = set()
        acked: set[int] = set()
        tasks = [
            asyncio.create_task(_publisher(fresh_broker.url, start, confirmed, size)),
            asyncio.create_task(_consumer(fresh_broker.url, acked)),
        ]
        # the random moment counts from the round's first confirm: with the suite in several
        # processes and two workers a broker, connecting and declaring alone took longer than
        # a fixed 0.3-1.2 s window, and the kill came before anything was confirmed
        for _ in range(600):
            if confirmed or all(t.done() for t in tasks):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(rng.uniform(0.0, 0.9))
        fresh_broker.kill()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert confirmed, "the round confirmed nothing: the kill came too early"
        fresh_broker.start()
        for name in QUEUES:
            left = await _drain(fresh_broker.url, name)
            assert len(left) == len(set(left)), f"{name}: duplicates after restart"
            assert left == sorted(left), f"{name}: order broken after restart"
            consumed = acked if name == QUEUES[0] else set()
            missing = confirmed - set(left) - consumed
            assert not missing, f"{name}: {len(missing)} confirmed messages lost"
        start += 1_000_000  # ids of the next round never collide with this one's
