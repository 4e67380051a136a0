"""Authentication and tags; vhosts, users and permissions over HTTP, checked with AMQP logins."""

from __future__ import annotations

import asyncio
import base64
import urllib.request
import uuid

import aio_pika
import aiormq
import pytest

from broker.config import hash_password

from .helpers import MgmtBroker


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def amqp_url(mgmt: MgmtBroker, user: str, password: str, vhost: str = "/") -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{mgmt.port}/{vhost.replace('/', '%2F')}"


def add_user(mgmt: MgmtBroker, name: str, password: str, tags: str) -> None:
    status, _ = mgmt.api("PUT", f"/api/users/{name}", {"password": password, "tags": tags})
    assert status == 201


def test_auth_required_and_wrong_password_refused(mgmt: MgmtBroker) -> None:
    status, _, text = mgmt.raw("/api/overview")
    assert status == 401 and "not_authorised" in text
    status, body = mgmt.api("GET", "/api/overview", password="wrong")
    assert status == 401
    assert body == {"error": "not_authorised", "reason": "Not_Authorized"}
    status, body = mgmt.api("GET", "/api/overview", user="nobody")
    assert status == 401


def test_monitoring_reads_only_and_untagged_users_are_refused(mgmt: MgmtBroker) -> None:
    watcher, plain = unique("watch"), unique("plain")
    add_user(mgmt, watcher, "pw1", "monitoring")
    add_user(mgmt, plain, "pw2", "")
    ov = mgmt.get("/api/overview", user=watcher, password="pw1")
    assert ov["product_name"] == "Hare"
    assert mgmt.get("/api/whoami", user=watcher, password="pw1") == {
        "name": watcher, "tags": ["monitoring"]}
    # no permissions in "/": as RabbitMQ 3.10.8, the vhost is not the watcher's
    status, body = mgmt.api("PUT", "/api/queues/%2F/nope", {}, user=watcher, password="pw1")
    assert (status, body["reason"]) == (401, "User not authorised to access virtual host")
    assert mgmt.api("GET", "/api/queues/%2F/nope")[0] == 404  # not created
    for secret in ("/api/users", f"/api/users/{watcher}", "/api/definitions",
                   "/api/permissions", "/api/vhosts/%2F/permissions"):
        status, body = mgmt.api("GET", secret, user=watcher, password="pw1")
        assert (status, body["reason"]) == (401, "Not administrator user"), secret
    status, body = mgmt.api("GET", "/api/overview", user=plain, password="pw2")
    assert (status, body["reason"]) == (401, "Not management user")


def test_page_and_metrics_need_no_credentials(mgmt: MgmtBroker) -> None:
    status, ctype, text = mgmt.raw("/")
    assert status == 200 and ctype.startswith("text/html")
    assert "<title>Hare management</title>" in text
    status, ctype, text = mgmt.raw("/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert "rabbitmq_queues " in text


async def test_users_put_get_delete_and_amqp_login(mgmt: MgmtBroker) -> None:
    name = unique("alice")
    add_user(mgmt, name, "s3cret", "administrator,monitoring")
    user = mgmt.get(f"/api/users/{name}")
    assert user["tags"] == ["administrator", "monitoring"]
    assert user["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert len(base64.b64decode(user["password_hash"])) == 36  # 4-byte salt + SHA-256
    assert name in {u["name"] for u in mgmt.get("/api/users")}

    # no permissions yet: connection.open is refused
    with pytest.raises(aiormq.exceptions.AMQPError):
        await aio_pika.connect(amqp_url(mgmt, name, "s3cret"))
    assert mgmt.api("PUT", f"/api/permissions/%2F/{name}",
                    {"configure": "^x-.*", "write": ".*", "read": ".*"})[0] == 201
    assert mgmt.get(f"/api/permissions/%2F/{name}") == {
        "user": name, "vhost": "/", "configure": "^x-.*", "write": ".*", "read": ".*"}
    assert [p["vhost"] for p in mgmt.get(f"/api/users/{name}/permissions")] == ["/"]
    conn = await aio_pika.connect(amqp_url(mgmt, name, "s3cret"))
    ch = await conn.channel()
    await ch.declare_queue(f"x-{name}", auto_delete=True)
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
        await ch.declare_queue(f"y-{name}")
    await conn.close()

    # a user set with a RabbitMQ-style password_hash logs in with the password
    other = unique("bob")
    status, _ = mgmt.api("PUT", f"/api/users/{other}", {
        "password_hash": hash_password("from-hash"), "tags": ["monitoring"],
        "hashing_algorithm": "rabbit_password_hashing_sha256"})
    assert status == 201
    assert mgmt.get("/api/whoami", user=other, password="from-hash")["tags"] == ["monitoring"]
    status, body = mgmt.api("PUT", f"/api/users/{other}", {
        "password_hash": "x", "hashing_algorithm": "rabbit_password_hashing_md5"})
    assert status == 400 and "not supported" in body["reason"]
    status, body = mgmt.api("PUT", f"/api/users/{unique('c')}", {"tags": ""})
    assert status == 400 and "password or password_hash" in body["reason"]

    assert mgmt.api("DELETE", f"/api/users/{name}")[0] == 204
    assert mgmt.api("GET", f"/api/users/{name}")[0] == 404
    assert mgmt.api("GET", f"/api/permissions/%2F/{name}")[0] == 404
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(amqp_url(mgmt, name, "s3cret"))


async def test_vhosts_put_get_delete(mgmt: MgmtBroker) -> None:
    vname = unique("vh/with/slashes")
    path = "/api/vhosts/" + urllib.request.quote(vname, safe="")
    assert mgmt.api("PUT", path, {"description": "test"})[0] == 201
    assert mgmt.api("PUT", path, {})[0] == 204
    assert vname in {v["name"] for v in mgmt.get("/api/vhosts")}
    # the creating user (guest) got full permissions on it
    perm = [p for p in mgmt.get("/api/permissions") if p["vhost"] == vname]
    assert [(p["user"], p["configure"]) for p in perm] == [("guest", ".*")]

    conn = await aiormq.connect(amqp_url(mgmt, "guest", "guest", vname))
    ch = await conn.channel()
    await ch.queue_declare("inside")
    await ch.basic_publish(b"1", routing_key="inside")
    vq = urllib.request.quote(vname, safe="")
    await mgmt.until(f"/api/queues/{vq}/inside", lambda d: d["messages"] == 1)
    assert mgmt.get(path)["messages"] == 1
    assert [x["name"] for x in mgmt.get(f"/api/queues/{vq}")] == ["inside"]
    assert all(x["vhost"] != vname for x in mgmt.get("/api/queues/%2F"))

    # deleting the vhost closes its connections and drops its queues and permissions
    assert mgmt.api("DELETE", path)[0] == 204
    with pytest.raises(aiormq.exceptions.ConnectionClosed) as closed:
        await asyncio.wait_for(conn.closing, 5)
    assert closed.value.args[0] == 320
    assert mgmt.api("GET", path)[0] == 404
    assert all(p["vhost"] != vname for p in mgmt.get("/api/permissions"))
    with pytest.raises(aiormq.exceptions.AMQPError):  # connection.open: vhost not found
        await aio_pika.connect(amqp_url(mgmt, "guest", "guest", vname))
