"""One management-enabled broker per module: users, vhosts and permissions are set over HTTP,
behaviour is checked over AMQP with pika."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.mgmt.helpers import MgmtBroker


@pytest.fixture(scope="module")
def mgmt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtBroker]:
    b = MgmtBroker(tmp_path_factory.mktemp("access") / "data").start()
    yield b
    b.stop()
