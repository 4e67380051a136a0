"""etcd stopped under traffic, with real processes: publishing and consuming go on (local
and remote queues), metadata changes are refused with a clear error, an alarm shows it; etcd
back, changes work again and the alarm clears."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pytest
from aiormq.exceptions import ChannelClosed

from .helpers import ClusterNode, EtcdProc, wait_for


def alarms(node: ClusterNode) -> list[str]:
    _, body = node.api("GET", "/api/health/checks/alarms")
    return [a["resource"] for a in (body or {}).get("alarms", [])]


async def test_etcd_down_and_back(tmp_path: Path, etcd: EtcdProc) -> None:
    a = ClusterNode(tmp_path / "a", etcd, "outage", "out-a", ["--cluster-lease-ttl-s", "6"])
    b = ClusterNode(tmp_path / "b", etcd, "outage", "out-b", ["--cluster-lease-ttl-s", "6"])
    a.start()
    b.start()
    try:
        cb = await aio_pika.connect(b.url)
        await (await cb.channel()).declare_queue("remote.q")
        await cb.close()
        wait_for(lambda: a.api("GET", "/api/queues/%2F/remote.q")[0] == 200, what="on a")
        conn = await aio_pika.connect(a.url)
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("local.q")

        etcd.stop()
        wait_for(lambda: "etcd unreachable" in alarms(a), timeout=15, what="the alarm")
        # traffic goes on: local and remote queues, with confirms
        for name in ("local.q", "remote.q"):
            await ch.default_exchange.publish(aio_pika.Message(name.encode()), routing_key=name)
            q = await ch.get_queue(name, ensure=False)
            got = await q.get(no_ack=True)
            assert got.body == name.encode()
        # metadata changes are refused, clearly
        bad = await conn.channel()
        with pytest.raises(ChannelClosed, match="metadata store unavailable"):
            await bad.declare_queue("new.q")
        status, body = a.api("PUT", "/api/queues/%2F/new.http", {"durable": True})
        assert status == 503 and "metadata store unavailable" in body["reason"]

        etcd.start()
        wait_for(lambda: "etcd unreachable" not in alarms(a), timeout=20, what="cleared")
        ok = await conn.channel()
        for _ in range(50):  # the first write after the outage may still be refused
            try:
                await ok.declare_queue("new.q")
                break
            except ChannelClosed:
                ok = await conn.channel()
                await asyncio.sleep(0.2)
        wait_for(lambda: b.api("GET", "/api/queues/%2F/new.q")[0] == 200, what="new.q on b")
        await conn.close()
    finally:
        if etcd.proc is None:
            etcd.start()
        b.stop()
        a.stop()
