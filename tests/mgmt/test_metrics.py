"""/metrics: Prometheus text with RabbitMQ's metric names, values from live AMQP objects."""

from __future__ import annotations

import asyncio

import aio_pika
from aio_pika import Message
from prometheus_client.parser import text_string_to_metric_families

from .helpers import MgmtBroker


def scrape(mgmt: MgmtBroker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, ctype, text = mgmt.raw("/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def until_metric(mgmt: MgmtBroker, key: tuple, value: float) -> dict:
    for _ in range(100):
        samples = await asyncio.to_thread(scrape, mgmt)
        if samples.get(key) == value:
            return samples
        await asyncio.sleep(0.05)
    raise AssertionError(f"{key} never became {value}; last {samples.get(key)}")


async def test_metrics_follow_connections_queues_and_messages(mgmt: MgmtBroker) -> None:
    before = scrape(mgmt)
    conn = await aio_pika.connect(mgmt.url)
    ch = await conn.channel()
    await conn.channel()
    q = await ch.declare_queue("metrics.q")
    for _ in range(4):
        await ch.default_exchange.publish(Message(b"abc"), routing_key="metrics.q")
    labels = (("queue", "metrics.q"), ("vhost", "/"))
    samples = await until_metric(mgmt, ("rabbitmq_queue_messages_ready", labels), 4)
    assert samples[("rabbitmq_connections", ())] == before[("rabbitmq_connections", ())] + 1
    assert samples[("rabbitmq_channels", ())] == before[("rabbitmq_channels", ())] + 2
    assert samples[("rabbitmq_queues", ())] == before[("rabbitmq_queues", ())] + 1
    assert samples[("rabbitmq_queue_messages_unacked", labels)] == 0
    received = ("rabbitmq_global_messages_received_total", ())
    assert samples[received] == before[received] + 4

    msg = await q.get(no_ack=False)
    assert msg is not None
    samples = await until_metric(mgmt, ("rabbitmq_queue_messages_unacked", labels), 1)
    assert samples[("rabbitmq_queue_messages_ready", labels)] == 3
    delivered = ("rabbitmq_global_messages_delivered_total", ())
    assert samples[delivered] == before[delivered] + 1
    await msg.ack()
    acked = ("rabbitmq_global_messages_acknowledged_total", ())
    samples = await until_metric(mgmt, acked, before[acked] + 1)
    assert samples[("rabbitmq_queue_messages_unacked", labels)] == 0

    assert samples[("rabbitmq_process_resident_memory_bytes", ())] > 10_000_000
    assert samples[("rabbitmq_alarms_memory_used_watermark", ())] == 0
    assert samples[("rabbitmq_alarms_free_disk_space_watermark", ())] == 0
    stores = {dict(k[1])["store"] for k in samples if k[0] == "hare_store_bytes"}
    assert stores == {"persistent", "transient"}
    [identity] = [dict(k[1]) for k in samples if k[0] == "rabbitmq_identity_info"]
    assert identity["rabbitmq_node"].startswith("hare@")
    await q.delete(if_empty=False, if_unused=False)
    await conn.close()
