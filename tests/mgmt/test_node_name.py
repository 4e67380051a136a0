"""A single node's name from `--node-name` or HARE_NODE_NAME (not only a cluster's): what the
management API and the durable queues report, kept across restarts whatever the hostname (a
re-created container has a new one)."""

from __future__ import annotations

from pathlib import Path

import pika

from tests.mgmt.helpers import MgmtBroker


def _names(b: MgmtBroker, name: str) -> None:
    """The node's name as /api/nodes, /api/overview and the queue's `node` give it: `name`,
    or `name`-w1, -w2, ... for the workers of a multi-worker server."""
    count = len(b.serving_pids())
    want = {name} if count == 1 else {f"{name}-w{i}" for i in range(1, count + 1)}
    assert {n["name"] for n in b.get("/api/nodes")} == want
    assert b.get("/api/overview")["node"] in want
    assert b.get("/api/queues/%2F/kept")["node"] in want


def test_node_name_from_the_flag_then_the_variable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = MgmtBroker(data, ["--node-name", "hare@flag"]).start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(b.url))
        channel = connection.channel()
        channel.queue_declare("kept", durable=True)
        channel.basic_publish("", "kept", b"m", pika.BasicProperties(delivery_mode=2))
        connection.close()
        _names(b, "hare@flag")
    finally:
        assert b.stop() == 0

    b = MgmtBroker(data)
    b.env = {"HARE_NODE_NAME": "hare@variable"}
    b.start()
    try:
        # the same data directory under another name: its queues and messages are this node's
        _names(b, "hare@variable")
        assert b.get("/api/queues/%2F/kept")["messages"] == 1
    finally:
        assert b.stop() == 0
