"""The service-bus design from the seed (a topic exchange shared by services WEB, REPO and CTRL):

- every service host opens one connection with three channels: one to produce, one consuming
  the service's shared queue TYPE, one consuming its own queue TYPE.<host>;
- TYPE is bound with key "TYPE", TYPE.<host> with "TYPE.<host>";
- rpc call: a request to "REPO.host2" carrying reply_to "WEB.host1"; the reply is routed to
  WEB.host1's own queue;
- rpc cast to a stateless service: key "CTRL", round-robin over the CTRL hosts' consumers;
- multicast "CTRL.*": every CTRL.<host> queue; broadcast "*.*": every TYPE.<host> queue.

One correction to the seed: in AMQP a routing key has no wildcards, only binding keys do. A
message published with key "CTRL.*" matches a binding "CTRL.host1" no more in RabbitMQ than in
Hare. So the group keys are literal: "bus" forwards every two-word key to a direct exchange
"bus.group" (an exchange-to-exchange binding "*.*"), where each TYPE.<host> queue is bound with
the literal keys "TYPE.*" and "*.*". The publisher still uses the seed's keys on "bus", and a
point-to-point key like "REPO.host2" finds no binding in "bus.group".

Each test asserts exactly which host (and which of its queues) got which message."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import aio_pika
import pytest
from aio_pika import ExchangeType, Message

pytestmark = pytest.mark.asyncio

EXCHANGE = "bus"
GROUP = "bus.group"
SERVICES = {"WEB": ["host1", "host2"], "REPO": ["host1", "host2"],
            "CTRL": ["host1", "host2", "host3"]}


class ServiceHost:
    """One service on one host: one connection, three channels."""

    def __init__(self, service: str, host: str, inbox: dict) -> None:
        self.service = service
        self.host = host
        self.name = f"{service}.{host}"
        self.inbox = inbox  # (service.host, queue) -> [(routing_key, body)]

    async def start(self, url: str) -> None:
        self.conn = await aio_pika.connect(url)
        self.produce = await self.conn.channel()
        self.type_ch = await self.conn.channel()
        self.host_ch = await self.conn.channel()
        await self.type_ch.set_qos(prefetch_count=10)
        await self.host_ch.set_qos(prefetch_count=10)
        self.exchange = await self.produce.declare_exchange(EXCHANGE, ExchangeType.TOPIC)
        group = await self.produce.declare_exchange(GROUP, ExchangeType.DIRECT)
        await group.bind(self.exchange, "*.*")
        type_q = await self.type_ch.declare_queue(self.service)
        await type_q.bind(EXCHANGE, self.service)
        host_q = await self.host_ch.declare_queue(self.name)
        await host_q.bind(EXCHANGE, self.name)
        await host_q.bind(GROUP, f"{self.service}.*")  # multicast
        await host_q.bind(GROUP, "*.*")  # broadcast
        await type_q.consume(self._consumer(self.service))
        await host_q.consume(self._consumer(self.name))

    def _consumer(self, queue: str):
        async def on_message(m: aio_pika.abc.AbstractIncomingMessage) -> None:
            await self._on_message(queue, m)

        return on_message

    async def _on_message(self, queue: str, m: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.inbox[(self.name, queue)].append((m.routing_key, m.body))
        if m.reply_to:  # an rpc call: answer to the caller's own queue
            await self.exchange.publish(
                Message(b"reply from " + self.name.encode() + b" to " + m.body,
                        correlation_id=m.correlation_id),
                routing_key=m.reply_to,
            )
        await m.ack()

    async def send(self, key: str, body: bytes, **props) -> None:
        await self.exchange.publish(Message(body, **props), routing_key=key)

    async def close(self) -> None:
        await self.conn.close()


@pytest.fixture
async def bus(fresh_broker):
    fresh_broker.start()
    inbox: dict = defaultdict(list)
    hosts: dict[str, ServiceHost] = {}
    for service, names in SERVICES.items():
        for host in names:  # one after another: consumer order is start order
            h = ServiceHost(service, host, inbox)
            await h.start(fresh_broker.url)
            hosts[h.name] = h
    yield hosts, inbox
    for h in hosts.values():
        await h.close()


async def settle(inbox: dict, total: int, timeout: float = 5.0) -> dict:
    """Wait for `total` deliveries, then a short quiet spell to catch any extra one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while sum(len(v) for v in inbox.values()) < total:
        assert loop.time() < deadline, dict(inbox)
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert sum(len(v) for v in inbox.values()) == total, dict(inbox)
    return {k: v for k, v in inbox.items() if v}


async def test_rpc_call_point_to_point_with_reply(bus):
    hosts, inbox = bus
    await hosts["WEB.host1"].send("REPO.host2", b"get /repo/1", reply_to="WEB.host1",
                                  correlation_id="call-1")
    got = await settle(inbox, 2)
    assert got == {
        ("REPO.host2", "REPO.host2"): [("REPO.host2", b"get /repo/1")],
        ("WEB.host1", "WEB.host1"): [("WEB.host1", b"reply from REPO.host2 to get /repo/1")],
    }


async def test_rpc_cast_to_stateless_service_round_robin(bus):
    hosts, inbox = bus
    for i in range(6):
        await hosts["WEB.host1"].send("CTRL", b"cast-%d" % i)
    got = await settle(inbox, 6)
    # the CTRL queue's consumers take turns, in the order they subscribed
    assert got == {
        ("CTRL.host1", "CTRL"): [("CTRL", b"cast-0"), ("CTRL", b"cast-3")],
        ("CTRL.host2", "CTRL"): [("CTRL", b"cast-1"), ("CTRL", b"cast-4")],
        ("CTRL.host3", "CTRL"): [("CTRL", b"cast-2"), ("CTRL", b"cast-5")],
    }


async def test_stateless_rpc_reply_to_a_service(bus):
    """CTRL answers to "WEB" (WEB stateless too): one of the WEB hosts gets the reply."""
    hosts, inbox = bus
    await hosts["WEB.host2"].send("CTRL", b"status?", reply_to="WEB", correlation_id="c2")
    got = await settle(inbox, 2)
    assert got.pop(("CTRL.host1", "CTRL")) == [("CTRL", b"status?")]
    ((who, queue), replies), = got.items()
    assert queue == "WEB" and who in ("WEB.host1", "WEB.host2")
    assert replies == [("WEB", b"reply from CTRL.host1 to status?")]


async def test_multicast_reaches_every_host_of_a_service(bus):
    hosts, inbox = bus
    await hosts["WEB.host1"].send("CTRL.*", b"reload config")
    got = await settle(inbox, 3)
    assert got == {
        (f"CTRL.{h}", f"CTRL.{h}"): [("CTRL.*", b"reload config")]
        for h in SERVICES["CTRL"]
    }


async def test_broadcast_reaches_every_host_of_every_service(bus):
    hosts, inbox = bus
    await hosts["REPO.host1"].send("*.*", b"shutdown at noon")
    total = sum(len(v) for v in SERVICES.values())
    got = await settle(inbox, total)
    assert got == {
        (f"{s}.{h}", f"{s}.{h}"): [("*.*", b"shutdown at noon")]
        for s, names in SERVICES.items()
        for h in names
    }


async def test_round_robin_across_a_type_queue(bus):
    hosts, inbox = bus
    for i in range(4):
        await hosts["CTRL.host3"].send("WEB", b"w%d" % i)
    for i in range(4):
        await hosts["CTRL.host3"].send("REPO", b"r%d" % i)
    got = await settle(inbox, 8)
    assert got == {
        ("WEB.host1", "WEB"): [("WEB", b"w0"), ("WEB", b"w2")],
        ("WEB.host2", "WEB"): [("WEB", b"w1"), ("WEB", b"w3")],
        ("REPO.host1", "REPO"): [("REPO", b"r0"), ("REPO", b"r2")],
        ("REPO.host2", "REPO"): [("REPO", b"r1"), ("REPO", b"r3")],
    }


async def test_round_robin_goes_on_when_a_host_leaves(bus):
    hosts, inbox = bus
    await hosts["CTRL.host2"].close()
    for i in range(4):
        await hosts["WEB.host1"].send("CTRL", b"c%d" % i)
    got = await settle(inbox, 4)
    assert sorted(got) == [("CTRL.host1", "CTRL"), ("CTRL.host3", "CTRL")]
    assert [len(v) for v in got.values()] == [2, 2]
    assert sorted(b for v in got.values() for _, b in v) == [b"c0", b"c1", b"c2", b"c3"]


async def test_wildcards_in_a_routing_key_are_literal(bus, fresh_broker):
    """Why the group exchange: "CTRL.*" is not a pattern when it is the routing key."""
    hosts, inbox = bus
    conn = await aio_pika.connect(fresh_broker.url)
    ch = await conn.channel()
    probe = await ch.declare_queue("", exclusive=True)
    await probe.bind(EXCHANGE, "CTRL.host1")  # a plain topic binding, as CTRL.host1's own
    await hosts["WEB.host1"].send("CTRL.*", b"group")
    await settle(inbox, 3)  # the three CTRL hosts, through bus.group
    assert await probe.get(no_ack=True, fail=False) is None
    await hosts["WEB.host1"].send("CTRL.host1", b"direct")
    await settle(inbox, 4)
    assert (await probe.get(no_ack=True)).body == b"direct"
    await conn.close()
