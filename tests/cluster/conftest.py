"""One private etcd per test module (or the parent's meta server in its place, with
HARE_TEST_METADATA=meta); each test names its own cluster (a key prefix)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import EtcdProc, metadata_store


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProc]:
    e = metadata_store(tmp_path_factory.mktemp("etcd")).start()
    yield e
    e.stop()
