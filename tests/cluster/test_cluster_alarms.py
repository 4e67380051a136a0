"""A resource alarm on one node blocks the publishers of every node (as in a RabbitMQ
cluster; a multi-worker hare-server's one watermark is its workers' shares together)."""

from __future__ import annotations

import uuid
from pathlib import Path

from pamqp import commands

from tests.amqp_raw import RawClient

from .helpers import ClusterNode, EtcdProc


def test_alarm_on_one_node_blocks_publishers_on_another(tmp_path: Path,
                                                        etcd: EtcdProc) -> None:
    cluster = "alarm-" + uuid.uuid4().hex[:8]
    # 1 MiB is below any Python process: a's memory alarm is up from its first sample
    a = ClusterNode(tmp_path / "a", etcd, cluster, "a",
                    ["--vm-memory-high-watermark", "1MiB",
                     "--memory-monitor-interval-s", "0.05"]).start()
    b = ClusterNode(tmp_path / "b", etcd, cluster, "b").start()
    try:
        c = RawClient(b.port)
        c.handshake()
        c.open_channel(1)
        c.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
        c.send_content(1, b"x")
        blocked = c.expect(commands.Connection.Blocked, 0)
        assert blocked.reason == "low on memory"  # type: ignore[attr-defined]
        a.stop()  # its card goes with it: the alarm clears for b's publishers
        c.expect(commands.Connection.Unblocked, 0, timeout=15)
        c.close()
    finally:
        a.kill()
        b.kill()
