"""One private etcd per test module; each test names its own cluster (a key prefix)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import EtcdProc


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProc]:
    e = EtcdProc(tmp_path_factory.mktemp("etcd")).start()
    yield e
    e.stop()
