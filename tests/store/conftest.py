"""Fixtures for the message-store tests: a recording client and a store factory that stops
(or abandons) every store it made."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from msg_store_helpers import RecordingClient

from broker.store.msg_store import MsgStore


@pytest.fixture
def client() -> RecordingClient:
    return RecordingClient()


@pytest.fixture
async def make_store(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[MsgStore] = []

    async def make(directory: Path | None = None, refs: Any = None, **options: Any) -> MsgStore:
        store = MsgStore(directory or tmp_path / "store", **options)
        made.append(store)
        store.last_report = await store.start(refs)  # type: ignore[attr-defined]
        return store

    yield make
    for store in made:
        await store.stop()  # no-op for stores a test already stopped or abandoned
