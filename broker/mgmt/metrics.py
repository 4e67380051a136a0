"""/metrics in Prometheus' text format, named as RabbitMQ's prometheus plugin names them, so
its Grafana dashboards read Hare. A collector reads the live objects on each scrape; it keeps
no state of its own (the totals come from the management Stats, which remember closed
channels and deleted queues)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from broker import __version__
from broker.flow.memory_monitor import process_memory
from broker.mgmt.http import NODE, STATS
from broker.mgmt.peers import STORE_FIGURES, peer_items, peer_totals, store_figures
from broker.mgmt.stats import Stats, channels, opened_connections, queues

if TYPE_CHECKING:
    from broker.node import Node

__all__ = ["HareCollector", "add_routes", "render"]


class HareCollector(Collector):
    """The node's figures; with `peers` (the other nodes' or workers' parts, mgmt/peers.py)
    the whole broker's: queues with their home's counts, node-wide figures summed."""

    def __init__(self, node: Node, stats: Stats, peers: list[dict[str, Any]] | None = None,
                 homes: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        self.node = node
        self.stats = stats
        self.peers = peers or []
        self.homes = homes or {}

    def collect(self) -> Iterator[Any]:
        node = self.node
        info = GaugeMetricFamily("rabbitmq_identity_info", "Node and cluster names",
                                 labels=["rabbitmq_node", "rabbitmq_cluster"])
        info.add_metric([node.name, node.name], 1)
        yield info
        build = GaugeMetricFamily("rabbitmq_build_info", "Broker version",
                                  labels=["product", "version"])
        build.add_metric(["Hare", __version__], 1)
        yield build

        conns = opened_connections(node)
        all_queues = list(queues(node))
        peers = self.peers
        infos = [self.homes.get((q.vhost.name, q.name)) or q.info() for q in all_queues]
        yield GaugeMetricFamily("rabbitmq_connections", "Open AMQP connections",
                                len(conns) + sum(p["connections"] for p in peers))
        yield GaugeMetricFamily("rabbitmq_channels", "Open channels",
                                sum(1 for _ in channels(node))
                                + sum(p["channels"] for p in peers))
        yield GaugeMetricFamily("rabbitmq_queues", "Queues", len(all_queues))
        yield GaugeMetricFamily("rabbitmq_consumers", "Consumers",
                                sum(int(qi.get("consumers", 0)) for qi in infos)
                                if peers else sum(len(q.consumers) for q in all_queues))

        ready = GaugeMetricFamily("rabbitmq_queue_messages_ready",
                                  "Messages ready for delivery", labels=["vhost", "queue"])
        unacked = GaugeMetricFamily("rabbitmq_queue_messages_unacked",
                                    "Messages delivered and not yet acknowledged",
                                    labels=["vhost", "queue"])
        consumers = GaugeMetricFamily("rabbitmq_queue_consumers", "Consumers on a queue",
                                      labels=["vhost", "queue"])
        for q, qi in zip(all_queues, infos, strict=True):
            labels = [q.vhost.name, q.name]
            ready.add_metric(labels, qi.get("messages_ready", 0))
            unacked.add_metric(labels, qi.get("messages_unacknowledged", 0))
            consumers.add_metric(labels, qi.get("consumers", 0))
        yield ready
        yield unacked
        yield consumers

        totals = dict(self.stats.totals())
        for p in peers:
            for key, value in p["totals"].items():
                totals[key] = totals.get(key, 0) + value
        for name, key, text in (
            ("rabbitmq_global_messages_received", "publish", "Messages published by clients"),
            ("rabbitmq_global_messages_routed", "publish_in", "Messages enqueued into queues"),
            ("rabbitmq_global_messages_delivered", "deliver_get",
             "Messages delivered to consumers or fetched with basic.get"),
            ("rabbitmq_global_messages_redelivered", "redeliver", "Messages redelivered"),
            ("rabbitmq_global_messages_acknowledged", "ack", "Messages acknowledged"),
            ("rabbitmq_global_messages_confirmed", "confirm", "Publisher confirms sent"),
            ("rabbitmq_global_messages_unroutable_returned", "return_unroutable",
             "Unroutable mandatory messages returned"),
        ):
            yield CounterMetricFamily(name, text, totals[key])

        # RabbitMQ's auth attempt counters (rabbitmq_prometheus), per protocol
        attempts = node.auth.attempts
        for name, field, text in (
            ("rabbitmq_auth_attempts", "attempts", "Login attempts"),
            ("rabbitmq_auth_attempts_failed", "failed", "Refused login attempts"),
            ("rabbitmq_auth_attempts_succeeded", "succeeded", "Accepted login attempts"),
        ):
            family = CounterMetricFamily(name, text, labels=["protocol"])
            index = ("attempts", "failed", "succeeded").index(field)
            summed = {protocol: getattr(counts, field) for protocol, counts in attempts.items()}
            for p in peers:
                for protocol, values in p["auth"].items():
                    summed[protocol] = summed.get(protocol, 0) + values[index]
            for protocol, count in sorted(summed.items()):
                family.add_metric([protocol], count)
            yield family

        yield GaugeMetricFamily("rabbitmq_process_resident_memory_bytes",
                                "Resident memory of the broker process (its workers')",
                                process_memory() + sum(p["rss"] for p in peers))
        alarms = set(node.alarms_active()).union(*(p["alarms"] for p in peers))
        yield GaugeMetricFamily("rabbitmq_alarms_memory_used_watermark",
                                "1 while the memory alarm is in effect", int("memory" in alarms))
        yield GaugeMetricFamily("rabbitmq_alarms_free_disk_space_watermark",
                                "1 while the disk alarm is in effect", int("disk" in alarms))

        budget = getattr(node, "content_budget", None)
        if budget is not None:
            yield GaugeMetricFamily("hare_partial_content_bytes",
                                    "Body bytes of messages still arriving, all connections",
                                    budget.total)
            yield GaugeMetricFamily("hare_partial_content_limit_bytes",
                                    "The content budget: above it the connections holding the "
                                    "most stop being read", budget.limit)

        store_stats = store_figures(node)  # each store's summed over the workers
        for p in peers:
            for name, figures in p.get("stores", {}).items():
                summed = store_stats.setdefault(name, dict.fromkeys(STORE_FIGURES, 0))
                for key in STORE_FIGURES:
                    summed[key] += figures.get(key, 0)
        if store_stats:
            size = GaugeMetricFamily("hare_store_bytes", "Bytes in a message store's files",
                                     labels=["store"])
            garbage = GaugeMetricFamily("hare_store_garbage_bytes",
                                        "Bytes of removed messages not yet compacted away",
                                        labels=["store"])
            quarantined = GaugeMetricFamily(
                "hare_store_quarantined_messages",
                "Messages set aside in quarantine/ when found damaged at read",
                labels=["store"])
            for name, st in sorted(store_stats.items()):
                size.add_metric([name], st.get("bytes", 0))
                garbage.add_metric([name], st.get("garbage_bytes", 0))
                quarantined.add_metric([name], st.get("quarantined_messages", 0))
            yield size
            yield garbage
            yield quarantined


def render(node: Node, stats: Stats, peers: list[dict[str, Any]] | None = None,
           homes: dict[tuple[str, str], dict[str, Any]] | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HareCollector(node, stats, peers, homes))
    return generate_latest(registry)


async def _metrics(request: web.Request) -> web.Response:
    node = request.app[NODE]
    # a worker (its sockets inherited from the parent) answers for the whole hare-server, as
    # its one port is scraped; a cluster's node answers for itself, as RabbitMQ's do (and a
    # multi-worker server in an etcd cluster for its own workers, not the other servers)
    peers = await peer_totals(node, same_server=True) if node.inherited else []
    homes = {(q["vhost"], q["name"]): q for q in await peer_items(node, "queues")
             } if peers else {}
    body = render(node, request.app[STATS], peers, homes)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", _metrics)
