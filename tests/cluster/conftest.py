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


@pytest.fixture(autouse=True)
def one_process_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node here is one process, whatever HARE_WORKERS the suite runs with (make
    test-workers): hare-server refuses workers > 1 with cluster_etcd (a multi-worker server
    is not yet an etcd member, docs/ARCHITECTURE.md "Process tree")."""
    monkeypatch.setenv("HARE_WORKERS", "1")
