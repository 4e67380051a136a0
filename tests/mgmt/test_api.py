"""The management API against a real broker: aio-pika creates the objects, HTTP reports and
changes them, and AMQP sees the changes."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import aiormq
import pytest
from aio_pika import Message

from .helpers import MgmtBroker


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def connect(mgmt: MgmtBroker, name: str) -> aio_pika.abc.AbstractConnection:
    return await aio_pika.connect(mgmt.url, client_properties={"connection_name": name})


async def find_connection(mgmt: MgmtBroker, name: str) -> dict:
    conns = await mgmt.until("/api/connections", lambda cs: any(
        c["client_properties"].get("connection_name") == name for c in cs))
    return next(c for c in conns if c["client_properties"].get("connection_name") == name)


async def test_queue_depth_consumers_and_message_stats(mgmt: MgmtBroker) -> None:
    qname = unique("depth")
    conn = await connect(mgmt, qname)
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=2)
    q = await ch.declare_queue(qname, durable=True)
    for i in range(5):
        await ch.default_exchange.publish(Message(b"x" * 100 + bytes([i])), routing_key=qname)
    got: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        got.append(message)

    tag = await q.consume(on_message)
    path = f"/api/queues/%2F/{qname}"
    info = await mgmt.until(path, lambda d: d["messages_unacknowledged"] == 2)
    assert info["name"] == qname and info["vhost"] == "/" and info["durable"] is True
    assert info["messages"] == 5
    assert info["messages_ready"] == 3
    assert info["consumers"] == 1
    assert info["message_bytes_ready"] == 3 * 101
    assert info["memory"] > 3 * 101
    assert info["message_stats"]["publish"] == 5
    assert info["message_stats"]["deliver_get"] == 2
    assert info["message_stats"]["ack"] == 0
    assert isinstance(info["message_stats"]["publish_details"]["rate"], float)
    [consumer] = info["consumer_details"]
    assert consumer["consumer_tag"] == tag
    assert consumer["ack_required"] is True and consumer["prefetch_count"] == 2

    while len(got) < 2:  # the deliveries may still be on their way to the client
        await asyncio.sleep(0.01)
    await got[0].ack()
    info = await mgmt.until(path, lambda d: d["message_stats"]["ack"] == 1)
    assert info["message_stats"]["deliver_get"] == 3  # the freed prefetch slot was refilled
    assert info["messages"] == 4

    listed = [x for x in mgmt.get("/api/queues/%2F") if x["name"] == qname]
    assert listed[0]["messages"] == 4
    consumers = [c for c in mgmt.get("/api/consumers/%2F") if c["queue"]["name"] == qname]
    assert [c["consumer_tag"] for c in consumers] == [tag]
    assert consumers[0]["channel_details"]["user"] == "guest"
    await conn.close()


async def test_overview_counts_objects_and_messages(mgmt: MgmtBroker) -> None:
    before = mgmt.get("/api/overview")
    qname = unique("ov")
    conn = await connect(mgmt, qname)
    ch1 = await conn.channel()
    await conn.channel()
    await ch1.declare_queue(qname)
    for _ in range(3):
        await ch1.default_exchange.publish(Message(b"hello"), routing_key=qname)
    ov = await mgmt.until("/api/overview", lambda o: o["queue_totals"]["messages"]
                       == before["queue_totals"]["messages"] + 3)
    assert ov["object_totals"]["connections"] == before["object_totals"]["connections"] + 1
    assert ov["object_totals"]["channels"] == before["object_totals"]["channels"] + 2
    assert ov["object_totals"]["queues"] == before["object_totals"]["queues"] + 1
    assert ov["queue_totals"]["messages_ready"] == before["queue_totals"]["messages_ready"] + 3
    assert ov["message_stats"]["publish"] == before["message_stats"]["publish"] + 3
    assert ov["product_name"] == "Hare"
    assert ov["node"].startswith("hare@")
    assert {"protocol": "amqp", "port": mgmt.port} .items() <= ov["listeners"][0].items()
    assert ov["listeners"][1]["port"] == mgmt.mgmt_port
    await conn.close()
    ov = await mgmt.until("/api/overview", lambda o: o["object_totals"]["connections"]
                          == before["object_totals"]["connections"])
    assert ov["object_totals"]["channels"] == before["object_totals"]["channels"]


async def test_a_closed_channel_keeps_its_publishes_in_the_totals(mgmt: MgmtBroker) -> None:
    """The channel reports its end to the node's events, and the management plugin folds its
    counters into the totals at once: without the event they would count only if the sampler
    (every 5 s) had seen them before the channel went."""
    qname = unique("closed")
    conn = await connect(mgmt, qname)
    ch = await conn.channel()
    await ch.declare_queue(qname)
    before = mgmt.get("/api/overview")["message_stats"]["publish"]
    for _ in range(4):
        await ch.default_exchange.publish(Message(b"x"), routing_key=qname)  # confirmed
    await ch.close()
    ov = await mgmt.until("/api/overview", lambda o: o["message_stats"]["publish"] >= before + 4)
    assert ov["message_stats"]["publish"] == before + 4
    await conn.close()


async def test_queue_put_purge_delete(mgmt: MgmtBroker) -> None:
    qname = unique("put")
    status, _ = mgmt.api("PUT", f"/api/queues/%2F/{qname}",
                         {"durable": False, "auto_delete": False,
                          "arguments": {"x-max-length": 10}})
    assert status == 201
    assert mgmt.api("PUT", f"/api/queues/%2F/{qname}",
                    {"durable": False, "arguments": {"x-max-length": 10}})[0] == 204
    status, err = mgmt.api("PUT", f"/api/queues/%2F/{qname}", {"durable": True})
    assert status == 400
    assert "inequivalent arg 'durable'" in err["reason"]

    conn = await connect(mgmt, qname)
    ch = await conn.channel()
    await ch.declare_queue(qname, passive=True)  # the HTTP-declared queue exists for AMQP
    for _ in range(4):
        await ch.default_exchange.publish(Message(b"m"), routing_key=qname)
    await mgmt.until(f"/api/queues/%2F/{qname}", lambda d: d["messages"] == 4)
    assert mgmt.api("DELETE", f"/api/queues/%2F/{qname}/contents")[0] == 204
    declared = await ch.declare_queue(qname, passive=True)
    assert declared.declaration_result.message_count == 0

    await ch.default_exchange.publish(Message(b"m"), routing_key=qname)
    await mgmt.until(f"/api/queues/%2F/{qname}", lambda d: d["messages"] == 1)
    status, err = mgmt.api("DELETE", f"/api/queues/%2F/{qname}?if-empty=true")
    assert status == 400 and "not empty" in err["reason"]
    assert mgmt.api("DELETE", f"/api/queues/%2F/{qname}")[0] == 204
    assert mgmt.api("GET", f"/api/queues/%2F/{qname}")[0] == 404
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        await ch.declare_queue(qname, passive=True)
    await conn.close()


async def test_exchanges_and_bindings(mgmt: MgmtBroker) -> None:
    xname, qname = unique("ex"), unique("bq")
    assert mgmt.api("PUT", f"/api/exchanges/%2F/{xname}",
                    {"type": "topic", "durable": True})[0] == 201
    ex = mgmt.get(f"/api/exchanges/%2F/{xname}")
    assert (ex["type"], ex["durable"], ex["internal"]) == ("topic", True, False)
    names = {e["name"] for e in mgmt.get("/api/exchanges/%2F")}
    assert {"", "amq.direct", "amq.topic", xname} <= names
    assert mgmt.get("/api/exchanges/%2F/amq.default")["type"] == "direct"
    status, err = mgmt.api("PUT", "/api/exchanges/%2F/amq.mine", {"type": "direct"})
    assert status == 403 and "reserved prefix" in err["reason"]

    mgmt.api("PUT", f"/api/queues/%2F/{qname}", {"durable": True})
    status, _ = mgmt.api("POST", f"/api/bindings/%2F/e/{xname}/q/{qname}",
                         {"routing_key": "a.*", "arguments": {}})
    assert status == 201
    listed = mgmt.get(f"/api/bindings/%2F/e/{xname}/q/{qname}")
    assert [(b["source"], b["destination"], b["destination_type"], b["routing_key"])
            for b in listed] == [(xname, qname, "queue", "a.*")]
    everything = mgmt.get("/api/bindings/%2F")
    assert {"source": "", "destination": qname, "routing_key": qname}.items() <= next(
        b for b in everything if b["source"] == "" and b["destination"] == qname).items()
    assert [b["routing_key"] for b in mgmt.get(f"/api/queues/%2F/{qname}/bindings")] == [
        qname, "a.*"]

    conn = await connect(mgmt, qname)
    ch = await conn.channel()
    x = await ch.get_exchange(xname)
    await x.publish(Message(b"routed"), routing_key="a.b")
    await x.publish(Message(b"dropped"), routing_key="b.a")
    await mgmt.until(f"/api/queues/%2F/{qname}", lambda d: d["messages"] == 1)

    key = listed[0]["properties_key"]
    assert mgmt.api("DELETE", f"/api/bindings/%2F/e/{xname}/q/{qname}/{key}")[0] == 204
    assert mgmt.get(f"/api/bindings/%2F/e/{xname}/q/{qname}") == []
    assert mgmt.api("DELETE", f"/api/exchanges/%2F/{xname}")[0] == 204
    assert mgmt.api("GET", f"/api/exchanges/%2F/{xname}")[0] == 404
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        await ch.get_exchange(xname, ensure=True)
    mgmt.api("DELETE", f"/api/queues/%2F/{qname}")
    await conn.close()


async def test_connections_channels_and_forced_close(mgmt: MgmtBroker) -> None:
    name = unique("conn")
    conn = await aiormq.connect(mgmt.url + f"?name={name}")
    ch = await conn.channel()
    await ch.confirm_delivery() if hasattr(ch, "confirm_delivery") else None
    info = await find_connection(mgmt, name)
    assert info["user"] == "guest" and info["vhost"] == "/"
    assert info["peer_host"] == "127.0.0.1" and info["port"] == mgmt.port
    assert info["protocol"] == "AMQP 0-9-1" and info["channels"] == 1
    assert info["client_properties"]["product"] == "aiormq"
    # the handshake went both ways: bytes counted in and out
    assert info["recv_oct"] > 0 and info["send_oct"] > 0
    assert mgmt.get(f"/api/connections/{info['name']}")["name"] == info["name"]
    chans = [c for c in mgmt.get("/api/channels")
             if c["connection_details"]["name"] == info["name"]]
    assert [(c["number"], c["user"], c["vhost"]) for c in chans] == [(1, "guest", "/")]
    assert mgmt.get(f"/api/connections/{info['name']}/channels")[0]["name"] == chans[0]["name"]

    status, _ = mgmt.api("DELETE", f"/api/connections/{info['name']}",
                         headers={"X-Reason": "maintenance"})
    assert status == 204
    with pytest.raises(aiormq.exceptions.ConnectionClosed) as closed:
        await asyncio.wait_for(conn.closing, 5)
    assert closed.value.args[0] == 320
    assert "maintenance" in closed.value.args[1]
    await mgmt.until("/api/connections", lambda cs: all(c["name"] != info["name"] for c in cs))
    assert mgmt.api("DELETE", f"/api/connections/{info['name']}")[0] == 404


async def test_nodes_and_healthcheck(mgmt: MgmtBroker) -> None:
    assert mgmt.get("/api/healthchecks/node") == {"status": "ok"}
    nodes = mgmt.get("/api/nodes")  # a multi-worker server's workers are its nodes
    assert sorted(int(n["os_pid"]) for n in nodes) == sorted(mgmt.serving_pids())
    for node in nodes:
        assert node["name"].startswith("hare@") and node["running"] is True
        assert node["mem_used"] > 10_000_000  # a Python process: tens of MB resident
        assert node["mem_alarm"] is False and node["disk_free_alarm"] is False
        assert node["disk_free"] > 0
        assert mgmt.get(f"/api/nodes/{node['name']}")["os_pid"] == node["os_pid"]
    assert mgmt.api("GET", "/api/nodes/rabbit@elsewhere")[0] == 404


async def test_disk_alarm_in_health_nodes_metrics_and_page_data(tmp_path) -> None:
    b = MgmtBroker(tmp_path / "alarm", ["--disk-free-limit", str(10**18)]).start()
    try:
        health = await b.until("/api/overview", lambda o: True)  # up and answering
        assert health["node"].startswith("hare@")
        status, body = b.api("GET", "/api/healthchecks/node")
        for _ in range(50):  # the disk monitor's first check runs as the node starts
            if status == 503:
                break
            await asyncio.sleep(0.05)
            status, body = b.api("GET", "/api/healthchecks/node")
        assert (status, body["status"], body["alarms"]) == (503, "failed", ["disk"])
        for node in b.get("/api/nodes"):  # every worker's at workers > 1: one disk
            assert node["disk_free_alarm"] is True and node["mem_alarm"] is False
            assert node["disk_free_limit"] == 10**18
        _, _, text = b.raw("/metrics")
        assert "rabbitmq_alarms_free_disk_space_watermark 1.0" in text
        assert "rabbitmq_alarms_memory_used_watermark 0.0" in text
    finally:
        b.stop()


async def test_rates_after_a_sample(mgmt: MgmtBroker) -> None:
    """100 publishes: within one 5 s sample they show as 20.0/s (split over two samples if
    the publishing straddled a sampling instant)."""
    qname = unique("rate")
    conn = await connect(mgmt, qname)
    ch = await conn.channel()
    await ch.declare_queue(qname)
    for _ in range(100):
        await ch.default_exchange.publish(Message(b"r"), routing_key=qname)

    def rate(d: dict) -> float:
        return d["message_stats"]["publish_details"]["rate"]

    path = f"/api/queues/%2F/{qname}"
    first = rate(await mgmt.until(path, lambda d: rate(d) > 0, timeout=7))
    total = first
    if first < 19.9:
        total += rate(await mgmt.until(path, lambda d: rate(d) != first, timeout=7))
    assert total == pytest.approx(20.0, abs=0.2)
    info = mgmt.get(path)
    assert info["message_stats"]["publish"] == 100
    await conn.close()


async def test_exchange_to_exchange_binding(mgmt: MgmtBroker) -> None:
    src, dst, qname = unique("src"), unique("dst"), unique("e2e")
    mgmt.api("PUT", f"/api/exchanges/%2F/{src}", {"type": "direct", "durable": False})
    mgmt.api("PUT", f"/api/exchanges/%2F/{dst}", {"type": "fanout", "durable": False})
    mgmt.api("PUT", f"/api/queues/%2F/{qname}", {"durable": False})
    assert mgmt.api("POST", f"/api/bindings/%2F/e/{src}/e/{dst}",
                    {"routing_key": "go", "arguments": {"x-note": 1}})[0] == 201
    assert mgmt.api("POST", f"/api/bindings/%2F/e/{dst}/q/{qname}", {})[0] == 201
    [b] = mgmt.get(f"/api/exchanges/%2F/{src}/bindings/source")
    assert (b["destination"], b["destination_type"], b["arguments"]) == (
        dst, "exchange", {"x-note": 1})
    assert b["properties_key"].startswith("go~")
    assert [x["source"] for x in mgmt.get(f"/api/exchanges/%2F/{dst}/bindings/destination")
            ] == [src]
    assert mgmt.api("POST", f"/api/bindings/%2F/e/{src}/q/missing", {})[0] == 404

    conn = await connect(mgmt, qname)
    ch = await conn.channel()
    x = await ch.get_exchange(src)
    await x.publish(Message(b"via e2e"), routing_key="go")
    await mgmt.until(f"/api/queues/%2F/{qname}", lambda d: d["messages"] == 1)
    status, _ = mgmt.api("DELETE", f"/api/bindings/%2F/e/{src}/e/{dst}/{b['properties_key']}")
    assert status == 204
    assert mgmt.get(f"/api/exchanges/%2F/{src}/bindings/source") == []
    await conn.close()
