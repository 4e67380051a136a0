"""`make cluster`'s DevCluster: etcd and two nodes on consecutive ports, joined, stopped."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from hare_bench.local_cluster import DevCluster

from .helpers import ETCD, free_base, wait_for


def test_dev_cluster_starts_two_joined_nodes(tmp_path: Path) -> None:
    assert Path(ETCD).exists()
    base = free_base()
    cluster = DevCluster(tmp_path, 2, base, extra=["--log-level", "warning"])
    cluster.start()
    try:
        def nodes() -> list[tuple[str, bool]]:
            req = urllib.request.Request(f"http://127.0.0.1:{10000 + base}/api/nodes")
            req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
            with urllib.request.urlopen(req, timeout=5) as resp:
                return [(n["name"], n["running"]) for n in json.loads(resp.read())]

        wait_for(lambda: nodes() == [("hare-1", True), ("hare-2", True)], timeout=30,
                 what="both nodes")
        assert cluster.amqp_url(1).endswith(f":{base + 1}/")
    finally:
        cluster.stop()
    assert cluster.nodes == [] and cluster.etcd is None

