"""A data directory changes hands between one process and a worker tree: a first
multi-worker start over a single process's directory makes it worker 1's (definitions,
durable queues and their persistent messages), a start cut short in the middle of that move
leaves a single process's directory, and one process refuses a tree's directory in one line
rather than start empty beside it (broker/store/tree_layout.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pika

from tests.mgmt.helpers import MgmtBroker
from tests.workers.helpers import WorkersBroker

POLICY = {"pattern": "^kept$", "definition": {"max-length": 1000}, "apply-to": "queues"}


def _connect(b: MgmtBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(b.url + "%2F?heartbeat=0"))


def _populate(b: MgmtBroker, count: int) -> None:
    """A user, a policy, a durable exchange bound to a durable queue holding `count`
    confirmed persistent messages published through the exchange; a quorum queue with
    `count` too (its member named after the single node, then after worker 1)."""
    assert b.api("PUT", "/api/users/alice", {"password": "pw", "tags": ""})[0] == 201
    assert b.api("PUT", "/api/policies/%2F/keep-short", POLICY)[0] == 201
    conn = _connect(b)
    ch = conn.channel()
    ch.exchange_declare("kx", "direct", durable=True)
    ch.queue_declare("kept", durable=True)
    ch.queue_bind("kept", "kx", "k")
    ch.queue_declare("kept-qq", durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("kx", "k", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", "kept-qq", b"%d" % i)
    conn.close()


def _check(b: MgmtBroker, count: int) -> None:
    assert b.get("/api/users/alice")["name"] == "alice"
    assert b.get("/api/policies/%2F/keep-short")["definition"] == POLICY["definition"]
    assert b.get("/api/exchanges/%2F/kx")["durable"] is True
    assert [x["routing_key"] for x in b.get("/api/bindings/%2F/e/kx/q/kept")] == ["k"]
    queue = b.get("/api/queues/%2F/kept")
    assert queue["policy"] == "keep-short"
    assert queue["messages"] == count
    assert b.get("/api/queues/%2F/kept-qq")["messages"] == count


def _plant_interrupted_adoption(data: Path) -> None:
    """What a kill -9 in the middle of the move leaves: part of the entries moved."""
    (data / "w1.adopting").mkdir()
    for name in ("definitions.sqlite", "queues"):
        os.rename(data / name, data / "w1.adopting" / name)


def test_single_process_directory_becomes_worker_1s(tmp_path: Path) -> None:
    data = tmp_path / "data"
    single = MgmtBroker(data, ["--workers", "1"]).start()
    try:
        _populate(single, 20)
        assert single.stop() == 0
        # an interrupted move is undone by a single process's start: all there
        _plant_interrupted_adoption(data)
        single.start()
        _check(single, 20)
        assert single.stop() == 0
        assert not (data / "w1.adopting").exists() and not (data / "w1").exists()
    finally:
        single.kill()
    _plant_interrupted_adoption(data)  # and redone by a multi-worker start
    two = WorkersBroker(data, 2).start()
    try:
        for _ in range(4):  # whichever worker answers
            _check(two, 20)
        assert two.node_of("kept").endswith("-w1")
        assert (data / "w1" / "definitions.sqlite").exists()
        assert not (data / "definitions.sqlite").exists()
        conn = _connect(two)
        ch = conn.channel()
        got = [ch.basic_get("kept", auto_ack=True)[2] for _ in range(20)]
        assert got == [b"%d" % i for i in range(20)]
        conn.close()
        assert two.stop() == 0
    finally:
        two.kill()


def test_one_process_refuses_a_worker_trees_directory(tmp_path: Path) -> None:
    """Exit 2 with one line naming the directory and what to do; the tree is untouched."""
    data = tmp_path / "data"
    two = WorkersBroker(data, 2).start()
    assert two.stop() == 0
    before = sorted(p.name for p in data.iterdir())
    done = subprocess.run(
        [sys.executable, "-m", "broker", "--workers", "1", "--port", "0",
         "--management-port", "0", "--data-dir", str(data)],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert str(data) in done.stderr and "--workers 2" in done.stderr
    assert sorted(p.name for p in data.iterdir()) == before


def test_both_side_by_side_each_kind_keeps_its_own(tmp_path: Path) -> None:
    """A tree started beside a single process's data before adoption existed: the single
    process starts with its own (not refused), the tree with its own (nothing moved)."""
    data, tree = tmp_path / "data", tmp_path / "tree"
    two = WorkersBroker(tree, 2).start()
    assert two.stop() == 0
    single = MgmtBroker(data, ["--workers", "1"]).start()
    try:
        _populate(single, 3)
        assert single.stop() == 0
        for entry in tree.iterdir():  # the tree's meta.* and w<i>/ beside the single's
            if entry.name != "hare.lock":
                entry.rename(data / entry.name)
        single.start()
        _check(single, 3)
        assert single.stop() == 0
    finally:
        single.kill()
    two = WorkersBroker(data, 2).start()
    try:
        assert two.api("GET", "/api/queues/%2F/kept")[0] == 404
        assert (data / "definitions.sqlite").exists()
        assert two.stop() == 0
    finally:
        two.kill()
