"""Dynamic shovels (broker/shovel) over real sockets: defined through the management API,
moving messages between queues of real brokers with aio-pika clients on both ends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from broker.amqp_uri import LocalBroker
from broker.shovel.definition import parse_definition
from broker.shovel.worker import Shovel
from tests.conftest import BrokerProc
from tests.mgmt.helpers import MgmtBroker
from tests.plugin_helpers import queue_depth, rabbitmq_answers

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def hare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtBroker]:
    b = MgmtBroker(tmp_path_factory.mktemp("shovel") / "data").start()
    yield b
    b.stop()


async def _publish(url: str, queue: str, bodies: list[bytes]) -> None:
    async with await aio_pika.connect(url) as conn:
        ch = await conn.channel()
        await ch.declare_queue(queue, durable=True)
        for body in bodies:
            await ch.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), queue)


async def _publish_fast(url: str, queue: str, bodies: list[bytes]) -> None:
    """Without confirms, ended by a round trip: everything before it is enqueued."""
    async with await aio_pika.connect(url) as conn:
        ch = await conn.channel(publisher_confirms=False)
        await ch.declare_queue(queue, durable=True)
        for body in bodies:
            await ch.default_exchange.publish(aio_pika.Message(body), queue)
        await ch.declare_queue(queue, durable=True)


async def _drain(url: str, queue: str, count: int, timeout: float = 30.0) -> list[bytes]:
    """The first `count` messages of `queue`, acked, in delivery order."""
    got: list[bytes] = []
    async with await aio_pika.connect(url) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue(queue, durable=True)
        async with asyncio.timeout(timeout), q.iterator() as it:
            async for msg in it:
                await msg.ack()
                got.append(msg.body)
                if len(got) == count:
                    break
    return got



async def _until_depth(url: str, queue: str, want: int, timeout: float = 10.0) -> None:
    """The last acks may land a moment after the destination has every message."""
    async with asyncio.timeout(timeout):
        while await queue_depth(url, queue) != want:
            await asyncio.sleep(0.05)


def _shovel(b: MgmtBroker, name: str, value: dict[str, Any]) -> None:
    status, body = b.api("PUT", f"/api/parameters/shovel/%2F/{name}", {"value": value})
    assert status in (201, 204), body


async def _state(b: MgmtBroker, name: str, check: Any, timeout: float = 20.0) -> dict[str, Any]:
    rows = await b.until("/api/shovels", lambda rows: any(
        r["name"] == name and check(r) for r in rows), timeout)
    return next(r for r in rows if r["name"] == name)


async def test_moves_every_message_in_order_and_empties_the_source(hare: MgmtBroker) -> None:
    bodies = [f"m{i}".encode() for i in range(500)]
    await _publish(hare.url, "sv.src", bodies)
    _shovel(hare, "move", {"src-uri": "amqp://", "src-queue": "sv.src",
                           "dest-uri": "amqp://", "dest-queue": "sv.dest",
                           "src-prefetch-count": 50})
    row = await _state(hare, "move", lambda r: r["state"] == "running")
    assert row["vhost"] == "/" and row["src_queue"] == "sv.src"
    assert await _drain(hare.url, "sv.dest", 500) == bodies
    await _until_depth(hare.url, "sv.src", 0)
    assert hare.get("/api/parameters/shovel/%2F/move")["value"]["dest-queue"] == "sv.dest"
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/move")[0] == 204


async def test_a_restart_while_messages_flow_duplicates_none(hare: MgmtBroker) -> None:
    """An update restarts the shovel (as a move to another worker does): the old session
    cancels its consumer and finishes what it holds before it ends. Cancelled mid-flight, the
    publishes it had sent came back to the source unacked and were shovelled twice."""
    count = 20_000
    bodies = [f"f{i}".encode() for i in range(count)]
    await _publish_fast(hare.url, "sv.flow", bodies)
    value = {"src-uri": "amqp://", "src-queue": "sv.flow", "dest-uri": "amqp://",
             "dest-queue": "sv.flow.dest", "src-prefetch-count": 1000}
    _shovel(hare, "flow", value)
    await _state(hare, "flow", lambda r: r.get("messages_moved", 0) > 0, timeout=30)
    _shovel(hare, "flow", {**value, "src-prefetch-count": 999})  # a restart mid-flow
    got = await _drain(hare.url, "sv.flow.dest", count, timeout=120)
    assert sorted(got) == sorted(bodies), (
        f"{len(got) - len(set(got))} duplicated, {len(set(bodies) - set(got))} missing")
    await _until_depth(hare.url, "sv.flow", 0, timeout=30)
    await asyncio.sleep(0.5)  # a duplicate would follow the last message
    assert await queue_depth(hare.url, "sv.flow.dest") == 0
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/flow")[0] == 204


async def test_properties_travel_and_user_id_is_dropped(hare: MgmtBroker) -> None:
    """The message's properties and headers reach the destination as published; user_id is
    left out, since the destination checks it against the shovel's own login."""
    async with await aio_pika.connect(hare.url) as conn:
        ch = await conn.channel()
        await ch.declare_queue("sv.props", durable=True)
        await ch.default_exchange.publish(aio_pika.Message(
            b"p", headers={"k": "v", "n": 7}, content_type="text/plain", priority=3,
            correlation_id="c-1", message_id="m-1", reply_to="r", type="t", app_id="a",
            user_id="guest", delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "sv.props")
    _shovel(hare, "props", {"src-uri": "amqp://", "src-queue": "sv.props",
                            "dest-uri": "amqp://", "dest-queue": "sv.props.dest"})
    async with await aio_pika.connect(hare.url) as conn:
        q = await (await conn.channel()).declare_queue("sv.props.dest", durable=True)
        async with asyncio.timeout(20), q.iterator() as it:
            async for msg in it:
                await msg.ack()
                break
    assert msg.headers == {"k": "v", "n": 7} and msg.content_type == "text/plain"
    assert (msg.priority, msg.correlation_id, msg.message_id) == (3, "c-1", "m-1")
    assert (msg.reply_to, msg.type, msg.app_id) == ("r", "t", "a")
    assert msg.delivery_mode == aio_pika.DeliveryMode.PERSISTENT and msg.user_id is None
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/props")[0] == 204


async def test_src_delete_after_queue_length_moves_what_was_there_then_goes(
        hare: MgmtBroker) -> None:
    await _publish(hare.url, "sv.once", [b"%d" % i for i in range(100)])
    _shovel(hare, "once", {"src-uri": "amqp://", "src-queue": "sv.once",
                           "dest-uri": "amqp://", "dest-queue": "sv.once.dest",
                           "src-delete-after": "queue-length"})
    await hare.until("/api/parameters/shovel", lambda rows: not any(
        r["name"] == "once" for r in rows), timeout=20)
    assert await queue_depth(hare.url, "sv.once.dest") == 100
    assert not any(r["name"] == "once" for r in hare.get("/api/shovels"))


@pytest.mark.parametrize(("value", "reason"), [
    ({"src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}, "src-uri"),
    ({"src-uri": "amqp://", "dest-uri": "amqp://", "dest-queue": "b"}, "src-queue"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b",
      "ack-mode": "sometimes"}, "ack-mode"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b",
      "colour": "blue"}, "colour"),
    ({"src-uri": "http://x", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"},
     "src-uri"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b",
      "src-delete-after": "later"}, "src-delete-after"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b",
      "dest-protocol": "amqp10"}, "amqp091"),
    ("not an object", "object"),
    # the plugin's own checks (rabbit_shovel_parameters), with its texts
    ({"src-uri": "amqp://", "src-queue": "a", "src-exchange": "x", "dest-uri": "amqp://"},
     "Cannot specify 'src-exchange' and 'src-queue'"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b",
      "dest-exchange": "x"}, "Cannot specify 'dest-exchange' and 'dest-queue'"),
    ({"src-uri": "amqp://h:99999", "src-queue": "a", "dest-uri": "amqp://"},
     'src-uri: "amqp://h:99999" not a valid URI'),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": ["amqp://", "amqp://h:port"]},
     'dest-uri: "amqp://h:port" not a valid URI'),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://[::1"}, "not a valid URI"),
    ({"src-uri": "amqp://h/a/b", "src-queue": "a", "dest-uri": "amqp://"}, "one path segment"),
    ({"src-uri": [], "src-queue": "a", "dest-uri": "amqp://"}, "src-uri"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
      "src-prefetch-count": -1}, "src-prefetch-count"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
      "prefetch-count": 70000}, "src-prefetch-count"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
      "src-prefetch-count": 2.5}, "src-prefetch-count"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
      "reconnect-delay": -1}, "reconnect-delay"),
    ({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://", "ack-mode": "no-ack",
      "src-delete-after": 10}, "Cannot specify 'no-ack' and numerical 'delete-after'"),
    ({"src-uri": "amqp://", "src-queue": "q" * 256, "dest-uri": "amqp://"}, "255 bytes"),
    ({"src-uri": "amqp://", "src-queue": 7, "dest-uri": "amqp://"}, "src-queue"),
])
async def test_a_malformed_definition_is_refused_and_nothing_changes(
        hare: MgmtBroker, value: Any, reason: str) -> None:
    status, body = hare.api("PUT", "/api/parameters/shovel/%2F/bad", {"value": value})
    assert status == 400 and reason in body["reason"], body
    assert body["reason"].startswith("Validation failed\n\n")  # RabbitMQ's form
    assert hare.api("GET", "/api/parameters/shovel/%2F/bad")[0] == 404
    assert not any(r["name"] == "bad" for r in hare.get("/api/shovels"))


async def test_a_malformed_update_leaves_the_running_shovel_as_it_was(
        hare: MgmtBroker) -> None:
    value = {"src-uri": "amqp://", "src-queue": "sv.keep", "dest-uri": "amqp://",
             "dest-queue": "sv.keep.dest"}
    _shovel(hare, "keep", value)
    await _state(hare, "keep", lambda r: r["state"] == "running")
    status, body = hare.api("PUT", "/api/parameters/shovel/%2F/keep",
                            {"value": {**value, "src-prefetch-count": -5}})
    assert status == 400 and "src-prefetch-count" in body["reason"]
    assert hare.get("/api/parameters/shovel/%2F/keep")["value"] == value
    await _publish(hare.url, "sv.keep", [b"still shovelled"])
    assert await _drain(hare.url, "sv.keep.dest", 1) == [b"still shovelled"]
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/keep")[0] == 204


async def test_the_plugins_older_key_names_are_accepted(hare: MgmtBroker) -> None:
    """prefetch-count and delete-after, the pre-3.7 names the plugin still reads (its own
    README's example uses them)."""
    await _publish(hare.url, "sv.old", [b"1", b"2", b"3"])
    _shovel(hare, "old", {"src-uri": "amqp://", "src-queue": "sv.old", "dest-uri": "amqp://",
                          "dest-queue": "sv.old.dest", "prefetch-count": 5,
                          "delete-after": "queue-length"})
    await hare.until("/api/parameters/shovel", lambda rows: not any(
        r["name"] == "old" for r in rows), timeout=20)
    assert await _drain(hare.url, "sv.old.dest", 3) == [b"1", b"2", b"3"]


async def test_delete_stops_the_shovel(hare: MgmtBroker) -> None:
    _shovel(hare, "stopme", {"src-uri": "amqp://", "src-queue": "sv.stop",
                             "dest-uri": "amqp://", "dest-queue": "sv.stop.dest"})
    await _state(hare, "stopme", lambda r: r["state"] == "running")
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/stopme")[0] == 204
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/stopme")[0] == 404
    # its consumer goes with it: once the source has none, a message published stays there
    await hare.until("/api/queues/%2F/sv.stop", lambda q: q.get("consumers") == 0, timeout=10)
    await _publish(hare.url, "sv.stop", [b"stays"])
    await asyncio.sleep(0.5)
    assert await queue_depth(hare.url, "sv.stop") == 1
    assert not any(r["name"] == "stopme" for r in hare.get("/api/shovels"))


async def test_the_management_plugins_delete_path_deletes_a_dynamic_shovel(
        hare: MgmtBroker) -> None:
    _shovel(hare, "viashovels", {"src-uri": "amqp://", "src-queue": "sv.via",
                                 "dest-uri": "amqp://", "dest-queue": "sv.via.dest"})
    await _state(hare, "viashovels", lambda r: r["state"] == "running")
    assert hare.api("DELETE", "/api/shovels/vhost/%2F/viashovels")[0] == 204
    assert hare.api("GET", "/api/parameters/shovel/%2F/viashovels")[0] == 404
    assert not any(r["name"] == "viashovels" for r in hare.get("/api/shovels"))
    assert hare.api("DELETE", "/api/shovels/vhost/%2F/viashovels")[0] == 404


async def test_a_shovel_survives_a_restart_and_resumes(tmp_path: Path) -> None:
    b = MgmtBroker(tmp_path / "data").start()
    try:
        _shovel(b, "durable", {"src-uri": "amqp://", "src-queue": "sv.r",
                               "dest-uri": "amqp://", "dest-queue": "sv.r.dest"})
        await _state(b, "durable", lambda r: r["state"] == "running")
        b.stop()
        b.start()
        await _state(b, "durable", lambda r: r["state"] == "running")
        await _publish(b.url, "sv.r", [b"after restart"])
        assert await _drain(b.url, "sv.r.dest", 1) == [b"after restart"]
    finally:
        b.stop()


async def test_an_unreachable_destination_shows_the_error_then_runs(
        hare: MgmtBroker, tmp_path: Path) -> None:
    other = BrokerProc(tmp_path / "other")
    port = other.hold_port()
    dest = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    await _publish(hare.url, "sv.far", [b"waiting"])
    _shovel(hare, "far", {"src-uri": "amqp://", "src-queue": "sv.far", "dest-uri": dest,
                          "dest-queue": "sv.far.dest", "reconnect-delay": 0.5})
    row = await _state(hare, "far", lambda r: r["state"] == "terminated")
    assert "destination" in row["reason"]
    other.start()
    try:
        await _state(hare, "far", lambda r: r["state"] == "running", timeout=60)
        assert await _drain(other.url, "sv.far.dest", 1) == [b"waiting"]
    finally:
        hare.api("DELETE", "/api/parameters/shovel/%2F/far")
        other.stop()



@pytest.mark.skipif(not rabbitmq_answers(), reason="no RabbitMQ answers on 127.0.0.1:5672")
async def test_moves_a_live_queue_from_rabbitmq_into_hare(hare: MgmtBroker) -> None:
    rabbit = "amqp://guest:guest@127.0.0.1:5672/%2F"
    before = [f"before {i}".encode() for i in range(200)]
    after = [f"after {i}".encode() for i in range(200)]
    await _publish(rabbit, "hare.shovel.live", before)
    _shovel(hare, "migrate", {"src-uri": rabbit, "src-queue": "hare.shovel.live",
                              "dest-uri": "amqp://", "dest-queue": "sv.migrated"})
    try:
        await _publish(rabbit, "hare.shovel.live", after)  # producers keep going meanwhile
        assert await _drain(hare.url, "sv.migrated", 400) == before + after
        await asyncio.sleep(0.5)
        assert await queue_depth(hare.url, "sv.migrated") == 0  # nothing twice
        await _until_depth(rabbit, "hare.shovel.live", 0)
    finally:
        hare.api("DELETE", "/api/parameters/shovel/%2F/migrate")


async def test_shovels_are_in_definitions_export_and_import(hare: MgmtBroker) -> None:
    value = {"src-uri": "amqp://", "src-queue": "sv.def", "dest-uri": "amqp://",
             "dest-queue": "sv.def.dest"}
    _shovel(hare, "exported", value)
    exported = hare.get("/api/definitions")["parameters"]
    assert {"vhost": "/", "component": "shovel", "name": "exported", "value": value} in exported
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/exported")[0] == 204
    status, _ = hare.api("POST", "/api/definitions", {"parameters": [
        {"vhost": "/", "component": "shovel", "name": "imported", "value": value}]})
    assert status in (200, 201, 204)
    await _state(hare, "imported", lambda r: r["state"] == "running")
    status, body = hare.api("POST", "/api/definitions", {"parameters": [
        {"vhost": "/", "component": "shovel", "name": "broken", "value": {**value, "src-uri": 1}}]})
    assert status == 400 and "src-uri" in body["reason"]
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/imported")[0] == 204


async def test_reconnect_backoff_doubles_and_restarts_after_a_session_that_moved(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed sessions wait reconnect-delay doubling; one that moved messages starts the
    backoff afresh for the next failure only, not for every failure after it."""
    definition = parse_definition({"src-uri": "amqp://", "src-queue": "a", "dest-uri": "amqp://",
                                   "dest-queue": "b", "reconnect-delay": 1})
    shovel = Shovel("/", "backoff", definition, LocalBroker(1, "secret"), lambda s: None,
                     user="u")
    moved_per_session = [0, 0, 0, 5, 0, 0]
    sleeps: list[float] = []

    async def session() -> None:
        shovel.moved += moved_per_session.pop(0)
        if not moved_per_session:
            raise asyncio.CancelledError
        raise ConnectionError("down")

    async def sleep(delay: float) -> None:
        sleeps.append(delay)

    monkeypatch.setattr(shovel, "_session", session)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        await shovel._run()
    assert sleeps == [1, 2, 4, 1, 2]
