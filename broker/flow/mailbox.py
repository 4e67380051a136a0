"""A task's mailbox: producers append without awaiting; the owning task takes everything that
has accumulated in one `get()`, so a burst of N messages costs one wake-up, not N."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Mailbox"]


class Mailbox:
    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def put_quiet(self, item: Any) -> None:
        """Append without waking the owner: a producer adding a burst calls `notify` once."""
        self._items.append(item)

    def notify(self) -> None:
        waiter = self._waiter
        if waiter is not None and self._items:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    @property
    def idle(self) -> bool:
        """The owner waits in `get()` and nothing has woken it: it holds no earlier item."""
        return self._waiter is not None

    def take(self) -> list[Any]:
        """Everything queued so far, without waiting (used to drain before a synchronous call)."""
        items = self._items
        if items:
            self._items = []
        return items

    async def get(self) -> list[Any]:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        items = self._items
        self._items = []
        return items
