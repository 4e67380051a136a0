"""A full disk, for real: the data directory on a small tmpfs. Publishers get nacks (or
connection.blocked through the disk alarm) and a clear log line; nothing already confirmed is
lost; publishing works again when space comes back."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import aio_pika
import pytest
from aio_pika import DeliveryMode, Message
from pamqp import commands

from tests.amqp_raw import RawClient
from tests.conftest import BrokerProc

pytestmark = pytest.mark.asyncio


@pytest.fixture
def small_disk(tmp_path: Path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(path: Path, leave: int) -> None:
    """A ballast file that leaves about `leave` bytes free."""
    st = os.statvfs(path.parent)
    size = max(0, st.f_bavail * st.f_frsize - leave)
    with open(path, "wb") as f:
        f.write(b"\0" * size)


async def test_enospc_nacks_publishers_and_recovers_when_space_returns(small_disk):
    b = BrokerProc(small_disk / "data", ["--disk-free-limit", "1", "--fsync", "batch",
                                         "--msg-store-file-size-limit", "1MiB"])
    b.log_path = small_disk.parent / "broker.log"
    b.start()
    try:
        conn = await aio_pika.connect(b.url)
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue("full-q", durable=True)
        body = b"x" * 20_000  # above the index embedding threshold: the msg_store writes it
        confirmed: list[int] = []
        for i in range(50):
            await ch.default_exchange.publish(
                Message(b"%06d" % i + body, delivery_mode=DeliveryMode.PERSISTENT), q.name)
            confirmed.append(i)
        ballast = small_disk / "ballast"
        _fill(ballast, leave=200_000)
        nacked = 0
        for i in range(50, 200):
            try:
                await ch.default_exchange.publish(
                    Message(b"%06d" % i + body, delivery_mode=DeliveryMode.PERSISTENT), q.name)
                confirmed.append(i)
            except aio_pika.exceptions.DeliveryError:
                nacked += 1
        assert nacked > 0, "the disk filled up but every publish was confirmed"
        assert "message store write failed" in b.log() or "fsync failed" in b.log()
        ballast.unlink()  # space comes back
        for i in range(200, 220):
            await ch.default_exchange.publish(
                Message(b"%06d" % i + body, delivery_mode=DeliveryMode.PERSISTENT), q.name)
            confirmed.append(i)
        await conn.close()
        assert b.stop() == 0
        b.start()
        conn = await aio_pika.connect(b.url)
        ch = await conn.channel()
        q = await ch.declare_queue("full-q", durable=True)
        got = []
        while (m := await q.get(fail=False, no_ack=True)) is not None:
            got.append(int(m.body[:6]))
        await conn.close()
        assert set(confirmed) <= set(got), "a confirmed message was lost"
        assert got == sorted(got)
    finally:
        b.kill()


async def test_disk_alarm_blocks_publishers(small_disk):
    # 24 MB of disk is below a 100 MB free-space limit: the disk alarm is up from the start
    b = BrokerProc(small_disk / "data", ["--disk-free-limit", "100MB"])
    b.log_path = small_disk.parent / "broker.log"
    b.start()
    try:
        c = RawClient(b.port)
        c.handshake()
        c.open_channel(1)
        c.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
        c.send_content(1, b"x")  # a publisher is blocked and told so
        blocked = c.expect(commands.Connection.Blocked, 0)
        assert blocked.reason == "low on disk"
        assert "alarm raised" in b.log()
        c.close()
    finally:
        b.kill()
