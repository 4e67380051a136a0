"""Publish and get over HTTP (the management UI's debugging tools), checked with aio-pika."""

from __future__ import annotations

import base64
import uuid

import aio_pika

from .helpers import MgmtBroker


async def test_publish_over_http_reaches_an_amqp_consumer(mgmt: MgmtBroker) -> None:
    qname = f"http-pub-{uuid.uuid4().hex[:6]}"
    mgmt.api("PUT", f"/api/queues/%2F/{qname}", {"durable": False})
    status, body = mgmt.api("POST", "/api/exchanges/%2F/amq.default/publish", {
        "routing_key": qname, "payload": "héllo", "payload_encoding": "string",
        "properties": {"content_type": "text/plain", "delivery_mode": 2,
                       "headers": {"k": "v"}, "type": "greeting", "timestamp": 1700000000}})
    assert (status, body) == (200, {"routed": True})
    status, body = mgmt.api("POST", "/api/exchanges/%2F/amq.fanout/publish",
                            {"routing_key": "", "payload": "nobody bound"})
    assert body == {"routed": False}
    status, body = mgmt.api("POST", "/api/exchanges/%2F/amq.default/publish", {
        "routing_key": qname, "payload": base64.b64encode(b"\x00\xff").decode(),
        "payload_encoding": "base64"})
    assert body == {"routed": True}

    conn = await aio_pika.connect(mgmt.url)
    ch = await conn.channel()
    q = await ch.declare_queue(qname, passive=True)
    first = await q.get(no_ack=True)
    assert first is not None
    assert first.body == "héllo".encode()
    assert (first.content_type, first.delivery_mode, first.type) == (
        "text/plain", aio_pika.DeliveryMode.PERSISTENT, "greeting")
    assert first.headers == {"k": "v"}
    assert int(first.timestamp.timestamp()) == 1700000000
    second = await q.get(no_ack=True)
    assert second is not None and second.body == b"\x00\xff"
    await conn.close()


async def test_get_over_http_requeues_or_acks(mgmt: MgmtBroker) -> None:
    qname = f"http-get-{uuid.uuid4().hex[:6]}"
    conn = await aio_pika.connect(mgmt.url)
    ch = await conn.channel()
    await ch.declare_queue(qname)
    for body in (b"one", b"two", b"\xff\xfe"):
        await ch.default_exchange.publish(
            aio_pika.Message(body, content_type="application/x-test"), routing_key=qname)
    await mgmt.until(f"/api/queues/%2F/{qname}", lambda d: d["messages"] == 3)

    status, got = mgmt.api("POST", f"/api/queues/%2F/{qname}/get",
                           {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert status == 200
    assert [(m["payload"], m["payload_encoding"], m["redelivered"]) for m in got] == [
        ("one", "string", False), ("two", "string", False)]
    assert got[0]["properties"]["content_type"] == "application/x-test"
    assert "reply_to" not in got[0]["properties"]  # unset properties are left out
    assert (got[0]["routing_key"], got[0]["exchange"], got[0]["message_count"]) == (
        qname, "", 2)
    info = await mgmt.until(f"/api/queues/%2F/{qname}", lambda d: d["messages"] == 3)
    assert info["messages_unacknowledged"] == 0

    status, got = mgmt.api("POST", f"/api/queues/%2F/{qname}/get",
                           {"count": 5, "ackmode": "ack_requeue_false"})
    assert len(got) == 3
    assert got[-1] == {**got[-1], "payload": base64.b64encode(b"\xff\xfe").decode(),
                       "payload_encoding": "base64", "payload_bytes": 2}
    assert {m["payload"] for m in got[:2]} == {"one", "two"}
    assert all(m["redelivered"] for m in got if m["payload"] in ("one", "two"))
    await mgmt.until(f"/api/queues/%2F/{qname}", lambda d: d["messages"] == 0)
    status, body = mgmt.api("POST", f"/api/queues/%2F/{qname}/get", {"ackmode": "nope"})
    assert status == 400 and "ackmode" in body["reason"]
    await conn.close()
