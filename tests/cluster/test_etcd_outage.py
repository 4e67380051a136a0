"""etcd stopped and restarted under traffic, with real processes: publishing and consuming
go on (local and remote queues, every confirmed message arrives), metadata changes are
refused with a clear error, an alarm shows it (health check and hare-ctl cluster_status);
etcd back, changes work again and the alarm clears."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pytest
from aiormq.exceptions import ChannelClosed

from .helpers import ClusterNode, EtcdProc, ctl, wait_for


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
        for name in ("remote.q", "bg.remote"):
            await (await cb.channel()).declare_queue(name)
        await cb.close()
        wait_for(lambda: a.api("GET", "/api/queues/%2F/bg.remote")[0] == 200, what="on a")
        conn = await aio_pika.connect(a.url)
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("local.q")
        await ch.declare_queue("bg.local")

        # traffic all along, through etcd's stop and its restart
        confirmed: dict[str, list[int]] = {"bg.local": [], "bg.remote": []}
        running = True

        async def traffic() -> None:
            bg_conn = await aio_pika.connect(a.url)
            bg = await bg_conn.channel(publisher_confirms=True)
            i = 0
            while running:
                for name in confirmed:
                    await bg.default_exchange.publish(aio_pika.Message(str(i).encode()),
                                                      routing_key=name)
                    confirmed[name].append(i)
                i += 1
                await asyncio.sleep(0.02)
            await bg_conn.close()

        publisher = asyncio.ensure_future(traffic())
        await asyncio.to_thread(etcd.stop)
        await asyncio.to_thread(wait_for, lambda: "etcd unreachable" in alarms(a), 15,
                                "the alarm")
        during = len(confirmed["bg.remote"])
        status = await asyncio.to_thread(ctl, a, "cluster_status")
        assert "etcd unreachable on node out-a" in status.stdout.split("Alarms")[1]
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

        assert len(confirmed["bg.remote"]) > during  # confirmed while etcd was down
        await asyncio.to_thread(etcd.start)
        await asyncio.to_thread(wait_for, lambda: "etcd unreachable" not in alarms(a), 20,
                                "cleared")
        ok = await conn.channel()
        for _ in range(50):  # the first write after the outage may still be refused
            try:
                await ok.declare_queue("new.q")
                break
            except ChannelClosed:
                ok = await conn.channel()
                await asyncio.sleep(0.2)
        await asyncio.to_thread(wait_for,
                                lambda: b.api("GET", "/api/queues/%2F/new.q")[0] == 200, 10,
                                "new.q on b")
        running = False
        await asyncio.wait_for(publisher, 10)
        for name, sent in confirmed.items():
            q = await (await conn.channel()).get_queue(name, ensure=False)
            got = []
            while (m := await q.get(no_ack=True, fail=False)) is not None:
                got.append(int(m.body))
            assert got == sent, name  # every confirmed message, in order
        await conn.close()
    finally:
        if etcd.proc is None:
            etcd.start()
        b.stop()
        a.stop()
