"""The multi-worker broker most files of tests/workers share: one per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.workers.helpers import WorkersBroker


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkersBroker]:
    b = WorkersBroker(tmp_path_factory.mktemp("two") / "data", 2).start()
    yield b
    b.kill()
