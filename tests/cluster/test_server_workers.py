"""Servers in an etcd cluster: quorum queue members go to distinct hare-servers (the workers
of one share its machine and disk)."""

from __future__ import annotations

from broker.cluster.quorum import choose_members


def test_members_spread_over_servers() -> None:
    """Plain values: one member per server while the candidates span several; a cluster of
    one server gets as many as asked (a multi-worker server alone on its etcd)."""
    server = {"a-w1": "a", "a-w2": "a", "b": "b", "c-w1": "c", "c-w2": "c"}
    load = {"b": 5}
    assert choose_members("a-w1", list(server), 3, load, server) == ["a-w1", "c-w1", "b"]
    assert choose_members("a-w1", list(server), 5, load, server) == ["a-w1", "c-w1", "b"]
    assert choose_members("a-w1", ["a-w1", "a-w2"], 3, {}, server) == ["a-w1", "a-w2"]
    assert choose_members("x", ["x", "y", "z"], 3, {}) == ["x", "y", "z"]  # own servers
