"""From memory pressure to per-queue RAM targets, the job rabbit_memory_monitor does.

Rule: with the monitor's fraction f (the share of RAM messages to keep), the broker-wide
budget is f x (sum of the queues' RAM message counts). Each queue gets a part of that budget
proportional to its message rate (ingress + egress per second), so busy queues keep their
messages in RAM and idle ones page out; with no rates at all, in proportion to what each
holds. f >= 1.0 lifts every target (None = unlimited)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["QueueLoad", "ram_targets"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class QueueLoad:
    ram_msg_count: int
    rate: float  # messages in + out per second, a recent average


def ram_targets(loads: Mapping[K, QueueLoad], fraction: float) -> dict[K, int | None]:
    """target RAM message count for every queue in `loads` (never more than the budget)."""
    if fraction >= 1.0:
        return dict.fromkeys(loads)
    budget = int(max(fraction, 0.0) * sum(q.ram_msg_count for q in loads.values()))
    total_rate = sum(max(q.rate, 0.0) for q in loads.values())
    if total_rate > 0:
        weights = {k: max(q.rate, 0.0) / total_rate for k, q in loads.items()}
    else:
        held = sum(q.ram_msg_count for q in loads.values())
        n = len(loads)
        weights = {k: (q.ram_msg_count / held if held else 1 / n) for k, q in loads.items()}
    return {k: int(budget * w) for k, w in weights.items()}
