"""A clock that counts event-loop iterations, for decisions whose natural unit is "one turn of
the loop" rather than seconds (how long a machine takes for a turn depends on its load).

Reading it schedules one callback for the next iteration, which advances it; nobody reading
means nothing scheduled, so an idle broker does not spin. Two reads in the same iteration
see the same value; a read one iteration later sees it advanced by one (approximately: a
read during the ready callbacks may run before or after the advancing callback)."""

from __future__ import annotations

import asyncio

__all__ = ["TICKS", "LoopTicks"]


class LoopTicks:
    __slots__ = ("_armed", "now")

    def __init__(self) -> None:
        self.now = 0
        self._armed: asyncio.AbstractEventLoop | None = None  # the loop our advance is due on

    def read(self) -> int:
        """The current iteration's number (it keeps advancing while someone reads)."""
        loop = asyncio._get_running_loop()
        if loop is None:  # no loop (a queue driven by hand, as in bench_queue): no iterations
            return self.now
        if self._armed is not loop:  # a loop that closed with our callback due never runs it
            self._armed = loop
            loop.call_soon(self._advance)
        return self.now

    def _advance(self) -> None:
        self.now += 1
        self._armed = None


TICKS = LoopTicks()  # one event loop per broker process: one clock
