"""The management page in a real headless Chromium: it logs in from the URL, calls the API
and shows a queue with its depth."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path

import aio_pika
import pytest
from aio_pika import Message

from .helpers import MgmtBroker

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(url: str, profile: Path) -> str:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
           "--dump-dom", url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=40)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install "
                                             "chromium); CI installs it")
async def test_page_shows_queue_depth(mgmt: MgmtBroker, tmp_path: Path) -> None:
    conn = await aio_pika.connect(mgmt.url)
    ch = await conn.channel()
    await ch.declare_queue("page.orders")
    for i in range(3):
        await ch.default_exchange.publish(Message(b"%d" % i), routing_key="page.orders")
    await mgmt.until("/api/queues/%2F/page.orders", lambda d: d["messages"] == 3)

    url = f"http://127.0.0.1:{mgmt.mgmt_port}/?user=guest&pass=guest"
    dom = await asyncio.to_thread(dump_dom, url, tmp_path / "profile")
    row = re.search(r"<tr><td>/</td><td>page\.orders</td>(.*?)</tr>", dom)
    assert row, dom[-3000:]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert cells[:4] == ["3", "0", "3", "0"]  # ready, unacked, total, consumers
    assert 'id="login" hidden' in dom  # logged in from the URL
    # the overview figures and our own connection are there too
    assert re.search(r"<b>\d+</b>Queues", dom)
    conn_row = re.search(r"<tr><td>conn-[\d-]+</td><td>/</td><td>guest</td>.*?</tr>", dom)
    assert conn_row and "aiormq" in conn_row.group(0), dom[-3000:]

    wrong = f"http://127.0.0.1:{mgmt.mgmt_port}/?user=guest&pass=nope"
    dom = await asyncio.to_thread(dump_dom, wrong, tmp_path / "profile2")
    assert "Login failed" in dom
    assert 'id="app" hidden' in dom
    await conn.close()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install "
                                             "chromium); CI installs it")
async def test_page_shows_a_management_user_its_own_scope(mgmt: MgmtBroker,
                                                          tmp_path: Path) -> None:
    """A management user's page: its vhost's queues and its own connection only, and no node
    name or alarms (what the API lets it see, as RabbitMQ's UI)."""
    vhost, user = "page-own", "page-app"
    assert mgmt.api("PUT", f"/api/vhosts/{vhost}", {})[0] == 201
    assert mgmt.api("PUT", f"/api/users/{user}", {"password": "pw",
                                                  "tags": "management"})[0] == 201
    assert mgmt.api("PUT", f"/api/permissions/{vhost}/{user}",
                    {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    guest = await aio_pika.connect(mgmt.url)
    await (await guest.channel()).declare_queue("page.hidden")
    own = await aio_pika.connect(f"amqp://{user}:pw@127.0.0.1:{mgmt.port}/{vhost}")
    await (await own.channel()).declare_queue("page.mine")

    url = f"http://127.0.0.1:{mgmt.mgmt_port}/?user={user}&pass=pw"
    dom = await asyncio.to_thread(dump_dom, url, tmp_path / "profile")
    assert f"<td>{vhost}</td><td>page.mine</td>" in dom, dom[-3000:]
    assert "page.hidden" not in dom
    conns = re.findall(r"<tr><td>conn-[\d-]+</td><td>([^<]*)</td><td>([^<]*)</td>", dom)
    assert conns == [(vhost, user)]
    assert f"{user} (management)" in dom
    assert "hare@" not in dom  # no node name
    assert f"Virtual hosts: {vhost}." in dom
    await own.close()
    await guest.close()
