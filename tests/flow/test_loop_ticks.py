"""LoopTicks counts loop iterations while it is read, and schedules nothing otherwise."""

from __future__ import annotations

import asyncio

from broker.flow.loop_ticks import LoopTicks


async def test_reads_in_one_iteration_agree_and_the_next_iteration_is_one_more() -> None:
    ticks = LoopTicks()
    first = ticks.read()
    assert ticks.read() == first
    await asyncio.sleep(0)
    assert ticks.read() == first + 1
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert ticks.read() == first + 2  # unread iterations are not counted: nothing ran


def test_a_clock_armed_on_a_loop_that_closed_runs_on_the_next() -> None:
    ticks = LoopTicks()
    loop = asyncio.new_event_loop()
    try:
        loop.call_soon(ticks.read)  # arms an advance for the next iteration...
        loop.call_soon(loop.stop)  # ...which never comes
        loop.run_forever()
    finally:
        loop.close()

    async def two_iterations() -> tuple[int, int]:
        before = ticks.read()
        await asyncio.sleep(0)
        return before, ticks.read()

    before, after = asyncio.run(two_iterations())
    assert after == before + 1
