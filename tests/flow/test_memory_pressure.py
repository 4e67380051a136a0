"""ram_targets: the broker-wide RAM budget split among queues."""

from __future__ import annotations

import pytest

from broker.flow.memory_pressure import QueueLoad, RateMeter, ram_targets


def test_no_pressure_lifts_all_targets() -> None:
    assert ram_targets({"a": QueueLoad(10, 1.0)}, 1.0) == {"a": None}


def test_budget_split_by_rate() -> None:
    loads = {"busy": QueueLoad(600, 300.0), "idle": QueueLoad(400, 0.0), "mid": QueueLoad(0, 100.0)}
    targets = ram_targets(loads, 0.5)
    assert targets == {"busy": 375, "idle": 0, "mid": 125}
    assert sum(t or 0 for t in targets.values()) <= 500


def test_without_rates_split_by_what_each_holds() -> None:
    targets = ram_targets({"a": QueueLoad(300, 0.0), "b": QueueLoad(100, 0.0)}, 0.5)
    assert targets == {"a": 150, "b": 50}


def test_empty_queues_get_nothing() -> None:
    assert ram_targets({"a": QueueLoad(0, 0.0), "b": QueueLoad(0, 0.0)}, 0.1) == {"a": 0, "b": 0}


def test_rate_meter_averages_counter_deltas() -> None:
    meter = RateMeter(smoothing=0.5)
    assert meter.update(100, now=10.0) == 0.0  # first sample: no interval yet
    assert meter.update(300, now=12.0) == pytest.approx(50.0)  # 100/s, halved with 0
    assert meter.update(300, now=12.0) == pytest.approx(50.0)  # no time passed: unchanged
    assert meter.update(500, now=14.0) == pytest.approx(75.0)


def test_rate_meter_rejects_bad_smoothing() -> None:
    with pytest.raises(ValueError):
        RateMeter(smoothing=0.0)
