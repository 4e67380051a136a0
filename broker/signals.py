"""SIGTERM and SIGINT at every stage of a hare-server's life, start-up included.

Python-level handlers from the start of main, for the whole run: a signal is noted at once,
even while the event loop is held by synchronous work (a queue index read back at start), and
the running loop's `Stop` is woken with it. Before the loop runs (settings, the data
directory's lock and layout) nothing is under way that a stop would have to undo, and a layout
half moved must not be cut short, so the note is all. Once the loop runs, the start-up (the
checkpoints of Node.start, the supervisor's wait for its workers) and the serving broker watch
the same `Stop`: a process told to stop while it is still starting stops cleanly - its
membership left, its stores closed - instead of dying by the signal's default action."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import TypeVar

__all__ = ["STOP_SIGNALS", "Stop", "note_signals", "unless_stopped"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []
_wakers: list[Callable[[], None]] = []

T = TypeVar("T")


def _note(signum: int, _frame: FrameType | None) -> None:
    # runs between two bytecodes of whatever the main thread does: only a note and a
    # thread-safe wake-up here, the loop sets the event in its own time
    _received.append(signum)
    for wake in _wakers:
        with contextlib.suppress(RuntimeError):  # its loop closed already
            wake()


def note_signals() -> None:
    """From the start of main: SIGTERM/SIGINT are noted (and wake a `Stop`) from now on."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _note)


class Stop:
    """A stop asked for by signal, in the running loop: `requested()` is true from the
    signal's arrival on, including one noted before this was made; `wait()` for it."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        loop = asyncio.get_running_loop()
        _wakers.append(lambda: loop.call_soon_threadsafe(self.event.set))
        if _received:
            self.event.set()

    def requested(self) -> bool:
        return bool(_received) or self.event.is_set()

    async def wait(self) -> None:
        await self.event.wait()


async def unless_stopped(stop: Stop, aw: Awaitable[T]) -> tuple[bool, T | None]:
    """Await `aw` unless a stop is asked for first, then cancel it: (finished, its result).
    Only for waits that a cancel leaves in order."""
    if stop.requested():
        if asyncio.iscoroutine(aw):
            aw.close()
        return False, None
    task = asyncio.ensure_future(aw)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        stopped.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False, None
