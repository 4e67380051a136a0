"""/api/definitions: RabbitMQ's export format out, a RabbitMQ export in, and a round trip
between two brokers; what the API creates survives a restart."""

from __future__ import annotations

from pathlib import Path

import aio_pika
import aiormq
import pytest
from aio_pika import ExchangeType, Message

from broker.config import hash_password

from .helpers import MgmtBroker

# The shape RabbitMQ 3.12's "Export definitions" writes (values of our own; the password hash
# is the same salted SHA-256 scheme, so it is what RabbitMQ would have written for "rpw").
RABBITMQ_EXPORT = {
    "rabbit_version": "3.12.13",
    "rabbitmq_version": "3.12.13",
    "product_name": "RabbitMQ",
    "product_version": "3.12.13",
    "users": [
        {"name": "imported", "password_hash": hash_password("rpw", salt=b"\x01\x02\x03\x04"),
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["management"],
         "limits": {}},
        {"name": "imported-admin", "password_hash": hash_password("apw"),
         "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": "administrator",
         "limits": {}},
    ],
    "vhosts": [{"name": "orders", "limits": [], "metadata": {"description": "", "tags": []}}],
    "permissions": [
        {"user": "imported", "vhost": "orders", "configure": ".*", "write": ".*",
         "read": ".*"},
    ],
    "topic_permissions": [
        {"user": "imported", "vhost": "orders", "exchange": "", "write": ".*", "read": ".*"},
    ],
    "parameters": [],
    "global_parameters": [{"name": "cluster_name", "value": "rabbit@prod"}],
    "policies": [{"vhost": "orders", "name": "ttl", "pattern": ".*", "apply-to": "queues",
                  "definition": {"message-ttl": 600000}, "priority": 0}],
    "queues": [
        {"name": "orders.new", "vhost": "orders", "durable": True, "auto_delete": False,
         "arguments": {"x-queue-type": "classic", "x-max-length": 1000}},
        {"name": "orders.audit", "vhost": "orders", "durable": True, "auto_delete": False,
         "arguments": {}},
    ],
    "exchanges": [
        {"name": "orders.in", "vhost": "orders", "type": "topic", "durable": True,
         "auto_delete": False, "internal": False, "arguments": {}},
        {"name": "orders.all", "vhost": "orders", "type": "fanout", "durable": True,
         "auto_delete": False, "internal": False, "arguments": {}},
    ],
    "bindings": [
        {"source": "orders.in", "vhost": "orders", "destination": "orders.new",
         "destination_type": "queue", "routing_key": "order.created", "arguments": {}},
        {"source": "orders.in", "vhost": "orders", "destination": "orders.all",
         "destination_type": "exchange", "routing_key": "#", "arguments": {}},
        {"source": "orders.all", "vhost": "orders", "destination": "orders.audit",
         "destination_type": "queue", "routing_key": "", "arguments": {}},
    ],
}


@pytest.fixture
def second(tmp_path: Path):
    b = MgmtBroker(tmp_path / "second").start()
    yield b
    b.stop()


async def test_export_has_durable_topology_in_rabbitmq_format(mgmt: MgmtBroker) -> None:
    conn = await aio_pika.connect(mgmt.url)
    ch = await conn.channel()
    ex = await ch.declare_exchange("exp.x", ExchangeType.DIRECT, durable=True)
    q = await ch.declare_queue("exp.q", durable=True, arguments={"x-message-ttl": 60000})
    await q.bind(ex, routing_key="k1")
    await ch.declare_queue("exp.transient", durable=False)
    await ch.declare_queue("exp.exclusive", exclusive=True, durable=True)
    defs = mgmt.get("/api/definitions")
    assert defs["rabbit_version"] and defs["product_name"] == "Hare"
    assert {"name": "guest", "tags": ["administrator"],
            "hashing_algorithm": "rabbit_password_hashing_sha256"}.items() <= next(
        u for u in defs["users"] if u["name"] == "guest").items()
    assert {"name": "/", "limits": [], "metadata": {"description": "", "tags": []}} in defs[
        "vhosts"]
    assert {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*",
            "read": ".*"} in defs["permissions"]
    assert {"name": "exp.q", "vhost": "/", "durable": True, "auto_delete": False,
            "arguments": {"x-message-ttl": 60000}} in defs["queues"]
    names = {x["name"] for x in defs["queues"]}
    assert "exp.transient" not in names and "exp.exclusive" not in names
    assert {"name": "exp.x", "vhost": "/", "type": "direct", "durable": True,
            "auto_delete": False, "internal": False, "arguments": {}} in defs["exchanges"]
    assert not any(x["name"].startswith("amq.") or x["name"] == "" for x in defs["exchanges"])
    assert defs["bindings"] == [
        b for b in defs["bindings"] if b["source"] != ""]  # no implicit default bindings
    assert {"source": "exp.x", "vhost": "/", "destination": "exp.q",
            "destination_type": "queue", "routing_key": "k1", "arguments": {}} in defs[
        "bindings"]
    await conn.close()


async def test_import_rabbitmq_export_then_use_it_over_amqp(second: MgmtBroker) -> None:
    status, _ = second.api("POST", "/api/definitions", RABBITMQ_EXPORT)
    assert status == 204
    users = {u["name"]: u for u in second.get("/api/users")}
    assert users["imported"]["tags"] == ["management"]
    assert users["imported"]["password_hash"] == RABBITMQ_EXPORT["users"][0]["password_hash"]
    assert users["imported-admin"]["tags"] == ["administrator"]  # "a,b" strings become lists
    assert second.get("/api/whoami", user="imported-admin", password="apw")["name"] == (
        "imported-admin")
    q = second.get("/api/queues/orders/orders.new")
    assert q["arguments"] == {"x-queue-type": "classic", "x-max-length": 1000}
    assert q["durable"] is True
    assert (q["policy"], q["effective_policy_definition"]) == ("ttl", {"message-ttl": 600000})

    conn = await aio_pika.connect(f"amqp://imported:rpw@127.0.0.1:{second.port}/orders")
    ch = await conn.channel()
    ex = await ch.get_exchange("orders.in")
    await ex.publish(Message(b"o-1"), routing_key="order.created")
    await ex.publish(Message(b"o-2"), routing_key="order.cancelled")
    await second.until("/api/queues/orders/orders.audit", lambda d: d["messages"] == 2)
    assert second.get("/api/queues/orders/orders.new")["messages"] == 1
    await conn.close()

    # a Hare export loads into another broker unchanged: same topology either way
    exported = second.get("/api/definitions")
    for section in ("queues", "exchanges", "bindings", "permissions", "policies"):
        assert sorted(map(str, exported[section])) == sorted(
            map(str, RABBITMQ_EXPORT[section] if section != "permissions"
                else RABBITMQ_EXPORT[section] + [p for p in exported[section]
                                                 if p["user"] == "guest"])), section


async def test_import_errors_name_the_item(second: MgmtBroker) -> None:
    bad = {"queues": [{"name": "q", "vhost": "missing", "durable": True}]}
    status, body = second.api("POST", "/api/definitions", bad)
    assert status == 400
    assert "vhost 'missing' does not exist" in body["reason"]
    status, body = second.api("POST", "/api/definitions", {"exchanges": [
        {"name": "e", "vhost": "/", "type": "nonsense"}]})
    assert status == 400 and "unknown exchange type" in body["reason"]
    status, body = second.api("POST", "/api/definitions", {"users": [
        {"name": "u", "password_hash": "abc",
         "hashing_algorithm": "rabbit_password_hashing_sha512"}]})
    assert status == 400 and "sha512" in body["reason"]


async def test_api_changes_survive_a_restart(tmp_path: Path) -> None:
    b = MgmtBroker(tmp_path / "restart").start()
    try:
        b.api("PUT", "/api/vhosts/keep", {})
        b.api("PUT", "/api/users/carol", {"password": "pw", "tags": "monitoring"})
        b.api("PUT", "/api/permissions/keep/carol", {"configure": "", "write": ".*",
                                                     "read": ".*"})
        b.api("PUT", "/api/queues/keep/kq", {"durable": True})
        b.api("PUT", "/api/vhosts/gone", {})
        b.api("DELETE", "/api/vhosts/gone")
        b.stop()
        b.start()
        assert b.get("/api/whoami", user="carol", password="pw")["tags"] == ["monitoring"]
        assert b.get("/api/permissions/keep/carol")["configure"] == ""
        assert b.get("/api/queues/keep/kq")["durable"] is True
        assert {v["name"] for v in b.get("/api/vhosts")} == {"/", "keep"}
        conn = await aiormq.connect(f"amqp://carol:pw@127.0.0.1:{b.port}/keep")
        await conn.close()
    finally:
        b.stop()
