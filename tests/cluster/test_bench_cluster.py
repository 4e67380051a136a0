"""hare_bench/bench_cluster.py end to end on a private etcd and two nodes, with tiny loads:
every figure docs/BENCHMARKS.md quotes comes out, and the publish-only rate counts messages
that landed in the queues, whichever node they live on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hare_bench import bench_cluster

from .helpers import ETCD, free_base


def test_bench_cluster_reports_both_set_ups_and_the_link_cost(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not Path(ETCD).exists():
        pytest.skip("etcd is not installed (Debian's etcd-server)")
    count = 2_000
    assert bench_cluster.main(["--rounds", "1", "--pairs", "2", "--count", str(count),
                               "--duration", "0.5", "--link-count", "500",
                               "--port", str(free_base())]) == 0
    out = json.loads(capsys.readouterr().out)
    rounds, summary = out["rounds"], out["summary"]
    for setup in ("1 node", "2 nodes"):
        assert rounds[f"publish-only {setup} messages"] == [2 * count]
        assert rounds[f"steady {setup} messages"][0] > 0
        for load in bench_cluster.LOADS:
            for party in ("hare-1", "hare-2", "clients", "others", "irq"):
                assert rounds[f"{load} {setup} {party} cores"][0] >= 0
    for load in bench_cluster.LOADS:
        assert summary[f"{load} ratio"]["median"] > 0
    # the link's measures ran to the end: every confirm came, every delivery arrived, both
    # with the clients on the queue's node and on the other one
    for kind in ("publish", "deliver"):
        for where in ("local", "forwarded"):
            assert len(rounds[f"{kind}_{where}_us"]) == 1


def test_bench_quorum_reports_every_set_up_and_the_replication_cost(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """hare_bench/bench_quorum.py with a tiny load and without RabbitMQ (which tests never
    need): both Hare set-ups measured, the replication bytes counted (two followers each get
    every message: more than twice the body a message)."""
    from hare_bench import bench_quorum

    if not Path(ETCD).exists():
        pytest.skip("etcd is not installed (Debian's etcd-server)")
    assert bench_quorum.main(["--rounds", "1", "--count", "300", "--size", "512",
                              "--no-rabbitmq", "--port", str(free_base())]) == 0
    out = json.loads(capsys.readouterr().out)
    rounds, summary = out["rounds"], out["summary"]
    for setup in ("hare quorum x3", "hare classic"):
        for kind in ("publish", "consume"):
            assert rounds[f"{setup}: {kind} msg_s"][0] > 0
            assert rounds[f"{setup}: {kind} broker us/msg"][0] >= 0  # ticks of 10 ms
    assert rounds["hare quorum x3: replication bytes/msg"][0] > 2 * 512
    assert summary["publish: quorum x3 / hare classic"]["median"] > 0
