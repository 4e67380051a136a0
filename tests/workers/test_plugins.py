"""The shovel and federation plugins in a multi-worker hare-server: one set of definitions
for the server, made, listed, updated and deleted through whichever worker answers; each
shovel and each federation link runs on one worker only (moving every message once), again
after a kill -9 of that worker, and upstream names are the server's, not a worker's."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.federation.test_federation import _declare, _link, _policy, _put, _take
from tests.federation.test_federation import _publish as _publish_to
from tests.mgmt.helpers import MgmtBroker
from tests.plugin_helpers import queue_depth
from tests.shovel.test_shovel import _drain, _publish, _shovel, _state
from tests.workers.helpers import WorkersBroker, wait_for

pytestmark = pytest.mark.asyncio

SHOVEL = "/api/parameters/shovel/%2F/"


def _answering_workers(b: WorkersBroker, want: int = 2, tries: int = 100) -> set[str]:
    """Fresh HTTP connections (urllib keeps none) until `want` workers have answered."""
    seen: set[str] = set()
    for _ in range(tries):
        seen.add(b.get("/api/overview")["node"])
        if len(seen) == want:
            break
    return seen


def _value(src: str, dest: str, **more: Any) -> dict[str, Any]:
    return {"src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://", "dest-queue": dest,
            **more}


def _rows(b: WorkersBroker, name: str) -> list[dict[str, Any]]:
    return [r for r in b.get("/api/shovels") if r["name"] == name]


async def test_a_shovel_is_the_servers_through_every_worker(two: WorkersBroker) -> None:
    assert len(_answering_workers(two)) == 2  # the requests below reach both workers
    _shovel(two, "one", _value("one.src", "one.dest"))
    # every GET, whichever worker answers, finds it; it runs once in the server
    for _ in range(20):
        assert two.get(SHOVEL + "one")["value"]["dest-queue"] == "one.dest"
        assert len(_rows(two, "one")) == 1
    await _state(two, "one", lambda r: r["state"] == "running")
    # a second PUT (through either worker) updates the one shovel: no second copy
    for _ in range(4):
        status, body = two.api("PUT", SHOVEL + "one",
                               {"value": _value("one.src", "one.dest", **{
                                   "src-prefetch-count": 50})})
        assert status == 204, body
    assert [p["name"] for p in two.get("/api/parameters/shovel")] == ["one"]
    for _ in range(20):
        assert two.get(SHOVEL + "one")["value"]["src-prefetch-count"] == 50
    row = await _state(two, "one", lambda r: r["state"] == "running")
    wait_for(lambda: len(_rows(two, "one")) == 1, what="one row for the shovel")
    assert re.fullmatch(r".*-w[12]", row["node"])  # the worker it runs on

    # each message is moved exactly once
    bodies = [b"m%d" % i for i in range(300)]
    await _publish(two.url, "one.src", bodies)
    assert sorted(await _drain(two.url, "one.dest", 300)) == sorted(bodies)
    await asyncio.sleep(0.5)  # a second copy of the shovel would have moved more by now
    assert await queue_depth(two.url, "one.dest") == 0
    assert await queue_depth(two.url, "one.src") == 0
    assert two.get("/api/queues/%2F/one.src")["consumers"] == 1

    # a DELETE through any worker deletes it for all of them, and it stops
    assert two.api("DELETE", SHOVEL + "one")[0] == 204
    for _ in range(20):
        assert two.api("GET", SHOVEL + "one")[0] == 404
    await two.until("/api/shovels", lambda rows: not any(r["name"] == "one" for r in rows))
    assert two.api("DELETE", "/api/shovels/vhost/%2F/one")[0] == 404
    await _publish(two.url, "one.src", [b"stays"])
    await asyncio.sleep(0.5)
    assert await queue_depth(two.url, "one.src") == 1


async def test_shovels_spread_over_the_workers_each_once(two: WorkersBroker) -> None:
    """The rule: of the running workers, the one a shovel's name hashes highest with; a
    dozen shovels land on both workers, each shovel on one."""
    names = [f"spread{i}" for i in range(12)]
    for name in names:
        _shovel(two, name, _value(name + ".src", name + ".dest"))
    rows = await two.until("/api/shovels", lambda rows: sorted(
        r["name"] for r in rows if r["name"] in names and r["state"] == "running") == sorted(names),
        timeout=30)
    assert len({r["node"] for r in rows if r["name"] in names}) == 2
    for name in names:
        assert two.api("DELETE", SHOVEL + name)[0] == 204


async def test_kill_9_of_the_worker_running_a_shovel_runs_it_again(two: WorkersBroker) -> None:
    _shovel(two, "phoenix", _value("ph.src", "ph.dest"))
    row = await _state(two, "phoenix", lambda r: r["state"] == "running")
    index = int(row["node"].rsplit("-w", 1)[1])
    old = two.workers()[index]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: two.workers().get(index) not in (None, old), what="worker restarted")
    await _state(two, "phoenix", lambda r: r["state"] == "running", timeout=60)
    bodies = [b"p%d" % i for i in range(50)]
    await _publish(two.url, "ph.src", bodies)
    assert sorted(await _drain(two.url, "ph.dest", 50)) == sorted(bodies)
    assert len(_rows(two, "phoenix")) == 1
    assert two.api("DELETE", SHOVEL + "phoenix")[0] == 204


async def test_definitions_survive_a_restart_of_the_server(tmp_path: Path) -> None:
    b = WorkersBroker(tmp_path / "data", 2).start()
    try:
        _shovel(b, "kept", _value("kept.src", "kept.dest"))
        _put(b, "federation-upstream", "kept-up", {"uri": "amqp://localhost:1"})
        await _state(b, "kept", lambda r: r["state"] == "running")
        b.stop()
        b.start()
        for _ in range(10):
            assert b.get(SHOVEL + "kept")["value"]["src-queue"] == "kept.src"
            assert [p["name"] for p in b.get("/api/parameters/federation-upstream")] == [
                "kept-up"]
        await _state(b, "kept", lambda r: r["state"] == "running", timeout=30)
        assert len(_rows(b, "kept")) == 1
        await _publish(b.url, "kept.src", [b"after restart"])
        assert await _drain(b.url, "kept.dest", 1) == [b"after restart"]
    finally:
        b.kill()


async def test_a_static_shovel_runs_once_per_server(tmp_path: Path) -> None:
    (tmp_path / "hare.toml").write_text(
        '[[shovels]]\nname = "boot"\nsrc-uri = "amqp://"\nsrc-queue = "st.src"\n'
        'dest-uri = ["amqp://"]\ndest-queue = "st.dest"\n')
    b = WorkersBroker(tmp_path / "data", 2, ["--config", str(tmp_path / "hare.toml")]).start()
    try:
        await _state(b, "boot", lambda r: r["state"] == "running", timeout=30)
        for _ in range(10):
            assert [r["type"] for r in _rows(b, "boot")] == ["static"]
        bodies = [b"s%d" % i for i in range(100)]
        await _publish(b.url, "st.src", bodies)
        assert sorted(await _drain(b.url, "st.dest", 100)) == sorted(bodies)
        await asyncio.sleep(0.5)
        assert await queue_depth(b.url, "st.dest") == 0
        # one shovel in the server: one consumer of its source (each worker's would be two)
        assert b.get("/api/queues/%2F/st.src")["consumers"] == 1
    finally:
        b.kill()


async def test_federation_links_run_once_named_after_the_server(
        two: WorkersBroker, tmp_path: Path) -> None:
    up = MgmtBroker(tmp_path / "up", ["--workers", "1", "--node-name", "hare-up1"]).start()
    try:
        server = re.sub(r"-w\d+$", "", two.get("/api/overview")["node"])
        await _declare(up.url, "wfx.x", "", [])
        await _declare(two.url, "wfx.x", "wfx.q", ["k.#"])
        _put(two, "federation-upstream", "wup", {"uri": up.url})
        _policy(two, "wfx", r"^wfx\.", {"federation-upstream": "wup"}, "exchanges")
        row = await _link(two, lambda r: r.get("exchange") == "wfx.x"
                          and r["status"] == "running")
        assert re.fullmatch(r".*-w[12]", row["node"])
        for _ in range(10):  # one link in the server, whichever worker lists them
            assert [r["upstream"] for r in two.get("/api/federation-links")
                    if r.get("exchange") == "wfx.x"] == ["wup"]
        # the upstream sees the server, not a worker: one queue, named after it
        names = await up.until("/api/queues/%2F", lambda qs: any(
            q["name"].startswith("federation: wfx.x") for q in qs), timeout=20)
        assert [q["name"] for q in names if q["name"].startswith("federation: ")] == [
            f"federation: wfx.x -> {server}"]
        await up.until("/api/exchanges/%2F/wfx.x/bindings/source",
                       lambda rows: {r["routing_key"] for r in rows} == {"k.#"}, timeout=20)
        bodies = [b"f%d" % i for i in range(50)]
        await _publish_to(up.url, "wfx.x", [("k.a", body) for body in bodies])
        got = await _take(two.url, "wfx.q", 50)
        assert sorted(m.body for m in got) == sorted(bodies)
        assert {m.headers["x-received-from"][0]["cluster-name"] for m in got} == {"hare-up1"}
        await asyncio.sleep(0.5)  # a second link would have delivered copies by now
        assert await queue_depth(two.url, "wfx.q") == 0
        assert two.api("DELETE", "/api/policies/%2F/wfx")[0] == 204
        assert two.api("DELETE", "/api/parameters/federation-upstream/%2F/wup")[0] == 204
    finally:
        up.stop()
