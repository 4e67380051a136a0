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

__all__ = ["QueueLoad", "RateMeter", "ram_targets"]

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


class RateMeter:
    """A message rate from a monotonic counter (say a queue's in_count + out_count), as an
    exponentially weighted average over samples: rate = a x latest + (1 - a) x previous."""

    __slots__ = ("_count", "_time", "rate", "smoothing")

    def __init__(self, smoothing: float = 0.5) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1]: {smoothing}")
        self.smoothing = smoothing
        self.rate = 0.0
        self._count: int | None = None
        self._time = 0.0

    def update(self, count: int, now: float) -> float:
        """Feed the counter's value at time `now` (seconds, monotonic); returns the rate."""
        if self._count is not None and now > self._time:
            latest = max(count - self._count, 0) / (now - self._time)
            self.rate = self.smoothing * latest + (1.0 - self.smoothing) * self.rate
        self._count, self._time = count, now
        return self.rate
