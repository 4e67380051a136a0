"""Static shovels (the config file's [[shovels]]): started with the node, listed by
/api/shovels as type static with no vhost (administrators only, as rabbitmq_shovel_management),
never deletable through the API, and checked before the server starts."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.mgmt.helpers import MgmtBroker
from tests.shovel.test_shovel import _drain, _publish, _state
from tests.test_ctl import run_ctl

pytestmark = pytest.mark.asyncio

STATIC = """
[[shovels]]
name = "boot"
src-uri = "amqp://"
src-queue = "st.src"
dest-uri = ["amqp://"]
dest-queue = "st.dest"
src-prefetch-count = 10
"""


@pytest.fixture(scope="module")
def hare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MgmtBroker]:
    base = tmp_path_factory.mktemp("static")
    (base / "hare.toml").write_text(STATIC)
    b = MgmtBroker(base / "data", ["--config", str(base / "hare.toml")]).start()
    yield b
    b.stop()


async def test_a_static_shovel_runs_from_boot_and_is_listed_as_static(hare: MgmtBroker) -> None:
    row = await _state(hare, "boot", lambda r: r["state"] == "running")
    assert row["type"] == "static" and "vhost" not in row
    assert row["src_queue"] == "st.src" and row["dest_queue"] == "st.dest"
    await _publish(hare.url, "st.src", [b"a", b"b"])
    assert await _drain(hare.url, "st.dest", 2) == [b"a", b"b"]
    # it is no runtime parameter: not listed there, not exported with the definitions
    assert hare.get("/api/parameters/shovel") == []
    assert not any(p["component"] == "shovel" for p in hare.get("/api/definitions")["parameters"])


async def test_a_static_shovel_cannot_be_deleted_through_the_api(hare: MgmtBroker) -> None:
    await _state(hare, "boot", lambda r: r["state"] == "running")
    # RabbitMQ finds no shovel of that name in any vhost: 404 on both of its delete paths
    assert hare.api("DELETE", "/api/parameters/shovel/%2F/boot")[0] == 404
    assert hare.api("DELETE", "/api/shovels/vhost/%2F/boot")[0] == 404
    await _publish(hare.url, "st.src", [b"still moving"])
    assert await _drain(hare.url, "st.dest", 1) == [b"still moving"]
    assert any(r["name"] == "boot" and r["type"] == "static" for r in hare.get("/api/shovels"))
    done = await asyncio.to_thread(run_ctl, "delete_shovel", "boot", url=hare.http)
    assert done.returncode == 65
    assert done.stderr == "hare-ctl: not found: shovel 'boot' in vhost '/'\n"
    listed = (await asyncio.to_thread(run_ctl, "list_shovels", url=hare.http)).stdout
    assert listed.splitlines()[1].split()[:3] == ["boot", "static", "running"]


async def test_only_administrators_see_static_shovels(hare: MgmtBroker) -> None:
    """They belong to no vhost: a vhost's list leaves them out, and so does a monitoring
    user's full list (RabbitMQ's filter_vhost_user)."""
    assert not any(r["name"] == "boot" for r in hare.get("/api/shovels/%2F"))
    assert hare.api("PUT", "/api/users/watcher",
                    {"password": "watch-pw", "tags": "monitoring"})[0] in (201, 204)
    assert hare.api("PUT", "/api/permissions/%2F/watcher",
                    {"configure": "", "write": "", "read": ".*"})[0] in (201, 204)
    status, rows = hare.api("GET", "/api/shovels", user="watcher", password="watch-pw")
    assert status == 200 and not any(r["name"] == "boot" for r in rows)


def _server(tmp_path: Path, config: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "hare.toml").write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "broker", "--config", str(tmp_path / "hare.toml"),
         "--port", "0", "--management-port", "0", "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize(("change", "reason"), [
    ('src-uri = "http://elsewhere"', 'src-uri: "http://elsewhere" not a valid URI'),
    ('src-exchange = "x"', "Cannot specify 'src-exchange' and 'src-queue'"),
    ('ack-mode = "sometimes"', "ack-mode should be one of"),
    ('colour = "blue"', "Unrecognised terms [colour]"),
])
async def test_a_bad_static_shovel_stops_the_server_with_the_reason(
        tmp_path: Path, change: str, reason: str) -> None:
    key = change.split(" ", 1)[0] + " = "
    config = "".join(line + "\n" for line in STATIC.splitlines() if not line.startswith(key))
    done = _server(tmp_path, config + change + "\n")
    assert done.returncode == 2, done.stderr
    assert "shovels: entry 1 (shovel 'boot')" in done.stderr and reason in done.stderr
    assert "listening" not in done.stdout  # refused before anything started
