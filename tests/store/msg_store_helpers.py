"""Shared helpers of the message-store tests (a uniquely named module: `from conftest import`
would depend on which directory's conftest pytest loaded last)."""

from __future__ import annotations

import errno
import os
from typing import Any

from broker.store.segment import FileWriter

__all__ = ["FullDisk", "RecordingClient", "body", "filled"]


class RecordingClient:
    """A StoreClient that remembers what it was told, in order."""

    def __init__(self) -> None:
        self.durable: list[int] = []
        self.failed: list[int] = []
        self.errors: list[OSError] = []
        self.calls = 0

    def msgs_durable(self, msg_ids: list[int]) -> None:
        self.calls += 1
        self.durable.extend(msg_ids)

    def msgs_failed(self, msg_ids: list[int], error: OSError) -> None:
        self.failed.extend(msg_ids)
        self.errors.append(error)


class FullDisk(FileWriter):
    """A FileWriter that fails like a full disk while `full` is set."""

    def __init__(self) -> None:
        self.full = False
        self.fsyncs = 0

    def _check(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        self._check()
        super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self._check()
        self.fsyncs += 1
        super().fsync(fd)


def body(i: int, size: int = 1000) -> bytes:
    """A body that names its message, so a mixed-up read is caught."""
    return i.to_bytes(8, "big") * (size // 8) + b"#" * (size % 8)


async def filled(make_store: Any, n: int = 30, **options: Any) -> Any:
    """A store (from the make_store fixture) holding body(0) .. body(n-1), synced."""
    store = await make_store(**options)
    c = RecordingClient()
    for i in range(n):
        store.write(i, body(i), c)
    await store.sync()
    return store
