"""A worker's settings, made from its parent's (plain values): on its own a member of the
parent's private loopback cluster; with cluster_etcd a node of that etcd cluster, on the
server's link address with a port of its own, its card naming the server."""

from __future__ import annotations

from pathlib import Path

from broker.config import load_settings
from broker.node.supervisor import WorkerRole, worker_settings

ETCD = ["--cluster-etcd", "http://etcd:2379", "--cluster-secret", "s3cret",
        "--node-name", "hare-a", "--data-dir", "/data"]


def _role(index: int, meta_url: str = "") -> WorkerRole:
    return WorkerRole(index, 2, 1, {}, meta_url, "tok" if meta_url else "",
                      "run-secret" if meta_url else "")


def test_in_an_etcd_cluster_a_worker_is_a_node_of_it() -> None:
    parent = load_settings([*ETCD, "--workers", "2", "--cluster-link-host", "10.0.0.5"], env={})
    w2 = worker_settings(parent, _role(2))
    assert (w2.node_name, w2.cluster_server, w2.data_dir) == ("hare-a-w2", "hare-a",
                                                              Path("/data/w2"))
    assert (w2.cluster_etcd, w2.cluster_secret, w2.cluster_etcd_token) == (
        "http://etcd:2379", "s3cret", "")
    assert (w2.cluster_link_host, w2.cluster_link_port) == ("10.0.0.5", 25673)
    assert worker_settings(parent, _role(1)).cluster_link_port == 25672
    assert w2.quorum_initial_group_size == 3  # members spread over servers instead
    any_port = load_settings([*ETCD, "--cluster-link-port", "0"], env={})
    assert worker_settings(any_port, _role(2)).cluster_link_port == 0
    named = load_settings([*ETCD, "--cluster-server", "rack1-box3"], env={})
    assert worker_settings(named, _role(1)).cluster_server == "rack1-box3"


def test_on_its_own_a_worker_is_a_node_of_the_parents_cluster() -> None:
    parent = load_settings(["--node-name", "hare-a", "--data-dir", "/data"], env={})
    w1 = worker_settings(parent, _role(1, "http://127.0.0.1:4001"))
    assert (w1.node_name, w1.cluster_server) == ("hare-a-w1", "hare-a")
    assert (w1.cluster_etcd, w1.cluster_etcd_token, w1.cluster_secret) == (
        "http://127.0.0.1:4001", "tok", "run-secret")
    assert (w1.cluster_link_host, w1.cluster_link_port) == ("127.0.0.1", 0)
    assert w1.quorum_initial_group_size == 1
