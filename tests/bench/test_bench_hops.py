"""Loop iterations from a read of publishes to the write of their deliveries
(hare_bench/bench_hops.py), on a loop with no I/O: an exact count, not a timing."""

from __future__ import annotations

from pathlib import Path

from broker.server.reader import INLINE_PUBLISHES
from hare_bench.bench_hops import run


async def test_a_small_read_is_delivered_at_the_next_iteration(tmp_path: Path) -> None:
    # the latency row's five publishes a read: the channel (publish_now) and the queue (drain)
    # take them in the read's callback, and the writer flushes at the next iteration; through
    # the channel task and the queue task it took three
    hops, _, _ = await run(tmp_path, 50, 5)
    assert set(hops) == {1}


async def test_a_small_read_does_not_wake_the_idle_queue_task(tmp_path: Path) -> None:
    # the read's callback hands the publishes to the queue itself (QueueType.publish_now):
    # waking its task too would spend an empty turn ahead of the writers' flush
    _, _, woken = await run(tmp_path, 50, 5)
    assert not any(woken)


async def test_a_big_read_still_goes_through_the_channel_task(tmp_path: Path) -> None:
    hops, _, _ = await run(tmp_path, 20, INLINE_PUBLISHES + 1)
    assert set(hops) == {3}
