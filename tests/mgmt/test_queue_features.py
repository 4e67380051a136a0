"""What the management API (and hare-ctl) show of queue features, as RabbitMQ 3.10 shows them:
single active consumer (single_active_consumer_tag, consumer active / activity_status),
exclusive consumers, and the real type of a queue declared as quorum."""

from __future__ import annotations

import aio_pika
import pytest

from .helpers import MgmtBroker

pytestmark = pytest.mark.asyncio


async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    """Keep deliveries unacknowledged."""


def by_tag(details: list[dict]) -> dict[str, tuple[bool, str]]:
    return {c["consumer_tag"]: (c["active"], c["activity_status"]) for c in details}


async def test_single_active_consumer_shown_as_rabbitmq(mgmt: MgmtBroker) -> None:
    conn = await aio_pika.connect(mgmt.url)
    ch1, ch2 = await conn.channel(), await conn.channel()
    q1 = await ch1.declare_queue("mgmt.sac", arguments={"x-single-active-consumer": True},
                                 auto_delete=True)
    q2 = await ch2.get_queue("mgmt.sac")
    await q1.consume(hold, consumer_tag="one")
    await q2.consume(hold, consumer_tag="two")
    path = "/api/queues/%2F/mgmt.sac"
    q = await mgmt.until(path, lambda d: d["consumers"] == 2)
    assert q["single_active_consumer_tag"] == "one"
    assert q["exclusive_consumer_tag"] is None
    assert by_tag(q["consumer_details"]) == {
        "one": (True, "single_active"), "two": (False, "waiting")}
    listed = [c for c in mgmt.get("/api/consumers/%2F") if c["queue"]["name"] == "mgmt.sac"]
    assert by_tag(listed) == by_tag(q["consumer_details"])
    await q1.cancel("one")
    q = await mgmt.until(path, lambda d: d["consumers"] == 1)
    assert q["single_active_consumer_tag"] == "two"
    assert by_tag(q["consumer_details"]) == {"two": (True, "single_active")}
    await conn.close()


async def test_plain_and_exclusive_consumers_are_up(mgmt: MgmtBroker) -> None:
    conn = await aio_pika.connect(mgmt.url)
    ch = await conn.channel()
    q = await ch.declare_queue("mgmt.excl", auto_delete=True)
    await q.consume(hold, consumer_tag="solo", exclusive=True)
    body = await mgmt.until("/api/queues/%2F/mgmt.excl", lambda d: d["consumers"] == 1)
    assert body["exclusive_consumer_tag"] == "solo"
    assert body["single_active_consumer_tag"] is None
    assert by_tag(body["consumer_details"]) == {"solo": (True, "up")}
    await conn.close()


async def test_stream_queue_shows_its_real_type(mgmt: MgmtBroker) -> None:
    conn = await aio_pika.connect(mgmt.url)
    ch = await conn.channel()
    await ch.declare_queue("mgmt.stream", durable=True, arguments={"x-queue-type": "stream"})
    body = mgmt.get("/api/queues/%2F/mgmt.stream")
    assert body["type"] == "stream"
    assert body["arguments"] == {"x-queue-type": "stream"}
    assert (body["first_offset"], body["last_offset"], body["messages"]) == (0, -1, 0)
    await ch.queue_delete("mgmt.stream")
    await conn.close()
