"""The exchange types RabbitMQ gets from plugins, through the management API: listed in the
overview, declared, bound and refused with the plugin's reasons."""

from __future__ import annotations

import uuid

import aio_pika

from .helpers import MgmtBroker


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_overview_lists_the_exchange_types(mgmt: MgmtBroker) -> None:
    types = {t["name"] for t in mgmt.get("/api/overview")["exchange_types"]}
    assert {"direct", "fanout", "topic", "headers", "x-consistent-hash"} <= types


def test_consistent_hash_exchange_through_the_api(mgmt: MgmtBroker) -> None:
    x, q = unique("chx"), unique("chq")
    assert mgmt.api("PUT", f"/api/exchanges/%2F/{x}", {
        "type": "x-consistent-hash", "durable": True,
        "arguments": {"hash-header": "user"}})[0] == 201
    ex = mgmt.get(f"/api/exchanges/%2F/{x}")
    assert (ex["type"], ex["arguments"]) == ("x-consistent-hash", {"hash-header": "user"})
    mgmt.api("PUT", f"/api/queues/%2F/{q}", {})
    status, err = mgmt.api("POST", f"/api/bindings/%2F/e/{x}/q/{q}", {"routing_key": "one"})
    assert status == 400 and "binding key must be an integer" in err["reason"], err
    assert mgmt.api("POST", f"/api/bindings/%2F/e/{x}/q/{q}", {"routing_key": "5"})[0] == 201
    status, err = mgmt.api("PUT", f"/api/exchanges/%2F/{unique('chx')}", {
        "type": "x-consistent-hash", "arguments": {"hash-property": "user_id"}})
    assert status == 400 and "Unsupported property: user_id" in err["reason"], err


async def test_delayed_exchange_shows_what_it_holds_and_hides_its_queues(
        mgmt: MgmtBroker) -> None:
    x, q = unique("dx"), unique("dq")
    assert mgmt.api("PUT", f"/api/exchanges/%2F/{x}", {
        "type": "x-delayed-message", "arguments": {"x-delayed-type": "direct"}})[0] == 201
    assert mgmt.get(f"/api/exchanges/%2F/{x}")["messages_delayed"] == 0
    mgmt.api("PUT", f"/api/queues/%2F/{q}", {})
    mgmt.api("POST", f"/api/bindings/%2F/e/{x}/q/{q}", {"routing_key": "k"})
    conn = await aio_pika.connect(mgmt.url)
    ch = await conn.channel()
    ex = await ch.get_exchange(x)
    for delay in (600, 600, 900):
        await ex.publish(aio_pika.Message(b"m", headers={"x-delay": delay}), routing_key="k")
    await ex.publish(aio_pika.Message(b"now"), routing_key="k")
    await mgmt.until(f"/api/exchanges/%2F/{x}", lambda e: e["messages_delayed"] == 3)
    assert x not in "".join(qd["name"] for qd in mgmt.get("/api/queues/%2F"))
    assert "x-delayed-message" in {
        t["name"] for t in mgmt.get("/api/overview")["exchange_types"]}
    await mgmt.until(f"/api/exchanges/%2F/{x}", lambda e: e["messages_delayed"] == 0)
    await mgmt.until(f"/api/queues/%2F/{q}", lambda d: d["messages"] == 4)
    await conn.close()
