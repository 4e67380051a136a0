"""A multi-worker hare-server as one member of an etcd cluster: each worker is a node of the
cluster (<server>-w<i>) whose card names its server; the other servers' nodes see its queues
and reach them over the link, quorum queue members go to distinct servers, a killed worker
comes back with its queue, and SIGTERM to the parent takes its nodes out of membership."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from broker.cluster.quorum import choose_members
from tests.conftest import ROOT
from tests.workers.helpers import alive, workers

from .helpers import ClusterNode, EtcdProc, ctl, wait_for

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _connect(node: ClusterNode) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(node.url + "%2F?heartbeat=0"))


def _running(node: ClusterNode) -> dict[str, bool]:
    return {n["name"]: n["running"] for n in node.get("/api/nodes")}


@pytest.fixture
def servers(tmp_path: Path, etcd: EtcdProc, request: pytest.FixtureRequest
            ) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    """`srv`, a hare-server of two workers, and `solo`, a single process, on one etcd."""
    cluster = request.node.name[:40]
    solo = ClusterNode(tmp_path / "solo", etcd, cluster, "solo").start()
    srv = ClusterNode(tmp_path / "srv", etcd, cluster, "srv", ["--workers", "2"])
    try:
        srv.start(timeout=90)
        yield srv, solo
    finally:
        srv.kill()
        solo.kill()


def test_workers_are_nodes_of_the_etcd_cluster(servers: tuple[ClusterNode, ClusterNode]
                                               ) -> None:
    srv, solo = servers
    # each worker a running node of the cluster, its card naming its server; seen alike from
    # the single node and from the server's shared management port
    wait_for(lambda: _running(solo) == {"solo": True, "srv-w1": True, "srv-w2": True},
             what="both workers running for the cluster")
    for node in (solo, srv):
        assert {n["name"]: n["server"] for n in node.get("/api/nodes")} == {
            "solo": "solo", "srv-w1": "srv", "srv-w2": "srv"}
    status = ctl(solo, "cluster_status")
    assert status.returncode == 0, status.stderr
    servers_part = status.stdout.split("Servers")[1]
    assert "srv: srv-w1, srv-w2" in servers_part and "solo: solo" in servers_part

    # declared on each server, published and consumed across them, with confirms
    on_srv, on_solo = _connect(srv), _connect(solo)
    ch_srv, ch_solo = on_srv.channel(), on_solo.channel()
    ch_srv.confirm_delivery()
    ch_solo.confirm_delivery()
    ch_srv.queue_declare("at-srv", durable=True)
    ch_solo.queue_declare("at-solo", durable=True)
    queues = {q["name"]: q["node"] for q in solo.get("/api/queues")}
    home = queues["at-srv"]
    assert home in ("srv-w1", "srv-w2") and queues["at-solo"] == "solo"
    for i in range(100):
        ch_solo.basic_publish("", "at-srv", b"%d" % i, PERSISTENT)  # over the link
        ch_srv.basic_publish("", "at-solo", b"%d" % i, PERSISTENT)
    assert ch_solo.queue_declare("at-srv", passive=True).method.message_count == 100
    got = []
    ch_srv.basic_qos(prefetch_count=20)
    for method, _, body in ch_srv.consume("at-solo"):
        got.append(body)
        ch_srv.basic_ack(method.delivery_tag)
        if len(got) == 100:
            break
    ch_srv.cancel()
    assert got == [b"%d" % i for i in range(100)]

    # /metrics on the server's port sums its own workers, not the other servers' nodes
    status_code, _, text = srv.raw("/metrics")
    assert status_code == 200
    assert "rabbitmq_connections 1.0" in text.splitlines()

    # a quorum queue's members on distinct servers: two, though three nodes run and three
    # are asked for (a second member on the other worker would share srv's disk)
    ch_solo.queue_declare("qq-solo", durable=True, arguments={"x-queue-type": "quorum"})
    ch_srv.queue_declare("qq-srv", durable=True, arguments={
        "x-queue-type": "quorum", "x-quorum-initial-group-size": 3})
    for name in ("qq-solo", "qq-srv"):
        members = solo.get(f"/api/queues/%2F/{name}")["members"]
        assert len(members) == 2 and "solo" in members, (name, members)
    for i in range(20):
        ch_srv.basic_publish("", "qq-solo", b"%d" % i)
    assert ch_solo.queue_declare("qq-solo", passive=True).method.message_count == 20
    on_srv.close()

    # kill -9 of the queue's worker: its parent starts it again, it takes its name back and
    # serves the durable queue with every confirmed message, in order, to the other server
    index = int(home.rsplit("-w", 1)[1])
    before = workers(srv.pid)
    os.kill(before[index], signal.SIGKILL)
    wait_for(lambda: workers(srv.pid).get(index, before[index]) != before[index]
             and not alive(before[index]), timeout=30, what="the worker restarted")

    def back() -> bool:
        c = _connect(solo)
        try:
            return c.channel().queue_declare("at-srv", passive=True).method.message_count == 100
        except pika.exceptions.ChannelClosedByBroker:  # 404 while its home is down
            return False
        finally:
            if c.is_open:
                c.close()

    wait_for(back, timeout=60, what="at-srv back on its worker with its 100 messages")
    ch_solo = on_solo.channel()
    bodies = []
    while (m := ch_solo.basic_get("at-srv", auto_ack=True))[0] is not None:
        bodies.append(m[2])
    assert bodies == [b"%d" % i for i in range(100)]
    on_solo.close()

    # SIGTERM to the parent: a clean stop, and its nodes leave membership at once (their
    # leases revoked, not run out)
    pids = list(workers(srv.pid).values())
    assert srv.stop() == 0
    assert not [p for p in pids if alive(p)]
    wait_for(lambda: _running(solo) == {"solo": True, "srv-w1": False, "srv-w2": False},
             what="the workers out of the running nodes")


def test_members_added_on_servers_without_one(servers: tuple[ClusterNode, ClusterNode]
                                             ) -> None:
    """add_member onto a server that holds a member of the queue already is refused with
    why; grow by a server's name picks one of its nodes, and grow leaves a queue with a member
    on NODE's server as it is."""
    _, solo = servers
    wait_for(lambda: _running(solo) == {"solo": True, "srv-w1": True, "srv-w2": True},
             what="both workers running for the cluster")
    conn = _connect(solo)
    ch = conn.channel()
    for name in ("qq-add", "qq-grow"):  # one member each: solo, the declaring node
        ch.queue_declare(name, durable=True, arguments={
            "x-queue-type": "quorum", "x-quorum-initial-group-size": 1})
        assert solo.get(f"/api/queues/%2F/{name}")["members"] == ["solo"]
    conn.close()

    added = ctl(solo, "add_member", "qq-add", "srv-w1")
    assert added.returncode == 0, added.stderr
    refused = ctl(solo, "add_member", "qq-add", "srv-w2")
    assert refused.returncode != 0
    assert ("server 'srv' (node 'srv-w2') already holds a member of queue 'qq-add' (srv-w1)"
            in refused.stderr), refused.stderr
    by_server = ctl(solo, "add_member", "qq-add", "srv")  # the server's name: the same
    assert by_server.returncode != 0 and "already holds a member" in by_server.stderr
    assert solo.get("/api/queues/%2F/qq-add")["members"] == ["solo", "srv-w1"]

    grown = ctl(solo, "grow", "srv", "all", "--queue-pattern", "^qq-")
    assert grown.returncode == 0, grown.stderr
    members = solo.get("/api/queues/%2F/qq-grow")["members"]
    assert members[0] == "solo" and len(members) == 2 and members[1] in ("srv-w1", "srv-w2")
    assert "qq-add" not in grown.stdout  # srv held one of its members: left alone
    assert solo.get("/api/queues/%2F/qq-add")["members"] == ["solo", "srv-w1"]
    other = "srv-w2" if members[1] == "srv-w1" else "srv-w1"
    again = ctl(solo, "grow", other, "all", "--queue-pattern", "^qq-")
    assert again.returncode == 0, again.stderr
    assert solo.get("/api/queues/%2F/qq-grow")["members"] == members


def test_a_worker_whose_name_is_taken_stops_the_server(tmp_path: Path, etcd: EtcdProc
                                                       ) -> None:
    """A worker joins as any node does: its name taken by another node, the server does not
    start (the worker's line, then the parent's, exit 1) and prints no "listening"."""
    other = ClusterNode(tmp_path / "other", etcd, "taken", "box-w1").start()
    try:
        srv = ClusterNode(tmp_path / "srv", etcd, "taken", "box", ["--workers", "2"])
        srv.data_dir.mkdir()
        res = subprocess.run(
            [sys.executable, "-m", "broker", "--port", "0", "--management-port", "0",
             "--data-dir", str(srv.data_dir), *srv.args], capture_output=True, text=True,
            env={**os.environ, **srv.env}, cwd=ROOT, timeout=120)
        assert res.returncode == 1
        assert "node name 'box-w1' is already in use in the cluster" in res.stderr
        assert "hare-server: worker 1 exited at start (code 1)" in res.stderr
        assert "listening" not in res.stdout
        assert _running(other) == {"box-w1": True}
    finally:
        other.kill()


def test_members_spread_over_servers() -> None:
    """Plain values: one member per server while the candidates span several; a cluster of
    one server gets as many as asked (a multi-worker server alone on its etcd)."""
    server = {"a-w1": "a", "a-w2": "a", "b": "b", "c-w1": "c", "c-w2": "c"}
    load = {"b": 5}
    assert choose_members("a-w1", list(server), 3, load, server) == ["a-w1", "c-w1", "b"]
    assert choose_members("a-w1", list(server), 5, load, server) == ["a-w1", "c-w1", "b"]
    assert choose_members("a-w1", ["a-w1", "a-w2"], 3, {}, server) == ["a-w1", "a-w2"]
    assert choose_members("x", ["x", "y", "z"], 3, {}) == ["x", "y", "z"]  # own servers
