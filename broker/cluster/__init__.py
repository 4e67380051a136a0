"""The cluster seam: what a node asks of "the cluster", whether it is one node or several.

`LocalCluster` is the single node Hare has always been: nothing to join, one member, no
remote queues. `EtcdCluster` (broker/cluster/etcd_cluster.py) keeps membership and metadata
in etcd. The node builds one of them (`make_cluster`) and the rest of the broker talks to it
through the `Cluster` protocol, never through `if clustered:` branches. See docs/CLUSTER.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.cluster.local import (
    Cluster,
    ClusterUnavailable,
    LocalCluster,
    Member,
    NodeNameTaken,
)

if TYPE_CHECKING:
    from broker.node import Node

__all__ = ["Cluster", "ClusterUnavailable", "LocalCluster", "Member", "NodeNameTaken",
           "make_cluster"]


def make_cluster(node: Node) -> Cluster:
    if not node.settings.cluster_etcd:
        return LocalCluster(node)
    from broker.cluster.etcd_cluster import EtcdCluster

    return EtcdCluster(node)
