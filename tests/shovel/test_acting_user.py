"""A dynamic shovel acts as the user who defined it (RabbitMQ's direct connections): its
`amqp://` URIs (and this broker's own port on loopback with no credentials) log in as that
user, so the user's permissions decide what it may read and write; a refusal shows in its
state and moves nothing."""

from __future__ import annotations

from collections.abc import Iterator

import aio_pika
import pytest

from tests.mgmt.helpers import MgmtBroker
from tests.shovel.test_shovel import _depth, _drain, _publish, _state, _until_depth

pytestmark = pytest.mark.asyncio

USER, PASSWORD = "mover", "mover-pw"


@pytest.fixture(scope="module")
def hare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtBroker]:
    b = MgmtBroker(tmp_path_factory.mktemp("acting") / "data").start()
    # may configure everything, write to the default exchange and ok.*, read only ok.*
    assert b.api("PUT", f"/api/users/{USER}",
                 {"password": PASSWORD, "tags": "policymaker"})[0] in (201, 204)
    assert b.api("PUT", f"/api/permissions/%2F/{USER}",
                 {"configure": ".*", "write": r"^(amq\.default|ok\..*)$",
                  "read": r"^ok\."})[0] in (201, 204)
    yield b
    b.stop()


def _define(b: MgmtBroker, name: str, value: dict[str, object]) -> None:
    status, body = b.api("PUT", f"/api/parameters/shovel/%2F/{name}", {"value": value},
                         user=USER, password=PASSWORD)
    assert status in (201, 204), body


async def test_a_shovel_connects_as_the_user_who_defined_it(hare: MgmtBroker) -> None:
    await _publish(hare.url, "ok.src", [b"allowed"])
    _define(hare, "mine", {"src-uri": "amqp://", "src-queue": "ok.src",
                           "dest-uri": f"amqp://localhost:{hare.port}", "dest-queue": "ok.dest"})
    await _state(hare, "mine", lambda r: r["state"] == "running")
    assert await _drain(hare.url, "ok.dest", 1) == [b"allowed"]
    shovel_conns = [c for c in hare.get("/api/connections")
                    if c.get("client_properties", {}).get("connection_name", "")
                    .startswith("Shovel mine")]
    assert len(shovel_conns) == 2 and {c["user"] for c in shovel_conns} == {USER}
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/mine")[0] == 204


async def test_a_source_the_user_may_not_read_is_refused_and_shown(hare: MgmtBroker) -> None:
    await _publish(hare.url, "secret.src", [b"not for mover"])
    _define(hare, "sneaky", {"src-uri": "amqp://", "src-queue": "secret.src",
                             "dest-uri": "amqp://", "dest-queue": "ok.stolen",
                             "reconnect-delay": 1})
    row = await _state(hare, "sneaky", lambda r: r["state"] == "terminated" and "reason" in r)
    assert "ACCESS_REFUSED" in row["reason"] and "secret.src" in row["reason"], row
    assert USER in row["reason"]
    assert await _depth(hare.url, "secret.src") == 1  # nothing moved, nothing lost
    # the same definition by guest, who may read it, moves it
    assert hare.api("PUT", "/api/parameters/shovel/%2F/sneaky", {"value": {
        "src-uri": "amqp://", "src-queue": "secret.src", "dest-uri": "amqp://",
        "dest-queue": "ok.stolen"}})[0] == 204
    assert await _drain(hare.url, "ok.stolen", 1) == [b"not for mover"]
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/sneaky")[0] == 204


async def test_a_destination_the_user_may_not_write_is_refused_and_shown(
        hare: MgmtBroker) -> None:
    async with await aio_pika.connect(hare.url) as conn:
        await (await conn.channel()).declare_exchange("locked.x", durable=True)
    await _publish(hare.url, "ok.out", [b"stays home"])
    _define(hare, "leaky", {"src-uri": "amqp://", "src-queue": "ok.out",
                            "dest-uri": "amqp://", "dest-exchange": "locked.x",
                            "reconnect-delay": 1})
    row = await _state(hare, "leaky", lambda r: "access to exchange 'locked.x'" in r.get(
        "reason", ""))
    assert row["state"] != "running" and USER in row["reason"], row
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/leaky")[0] == 204
    await _until_depth(hare.url, "ok.out", 1)  # refused, so given back to the source


async def test_a_local_uri_naming_a_missing_vhost_is_refused(hare: MgmtBroker) -> None:
    status, body = hare.api("PUT", "/api/parameters/shovel/%2F/nowhere", {"value": {
        "src-uri": "amqp:///no-such-vhost", "src-queue": "a", "dest-uri": "amqp://",
        "dest-queue": "b"}}, user=USER, password=PASSWORD)
    assert status == 400 and 'may not connect to vhost "no-such-vhost"' in body["reason"]
    assert hare.api("GET", "/api/parameters/shovel/%2F/nowhere")[0] == 404
