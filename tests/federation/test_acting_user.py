"""A federation link acts on this broker as the user who defined its upstream, as a shovel
acts as the user who defined it: the downstream connection (and an upstream URI naming this
broker) logs in as that user through the node's direct secret, so the user's permissions
decide what the link may publish into; a refusal shows in the link's state and moves
nothing."""

from __future__ import annotations

import re
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


async def _federate(up: MgmtBroker, down: MgmtBroker, name: str, exchange: str,
                    queue: str) -> str:
    """`exchange` (bound to `queue` with "k") federated from `up` by an upstream USER
    defines, its link running; the upstream's URI."""
    await _declare(down.url, exchange, queue, ["k"])
    uri = f"amqp://guest:guest@127.0.0.1:{up.port}"
    _define(down, name, {"uri": uri, "reconnect-delay": 1}, as_user=True)
    _policy(down, name, f"^{re.escape(exchange)}$", {"federation-upstream": name},
            "exchanges")
    await _link(down, lambda r: r["upstream"] == name and r["status"] == "running")
    return uri


async def _link_users(down: MgmtBroker, name: str) -> list[str]:
    """Who the link's downstream connection is logged in as, once it is there."""
    def mine(c: dict[str, Any]) -> bool:
        return bool(c.get("client_properties", {}).get("connection_name")
                    == f"Federation link (downstream) {name}")
    rows = await down.until("/api/connections", lambda rows: any(mine(c) for c in rows))
    return [c["user"] for c in rows if mine(c)]


def _forget(down: MgmtBroker, name: str) -> None:
    assert down.api("DELETE", f"/api/policies/%2F/{name}")[0] == 204
    assert down.api("DELETE", f"/api/parameters/federation-upstream/%2F/{name}")[0] == 204


async def test_a_link_connects_as_the_user_who_defined_the_upstream(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    up, down = pair
    await _federate(up, down, "mine", "ok.fx", "ok.fq")
    await _upstream_keys(up, "ok.fx", {"k"})
    await _publish(up.url, "ok.fx", [("k", b"allowed")])
    assert [m.body for m in await _take(down.url, "ok.fq", b"allowed")] == [b"allowed"]
    assert await _link_users(down, "mine") == [USER]
    _forget(down, "mine")


async def test_an_exchange_the_user_may_not_write_is_refused_and_shown(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    up, down = pair
    uri = await _federate(up, down, "sneaky", "locked.fx", "locked.fq")
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
    _forget(down, "sneaky")
    # the refused publish's task ended the session; nothing was left for asyncio to report
    assert "exception was never retrieved" not in down.log_path.read_text()


async def test_the_defining_user_is_kept_over_a_restart(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    """federation.json keeps who defined each upstream, as shovels.json does."""
    up, down = pair
    await _federate(up, down, "kept", "ok.kx", "ok.kq")
    down.restart()
    await _link(down, lambda r: r["upstream"] == "kept" and r["status"] == "running")
    assert await _link_users(down, "kept") == [USER]
    _forget(down, "kept")


async def test_an_upstream_uri_naming_this_broker_logs_in_as_that_user_too(
        pair: tuple[MgmtBroker, MgmtBroker]) -> None:
    """This node's port on loopback with no credentials is `amqp://`: the user's login, not
    guest's, so what the link declares upstream is checked against the user's rights (here
    it may configure nothing)."""
    _, down = pair
    await _declare(down.url, "ok.src", "ok.unused", [])
    await _declare(down.url, "ok.lx", "ok.lq", ["k"])
    _define(down, "self", {"uri": f"amqp://127.0.0.1:{down.port}", "exchange": "ok.src",
                           "reconnect-delay": 1}, as_user=True)
    _policy(down, "self", r"^ok\.lx$", {"federation-upstream": "self"}, "exchanges")
    row = await _link(down, lambda r: r["upstream"] == "self" and "ACCESS_REFUSED" in r.get(
        "error", ""))
    assert f"refused for user '{USER}'" in row["error"], row
    _forget(down, "self")
