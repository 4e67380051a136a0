"""The HTTP auth backend against a small aiohttp auth service run by the test itself (real
sockets both ways): logins, tags, vhost, resource and topic questions; an auth service that is
down, slow or answers nonsense refuses, in bounded time, with a log line, and never holds up
other connections."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import aiormq
import pytest
from aiohttp import web
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.amqp_raw import RawClient
from tests.mgmt.helpers import MgmtBroker

TIMEOUT_S = 0.5


class AuthService:
    """alice/secret (management) may use vhost / and names starting with alice; her topic
    keys must start with alice.; slow/secret gets an answer after 3 s; odd/secret a
    nonsense answer."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, str]]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def _params(self, request: web.Request) -> dict[str, str]:
        form = await request.post() if request.method == "POST" else request.query
        return {k: str(v) for k, v in form.items()}

    async def user(self, request: web.Request) -> web.Response:
        p = await self._params(request)
        self.asked.append(("user", p))
        if p.get("username") == "slow":
            await asyncio.sleep(TIMEOUT_S * 6)
        if p.get("username") == "odd":
            return web.Response(text="maybe")
        if p.get("username") == "alice" and p.get("password") == "secret":
            return web.Response(text="allow management")
        return web.Response(text="deny")

    async def vhost(self, request: web.Request) -> web.Response:
        p = await self._params(request)
        self.asked.append(("vhost", p))
        ok = p["username"] == "alice" and p["vhost"] == "/" and p["ip"] == "127.0.0.1"
        return web.Response(text="allow" if ok else "deny")

    async def resource(self, request: web.Request) -> web.Response:
        p = await self._params(request)
        self.asked.append(("resource", p))
        ok = p["name"].startswith(("alice", "amq.gen-", "amq.topic"))
        return web.Response(text="allow" if ok else "deny")

    async def topic(self, request: web.Request) -> web.Response:
        p = await self._params(request)
        self.asked.append(("topic", p))
        ok = p["routing_key"].startswith(p["variable_map.username"] + ".")
        return web.Response(text="allow" if ok else "deny")

    async def start(self) -> None:
        app = web.Application()
        for name in ("user", "vhost", "resource", "topic"):
            app.router.add_route("*", f"/auth/{name}", getattr(self, name))
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def path(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/auth/{name}"


@pytest.fixture
async def service() -> AsyncIterator[AuthService]:
    s = AuthService()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
async def broker(service: AuthService, tmp_path: Any) -> AsyncIterator[MgmtBroker]:
    args = ["--auth-backends", "http", "--auth-http-method", "post",
            "--auth-http-timeout-s", str(TIMEOUT_S), "--auth-http-cache-ttl-s", "30"]
    for name in ("user", "vhost", "resource", "topic"):
        args += [f"--auth-http-{name}-path", service.path(name)]
    b = MgmtBroker(tmp_path / "data", args)
    await asyncio.to_thread(b.start)
    yield b
    await asyncio.to_thread(b.stop)


def url(b: MgmtBroker, user: str, password: str) -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{b.port}/"


def log_events(b: MgmtBroker, event: str) -> list[dict[str, Any]]:
    out = []
    for line in b.log_path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event:
            out.append(record)
    return out


async def test_service_answers_logins_and_every_check(broker: MgmtBroker,
                                                      service: AuthService) -> None:
    conn = await aio_pika.connect(url(broker, "alice", "secret"))
    ch = await conn.channel()
    await ch.declare_queue("alice-q", auto_delete=True)
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info:
        await ch.declare_queue("bob-q")
    assert "access to queue 'bob-q' in vhost '/' refused for user 'alice'" in str(info.value)
    ch = await conn.channel()
    topic = await ch.get_exchange("amq.topic")
    await topic.publish(aio_pika.Message(b"ok"), routing_key="alice.news")
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info:
        await topic.publish(aio_pika.Message(b"no"), routing_key="bob.news")
        await ch.declare_queue("alice-q2", auto_delete=True)  # a round trip after the publish
    assert "access to topic 'bob.news' in exchange 'amq.topic'" in str(info.value)
    kinds = {kind for kind, _ in service.asked}
    assert kinds == {"user", "vhost", "resource", "topic"}
    resource = next(p for kind, p in service.asked if kind == "resource"
                    and p["name"] == "bob-q")
    assert resource == {"username": "alice", "vhost": "/", "resource": "queue",
                        "name": "bob-q", "permission": "configure"}
    assert next(p for k, p in service.asked if k == "user") == {"username": "alice",
                                                               "password": "secret"}

    # the management API logs in through the same backend; tags come from its answer
    who = await asyncio.to_thread(broker.get, "/api/whoami", user="alice", password="secret")
    assert who == {"name": "alice", "tags": ["management"]}

    # answers are cached: a second login is not asked again (by the same process: each
    # worker of a multi-worker server keeps its own cache, so it may ask once)
    logins = sum(1 for k, _ in service.asked if k == "user")
    workers = len(broker.serving_pids())
    others = [await aio_pika.connect(url(broker, "alice", "secret")) for _ in range(3)]
    assert sum(1 for k, _ in service.asked if k == "user") - logins <= workers - 1
    for c in others:
        await c.close()
    await conn.close()


async def test_denied_slow_odd_and_down_services_refuse(broker: MgmtBroker,
                                                        service: AuthService) -> None:
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(url(broker, "alice", "wrong"))

    alice = await aio_pika.connect(url(broker, "alice", "secret"))  # connected before

    # a slow service: refused once the timeout is up, and other connections carry on meanwhile
    started = time.monotonic()
    slow = asyncio.create_task(aio_pika.connect(url(broker, "slow", "secret")))
    ch = await alice.channel()
    await ch.declare_queue("alice-busy", auto_delete=True)  # served while "slow" waits
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await slow
    assert time.monotonic() - started < TIMEOUT_S + 5

    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(url(broker, "odd", "secret"))

    await service.stop()  # down: a login that is not cached is refused
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(url(broker, "bob", "secret"))
    # and so is an operation the service was never asked about: no open door
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
        await ch.declare_queue("alice-new-while-down")
    await alice.close()

    causes = {r["cause"].split(":")[0] for r in log_events(broker, "HTTP auth service failed: "
                                                                    "access refused")}
    assert f"no answer within {TIMEOUT_S:g} s" in causes
    assert "unexpected answer 'maybe'" in causes
    assert any(c.startswith("ClientConnectorError") for c in causes), causes
    refused = {r["user"]: r for r in log_events(broker, "login refused")}
    assert set(refused) >= {"alice", "slow", "odd", "bob"}
    assert refused["alice"]["reason"] == "http: denied by the HTTP auth service"
    assert "wrong" not in broker.log_path.read_text()  # never the password



def _publish_burst(port: int, count: int) -> None:
    """`count` publishes to amq.topic (key alice.order) in one write on a fresh channel."""
    c = RawClient(port)
    try:
        c.handshake("alice", "secret")
        c.open_channel(1)
        c.send(b"".join(
            frame.marshal(part, 1)
            for i in range(count)
            for part in (commands.Basic.Publish(exchange="amq.topic", routing_key="alice.order"),
                         ContentHeader(0, len(str(i)), commands.Basic.Properties()),
                         ContentBody(str(i).encode()))))
        c.send_method(1, commands.Channel.Close(reply_code=200, class_id=0, method_id=0))
        c.expect(commands.Channel.CloseOk, 1)  # after every publish before it
    finally:
        c.close()


async def test_publishes_behind_an_unanswered_check_keep_their_order(
        broker: MgmtBroker, service: AuthService) -> None:
    """The first publish on a channel asks the service (write on amq.topic, the topic key);
    the ones that came in the same read, which the reader otherwise hands to the idle channel
    at once (Channel.publish_now), wait for that answer and follow it in order."""
    conn = await aio_pika.connect(url(broker, "alice", "secret"))
    ch = await conn.channel()
    q = await ch.declare_queue("alice-order")
    await q.bind("amq.topic", "alice.order")
    await asyncio.to_thread(_publish_burst, broker.port, 50)
    got: list[int] = []
    while (m := await q.get(no_ack=True, fail=False)) is not None:
        got.append(int(m.body))
    assert got == list(range(50))
    assert any(k == "topic" and p["routing_key"] == "alice.order" for k, p in service.asked)
    await conn.close()
