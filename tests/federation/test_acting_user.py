"""A federation link acts on this broker as the user who defined its upstream, as a shovel
acts as the user who defined it: the downstream connection (and an upstream URI naming this
broker) logs in as that user through the node's direct secret, so the user's permissions
decide what the link may publish into; a refusal shows in the link's state and moves
nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.federation.test_federation import (
    _declare,
    _link,
    _policy,
    _publish,
    _take,
    _upstream_keys,
)
from tests.mgmt.helpers import MgmtBroker
from tests.plugin_helpers import queue_depth

pytestmark = pytest.mark.asyncio

USER, PASSWORD = "fedder", "fedder-pw"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MgmtBroker, MgmtBroker]]:
    base = tmp_path_factory.mktemp("federation-acting")
    up = MgmtBroker(base / "up", ["--node-name", "hare-up"]).start()
    down = MgmtBroker(base / "down", ["--node-name", "hare-down"]).start()
    # on the downstream: may write to ok.* only, and read and configure nothing
    assert down.api("PUT", f"/api/users/{USER}",
                    {"password": PASSWORD, "tags": "policymaker"})[0] in (201, 204)
    assert down.api("PUT", f"/api/permissions/%2F/{USER}",
                    {"configure": "^$", "write": r"^ok\.", "read": "^$"})[0] in (201, 204)
    yield up, down
    down.stop()
    up.stop()


def _define(down: MgmtBroker, name: str, value: dict[str, Any], *, as_user: bool) -> None:
    auth = {"user": USER, "password": PASSWORD} if as_user else {}
    status, body = down.api("PUT", f"/api/parameters/federation-upstream/%2F/{name}",
                            {"value": value}, **auth)
    assert status in (201, 204), body


async def test_a_link_connects_as_the_user_who_defined_the_upstream(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    up, down = pair
    await _declare(down.url, "ok.fx", "ok.fq", ["k"])
    _define(down, "mine", {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}"}, as_user=True)
    _policy(down, "mine", r"^ok\.fx$", {"federation-upstream": "mine"}, "exchanges")
    await _link(down, lambda r: r["upstream"] == "mine" and r["status"] == "running")
    await _upstream_keys(up, "ok.fx", {"k"})
    await _publish(up.url, "ok.fx", [("k", b"allowed")])
    assert [m.body for m in await _take(down.url, "ok.fq", b"allowed")] == [b"allowed"]
    links = [c for c in down.get("/api/connections")
             if c.get("client_properties", {}).get("connection_name", "")
             == "Federation link (downstream) mine"]
    assert [c["user"] for c in links] == [USER]
    assert down.api("DELETE", "/api/policies/%2F/mine")[0] == 204
    assert down.api("DELETE", "/api/parameters/federation-upstream/%2F/mine")[0] == 204


async def test_an_exchange_the_user_may_not_write_is_refused_and_shown(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    up, down = pair
    await _declare(down.url, "locked.fx", "locked.fq", ["k"])
    uri = f"amqp://guest:guest@127.0.0.1:{up.port}"
    _define(down, "sneaky", {"uri": uri, "reconnect-delay": 1}, as_user=True)
    _policy(down, "sneaky", r"^locked\.fx$", {"federation-upstream": "sneaky"}, "exchanges")
    await _link(down, lambda r: r["upstream"] == "sneaky" and r["status"] == "running")
    await _upstream_keys(up, "locked.fx", {"k"})
    await _publish(up.url, "locked.fx", [("k", b"not for fedder")])
    row = await _link(down, lambda r: r["upstream"] == "sneaky" and "access to exchange "
                      "'locked.fx'" in r.get("error", ""))
    assert "ACCESS_REFUSED" in row["error"] and USER in row["error"], row
    assert await queue_depth(down.url, "locked.fq") == 0  # nothing moved
    # the same upstream defined by guest, who may write there: the message kept upstream
    # (refused, so not acked) arrives
    _define(down, "sneaky", {"uri": uri, "reconnect-delay": 1}, as_user=False)
    got = await _take(down.url, "locked.fq", b"not for fedder")
    assert [m.body for m in got] == [b"not for fedder"]
    assert down.api("DELETE", "/api/policies/%2F/sneaky")[0] == 204
    assert down.api("DELETE", "/api/parameters/federation-upstream/%2F/sneaky")[0] == 204


async def test_the_defining_user_is_kept_over_a_restart(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    """federation.json keeps who defined each upstream, as shovels.json does."""
    up, down = pair
    await _declare(down.url, "ok.kx", "ok.kq", ["k"])
    _define(down, "kept", {"uri": f"amqp://guest:guest@127.0.0.1:{up.port}"}, as_user=True)
    _policy(down, "kept", r"^ok\.kx$", {"federation-upstream": "kept"}, "exchanges")
    await _link(down, lambda r: r["upstream"] == "kept" and r["status"] == "running")
    down.restart()
    await _link(down, lambda r: r["upstream"] == "kept" and r["status"] == "running")
    links = await down.until("/api/connections", lambda rows: any(
        c.get("client_properties", {}).get("connection_name", "")
        == "Federation link (downstream) kept" for c in rows))
    assert [c["user"] for c in links if c.get("client_properties", {}).get(
        "connection_name", "") == "Federation link (downstream) kept"] == [USER]
    assert down.api("DELETE", "/api/policies/%2F/kept")[0] == 204
    assert down.api("DELETE", "/api/parameters/federation-upstream/%2F/kept")[0] == 204
