"""Membership on etcd leases, with real processes: a private etcd and Hare nodes on loopback.
Node names are unique in a cluster; /api/nodes and hare-ctl cluster_status list every node;
a killed node is down once its lease expires, and its restart takes its name back at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pika

from tests.conftest import ROOT, BrokerProc
from tests.mgmt.helpers import MgmtBroker, free_port

from .helpers import ClusterNode, EtcdProc, ctl, wait_for


def running(node: MgmtBroker) -> dict[str, bool]:
    return {n["name"]: n["running"] for n in node.get("/api/nodes")}


def test_members_names_and_restart(tmp_path: Path, etcd: EtcdProc) -> None:
    a = ClusterNode(tmp_path / "a", etcd, "m1", "hare-a").start()
    b = ClusterNode(tmp_path / "b", etcd, "m1", "hare-b").start()
    try:
        wait_for(lambda: running(a) == {"hare-a": True, "hare-b": True}, what="both running")
        assert a.get("/api/overview")["cluster_name"] == "m1"
        assert a.get("/api/nodes/hare-b")["running"] is True

        # a second node with a taken name: one clear line, exit 1, before any listener
        dup = ClusterNode(tmp_path / "dup", etcd, "m1", "hare-b")
        dup.data_dir.mkdir()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **dup.env}
        res = subprocess.run([sys.executable, "-m", "broker", "--port", "0",
                              "--management-port", "0", "--data-dir", str(dup.data_dir),
                              *dup.args], capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=30)
        assert res.returncode == 1
        assert res.stderr.strip().splitlines() == [
            res.stderr.strip()
        ] and "node name 'hare-b' is already in use in the cluster" in res.stderr
        assert "listening" not in res.stdout

        status = ctl(a, "cluster_status")
        assert status.returncode == 0, status.stderr
        out = status.stdout
        assert "Cluster name: m1" in out
        running_part = out.split("Running Nodes")[1].split("Alarms")[0]
        assert "hare-a" in running_part and "hare-b" in running_part

        # kill -9: down for the others once the lease (3 s) expires, still a known node
        b.kill()
        wait_for(lambda: running(a) == {"hare-a": True, "hare-b": False}, timeout=15,
                 what="hare-b down")
        out = ctl(a, "cluster_status").stdout
        assert "hare-b" in out.split("Disk Nodes")[1].split("Running Nodes")[0]
        assert "hare-b" not in out.split("Running Nodes")[1].split("Alarms")[0]

        # kill -9 and restart at once: the same data directory takes its name back from the
        # old lease without waiting for it to expire
        b.start()
        b.kill()
        b.start()
        wait_for(lambda: running(a) == {"hare-a": True, "hare-b": True}, what="hare-b back")
    finally:
        b.kill()
        a.stop()


def test_start_refused_in_one_line(tmp_path: Path) -> None:
    """A node that cannot reach etcd at start cannot know whether its name is free, and one
    whose link port is taken cannot join the others: one line each, exit 1, no listener."""
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    (tmp_path / "d").mkdir()

    def start(link_port: int) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [sys.executable, "-m", "broker", "--port", "0", "--management-port", "0",
             "--data-dir", str(tmp_path / "d"), "--cluster-etcd", nowhere,
             "--cluster-secret", "s", "--node-name", "lonely",
             "--cluster-link-host", "127.0.0.1", "--cluster-link-port", str(link_port)],
            capture_output=True, text=True, cwd=ROOT, timeout=30,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert res.returncode == 1 and "listening" not in res.stdout
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        return res

    assert start(0).stderr.startswith(f"hare-server: cannot reach etcd at {nowhere}: ")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert start(port).stderr.strip() == (
            f"hare-server: cluster link port {port} is already in use (cluster_link_port)")


def test_list_queues_node_column(tmp_path: Path, etcd: EtcdProc) -> None:
    a = ClusterNode(tmp_path / "a", etcd, "m2", "hare-q").start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(a.url))
        conn.channel().queue_declare("nodecol")
        conn.close()
        res = ctl(a, "list_queues", "name", "node")
        assert res.returncode == 0, res.stderr
        assert any(line.split() == ["nodecol", "hare-q"] for line in res.stdout.splitlines())
    finally:
        a.stop()


def test_single_node_name(tmp_path: Path) -> None:
    """--node-name and HARE_NODE_NAME name a node without a cluster (a container keeps its
    name when it is re-created); the cluster is the node alone."""
    b = MgmtBroker(tmp_path / "d", ["--node-name", "solo@box"]).start()
    try:
        assert b.get("/api/overview")["node"] == "solo@box"
        assert [n["name"] for n in b.get("/api/nodes")] == ["solo@box"]
        assert "Running Nodes\n\nsolo@box" in ctl(b, "cluster_status").stdout
    finally:
        b.stop()
    env_node = BrokerProc(tmp_path / "e", env={"HARE_NODE_NAME": "env@box"})
    env_node.start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(env_node.url))
        assert conn is not None
        conn.close()
        assert "env@box" in env_node.log()
    finally:
        env_node.stop()


def test_cluster_needs_a_secret(tmp_path: Path) -> None:
    """A cluster without a shared secret would accept links from anyone: refused at load.
    The cluster settings come from flags, the environment or the TOML file alike."""
    from broker.config import ConfigError, load_settings

    try:
        load_settings(["--cluster-etcd", "http://127.0.0.1:2379"], {})
    except ConfigError as exc:
        assert "cluster_secret" in str(exc)
    else:
        raise AssertionError("a cluster without cluster_secret was accepted")
    settings = load_settings([], {"HARE_CLUSTER_ETCD": "http://e:2379",
                                  "HARE_CLUSTER_SECRET": "s", "HARE_NODE_NAME": "n1"})
    assert (settings.cluster_etcd, settings.cluster_secret, settings.node_name) == (
        "http://e:2379", "s", "n1")
    toml = tmp_path / "hare.toml"
    toml.write_text('cluster_etcd = "http://t:2379"\ncluster_name = "prod"\n'
                    'node_name = "hare-t"\ncluster_secret = "ts"\n')
    settings = load_settings(["--config", str(toml)], {})
    assert (settings.cluster_etcd, settings.cluster_name, settings.node_name) == (
        "http://t:2379", "prod", "hare-t")
