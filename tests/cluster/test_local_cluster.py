"""`make cluster`'s DevCluster: etcd and two nodes on consecutive ports, joined, stopped."""

from __future__ import annotations

import json
import random
import socket
import urllib.request
from pathlib import Path

from broker.perf.local_cluster import DevCluster

from .helpers import ETCD, wait_for


def test_dev_cluster_starts_two_joined_nodes(tmp_path: Path) -> None:
    assert Path(ETCD).exists()
    base = _free_base()
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


def _free_base() -> int:
    """A base port whose etcd, AMQP, management and link ports are all free now, every one
    below the kernel's ephemeral range (32768 and up): there, any other test's free port or
    outgoing connection could take one between this check and the node's bind."""
    for _ in range(50):
        base = random.randrange(3000, 12000)  # link ports 23000..32001
        ports = [base - 2, base - 1, base, base + 1, 10000 + base, 10001 + base,
                 20000 + base, 20001 + base]
        try:
            for port in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")
