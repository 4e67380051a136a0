"""The concurrent path on a loop with no I/O (hare_bench/bench_pubsub.py): a publisher and a
consumer at full speed together, each loop iteration one socket read of publishes and the
consumer's acks. How the loop shares itself between ingress and egress is deterministic here,
so the queue's depth is an exact figure, not a timing."""

from __future__ import annotations

from pathlib import Path

from broker.queue.amqqueue import BUSY_BACKLOG
from hare_bench.bench_pubsub import run

PER_READ = 850  # 256 B publishes in one 256 KiB socket read


async def test_a_consumer_waiting_on_the_broker_keeps_the_queue_empty(tmp_path: Path) -> None:
    # prefetch 1000: an ack refills the consumer in the same iteration, so egress (1000 per
    # iteration) outruns one read of publishes; before acks refilled at once, each ack took
    # three iterations and the queue grew by ~550 messages every two
    r = await run(tmp_path, 20_000, PER_READ, 256, prefetch=1000, ack_every=100)
    assert r["depth_max"] <= PER_READ, r["depth_max"]


async def test_a_busy_queue_slows_its_publisher_to_its_consumer(tmp_path: Path) -> None:
    # prefetch 100: at most 100 deliveries per iteration against 850 publishes per read. The
    # queue grants credit only as it delivers once BUSY_BACKLOG are ready, so the depth stays
    # near that bound instead of growing by ~650 every two iterations (~14,000 at the end)
    r = await run(tmp_path, 20_000, PER_READ, 256, prefetch=100, ack_every=10)
    assert r["depth_max"] <= BUSY_BACKLOG + 2 * PER_READ, r["depth_max"]
    assert r["depth_mean"] >= BUSY_BACKLOG / 2, r["depth_mean"]  # and the consumer never starved


async def test_a_consumer_that_stalls_a_moment_still_holds_its_publisher_back(
    tmp_path: Path,
) -> None:
    # the consumer's process is descheduled for 40 iterations: it acks nothing, the queue
    # delivers nothing, and its publisher gets no credit meanwhile (BUSY_HOLD_S), so the
    # backlog stays where it was instead of growing by ~425 per iteration (~17,000)
    r = await run(tmp_path, 30_000, PER_READ, 256, prefetch=100, ack_every=10,
                  stall=(10_000, 40))
    assert r["depth_max"] <= BUSY_BACKLOG + 2 * PER_READ, r["depth_max"]
