"""bench_queue runs (so the micro-benchmark stays usable as the queue and channel change), and
its variants deliver as their features say: every message to the queue's consumers, all of
them to the higher-priority consumer, all to the single active one."""

from __future__ import annotations

import pytest

from hare_bench.bench_queue import BATCH, build, run


@pytest.mark.parametrize("variant", ["plain", "consumer-priorities", "sac", "priority-queue"])
def test_each_variant_runs(variant: str) -> None:
    assert run(variant, 2) > 0


@pytest.mark.parametrize(("variant", "shares"), [
    ("plain", [BATCH // 2, BATCH // 2]),
    ("consumer-priorities", [0, BATCH]),  # the second consumer has x-priority 1
    ("sac", [BATCH, 0]),  # the first consumer is the active one
])
def test_deliveries_follow_the_feature(variant: str, shares: list[int]) -> None:
    q, channels, items = build(variant)
    q._process([("pubs", None, items)])
    assert [len(ch.unacked) for ch in channels] == shares
