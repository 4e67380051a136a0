"""Fixtures: one management-enabled broker per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import MgmtBroker


@pytest.fixture(scope="module")
def mgmt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtBroker]:
    b = MgmtBroker(tmp_path_factory.mktemp("mgmt") / "data").start()
    yield b
    b.stop()
