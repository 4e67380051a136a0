"""spark.read.format("hare-store"): a stopped broker's directory read offline equals, message
for message, what the broker serves after a restart; damage is a row, never a crash; a running
broker's directory is refused unless allowLive=true; nothing in the directory changes."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika import DeliveryMode, Message

from broker.spark.columns import header_strings
from broker.store.layout import STREAMS, queue_dir_name
from broker.store.queue_index_format import FILE_HEADER_SIZE
from tests.conftest import BrokerProc

CONFIG = """vhosts = ["orders"]
[[permissions]]
user = "guest"
vhost = "orders"
configure = ".*"
write = ".*"
read = ".*"
"""
# (vhost, queue, body sizes): the index embeds a message whose encoded size is below 4096
DURABLE = [
    ("/", "small", [0, 10, 1000, 3900] * 3),
    ("/", "big", [4096, 5000, 70_000, 9000] * 2),
    ("orders", "mixed", [100, 4050, 4100, 9000, 20] * 2),
    ("/", "prio", [10, 5000, 100] * 3),  # x-max-priority 3; priority i % 5, so 4 counts as 3
]
MAX_PRIORITY = {"prio": 3}
ACKED = {"small": 3, "big": 2, "mixed": 0, "prio": 2}  # fetched and acked first
UNACKED = {"small": 2, "big": 1, "mixed": 2, "prio": 1}  # then fetched, never acked
EPOCH = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
COLUMNS = ["vhost", "queue", "body", "redelivered", "persistent", "exchange", "routing_key",
           "message_id", "correlation_id", "content_type", "headers", "ts", "priority",
           "delivery_mode", "type", "app_id"]


def url(b: BrokerProc, vhost: str) -> str:
    return b.url if vhost == "/" else f"{b.url}{vhost}"


def body_of(queue: str, i: int, size: int) -> bytes:
    head = f"{queue}:{i}:".encode()
    return (head + hashlib.sha256(head).digest() * (size // 32 + 1))[:size]


def message(queue: str, i: int, size: int, persistent: bool = True) -> Message:
    return Message(
        body_of(queue, i, size),
        delivery_mode=DeliveryMode.PERSISTENT if persistent else DeliveryMode.NOT_PERSISTENT,
        message_id=f"{queue}-{i}", correlation_id=f"c{i}", content_type="application/x-test",
        headers={"i": i, "s": "x", "nested": {"a": [1, "b"]}, "flag": i % 2 == 0},
        timestamp=EPOCH + dt.timedelta(seconds=i), priority=i % 5, type="t", app_id="hare",
    )


async def fill(b: BrokerProc) -> list[aio_pika.abc.AbstractConnection]:
    """Publish the mix (confirmed), ack some, leave some delivered but unacked; returns the
    connections holding the unacked ones (open until the broker goes)."""
    holders = []
    for vhost, queue, sizes in DURABLE:
        conn = await aio_pika.connect(url(b, vhost))
        ch = await conn.channel(publisher_confirms=True)
        x = await ch.declare_exchange(f"x-{queue}", aio_pika.ExchangeType.DIRECT, durable=True)
        args = {"x-max-priority": MAX_PRIORITY[queue]} if queue in MAX_PRIORITY else None
        q = await ch.declare_queue(queue, durable=True, arguments=args)
        await q.bind(x, "k")
        for i, size, persistent in published(queue, sizes):
            await x.publish(message(queue, i, size, persistent), routing_key="k")
        for _ in range(ACKED[queue]):
            await (await q.get()).ack()
        for _ in range(UNACKED[queue]):
            await q.get()  # delivered, never acked
        await ch.declare_queue(queue, passive=True)  # the acks are through the queue
        holders.append(conn)
    conn = await aio_pika.connect(b.url)  # a non-durable queue: nothing of it survives
    ch = await conn.channel(publisher_confirms=True)
    await ch.declare_queue("nd", durable=False)
    for i in range(3):
        await ch.default_exchange.publish(message("nd", i, 5000), routing_key="nd")
    holders.append(conn)
    return holders


async def served(b: BrokerProc) -> list[tuple[Any, ...]]:
    """Every message the broker serves, queue by queue, as comparable tuples."""
    out = []
    for vhost, queue, _ in DURABLE:
        conn = await aio_pika.connect(url(b, vhost))
        ch = await conn.channel()
        q = await ch.declare_queue(queue, passive=True)
        while (m := await q.get(fail=False)) is not None:
            ts = None if m.timestamp is None else int(m.timestamp.replace(tzinfo=dt.UTC)
                                                      .timestamp())
            out.append((vhost, queue, m.body, m.redelivered, m.delivery_mode == 2, m.exchange,
                        m.routing_key, m.message_id, m.correlation_id, m.content_type,
                        dict(header_strings(m.headers) or []), ts, m.priority,
                        int(m.delivery_mode), m.type, m.app_id))
            await m.ack()
        await conn.close()
    return out


def read(spark, data: Path, **options: str):
    r = spark.read.format("hare-store")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load(str(data))


def rows(spark, data: Path) -> list[tuple[Any, ...]]:
    df = read(spark, data).where("_damaged IS NULL").orderBy("vhost", "queue", "seq_id")
    df = df.withColumn("ts", df["timestamp"].cast("long"))
    got = []
    for r in df.select(*COLUMNS, "seq_id").collect():
        t = list(r)
        t[2] = bytes(t[2])
        t[10] = dict(t[10] or {})
        got.append(tuple(t))
    # delivery order: queue by queue; a priority queue's highest level (seq_id >> 48) first
    order = {(v, q): n for n, (v, q, _) in enumerate(DURABLE)}
    got.sort(key=lambda t: (order[t[0], t[1]], -(t[-1] >> 48), t[-1]))
    return [t[:-1] for t in got]


def published(queue: str, sizes: list[int]) -> list[tuple[int, int, bool]]:
    """(i, size, persistent) in queue order: every 4th message is followed by a transient one
    (a durable queue loses those at a restart)."""
    out = []
    for i, size in enumerate(sizes):
        out.append((i, size, True))
        if i % 4 == 3:
            out.append((1000 + i, size, False))
    return out


def expected() -> list[tuple[bytes, bool]]:
    """(body, redelivered) the broker holds after a clean stop, in delivery order."""
    out = []
    for _, queue, sizes in DURABLE:
        cap = MAX_PRIORITY.get(queue, 0)
        order = sorted(published(queue, sizes), key=lambda m: -min(m[0] % 1000 % 5, cap))
        for n, (i, size, persistent) in enumerate(order):
            if n >= ACKED[queue] and persistent:
                out.append((body_of(queue, i, size), n < ACKED[queue] + UNACKED[queue]))
    return out


def snapshot(data: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data)): p.read_bytes()
            for p in sorted(data.rglob("*")) if p.is_file() and p.name != "hare.lock"}


@pytest.mark.parametrize("stop", ["sigterm", "kill9", "workers"])
async def test_rows_equal_what_the_broker_serves_after_a_restart(spark, tmp_path, stop) -> None:
    """`workers`: a 2-worker server with its queues spread (balanced), stopped by SIGTERM:
    the read walks each worker's directory."""
    (tmp_path / "hare.toml").write_text(CONFIG)
    spread = ["--workers", "2", "--queue-master-locator", "balanced"] if stop == "workers" else []
    b = BrokerProc(tmp_path / "data", ["--config", str(tmp_path / "hare.toml"), *spread])
    b.start(60)
    if stop == "workers":
        stop = "sigterm"
        assert len(b.serving_pids()) == 2
    try:
        holders = await fill(b)
        if stop == "sigterm":
            assert b.stop() == 0
        else:
            b.kill()
        for conn in holders:
            with contextlib.suppress(Exception):
                await conn.close()
        before = snapshot(b.data_dir)
        got = rows(spark, b.data_dir)
        assert snapshot(b.data_dir) == before  # read only
        if stop == "sigterm":
            assert [(t[2], t[3]) for t in got] == expected()
        b.start(60)
        assert got == await served(b)
    finally:
        b.kill()
    confirmed = {body for body, _ in expected()}  # confirmed and never acked: never lost
    assert confirmed <= {t[2] for t in got}
    assert all(t[4] for t in got) and not any(t[1] == "nd" for t in got)


async def test_where_each_body_is_and_the_queue_names(spark, tmp_path) -> None:
    b = BrokerProc(tmp_path / "data").start()
    try:
        conn = await aio_pika.connect(b.url)
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("q", durable=True)
        for i, size in enumerate([10, 9000]):
            await ch.default_exchange.publish(message("q", i, size), routing_key="q")
        await ch.declare_queue("q2", durable=True)
        await ch.default_exchange.publish(message("q2", 0, 10), routing_key="q2")
        await conn.close()
    finally:
        b.stop()
    df = read(spark, b.data_dir)
    assert df.rdd.getNumPartitions() == 2  # one per queue index segment
    assert df.where("queue = 'q2'").count() == 1
    got = df.where("queue = 'q'").orderBy("seq_id").collect()
    assert [(r.vhost, r.queue, r.seq_id, r.size, r.exchange, r.routing_key) for r in got] == [
        ("/", "q", 0, 10, "", "q"), ("/", "q", 1, 9000, "", "q")]
    small, big = got
    index = b.queue_dir("q")  # data/queues/<hash>, or a worker's: data/w1/queues/<hash>
    node = index.parent.parent.relative_to(b.data_dir)
    assert index.name == queue_dir_name("/", "q")
    assert small.file.startswith(f"{index.relative_to(b.data_dir)}/")
    assert small.file.endswith(".hqi") and small.offset >= FILE_HEADER_SIZE
    assert big.file.startswith(f"{node / 'msg_store_persistent'}/")
    assert big.file.endswith(".hseg")
    with open(b.data_dir / big.file, "rb") as f:  # the record's payload ends with the body
        f.seek(big.offset)
        assert f.read(25 + 9000 + 200).find(bytes(big.body)) > 0
    assert len(small.msg_id) == 32 and small.msg_id != big.msg_id
    assert small.headers == {"i": "0", "s": "x", "nested": '{"a":[1,"b"]}', "flag": "true"}
    assert small.delivery_mode == 2 and small.priority == 0 and small._damaged is None


async def stopped_dir(tmp_path: Path, sizes: list[int], kill: bool = False) -> Path:
    b = BrokerProc(tmp_path / "data").start()
    try:
        conn = await aio_pika.connect(b.url)
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("q", durable=True)
        for i, size in enumerate(sizes):
            await ch.default_exchange.publish(message("q", i, size), routing_key="q")
        await conn.close()
    finally:
        b.kill() if kill else b.stop()
    return b.queue_dir("q").parent.parent  # the node directory (a worker's, at workers > 1)


async def test_damage_is_a_row_with_file_and_offset_never_a_crash(spark, tmp_path) -> None:
    data = await stopped_dir(tmp_path, [10] * 6 + [9000] * 4, kill=True)
    [seg] = (data / "queues").glob("*/*.hqi")
    raw = bytearray(seg.read_bytes())
    # records in publish order; damage the 2nd record's body, tear the last one
    second = FILE_HEADER_SIZE + _record_size(raw, FILE_HEADER_SIZE)
    raw[second + 20] ^= 0xFF
    seg.write_bytes(bytes(raw[:-5]))
    [store] = (data / "msg_store_persistent").glob("*.hseg")
    sraw = bytearray(store.read_bytes())
    sraw[16 + 25 + 100] ^= 0xFF  # the first store body (message 6)
    store.write_bytes(bytes(sraw))  # after a crash: found by the scan, no message to name
    df = read(spark, data)
    damage = df.where("_damaged IS NOT NULL").orderBy("file", "offset").collect()
    good = df.where("_damaged IS NULL").orderBy("seq_id").collect()
    assert [r.seq_id for r in good] == [0, 2, 3, 4, 5, 7, 8]
    assert all(r.body == body_of("q", r.seq_id, r.size) for r in good)
    what = [(r.file.split("/")[0], r.offset, r._damaged.split(" ")[0]) for r in damage]
    assert what == [("msg_store_persistent", 16, "corrupt"), ("queues", second, "corrupt"),
                    ("queues", len(raw) - _tail(raw), "torn")]
    assert damage[0].queue is None and damage[1].queue == "q"


async def test_a_body_damaged_after_a_clean_stop_names_its_message(spark, tmp_path) -> None:
    data = await stopped_dir(tmp_path, [10, 9000, 9000])
    [store] = (data / "msg_store_persistent").glob("*.hseg")
    with open(store, "r+b") as f:  # the snapshot is trusted: found when the body is read
        f.seek(16 + 25 + 100)
        f.write(b"X")
    got = read(spark, data).orderBy("seq_id").collect()
    assert [(r.seq_id, r._damaged is None) for r in got] == [(0, True), (1, False), (2, True)]
    assert got[1]._damaged.startswith("store record unreadable: checksum mismatch")
    assert (got[1].queue, got[1].file, got[1].offset) == ("q", f"msg_store_persistent/{store.name}",
                                                           16)


def _record_size(raw: bytearray, pos: int) -> int:
    return 9 + int.from_bytes(raw[pos + 4 : pos + 8], "big")


def _tail(raw: bytearray) -> int:
    """Size of the last record of a segment image."""
    pos = FILE_HEADER_SIZE
    while pos + _record_size(raw, pos) < len(raw):
        pos += _record_size(raw, pos)
    return len(raw) - pos


async def test_damaged_store_file_header_is_reported(spark, tmp_path) -> None:
    data = await stopped_dir(tmp_path, [10, 9000], kill=True)
    [store] = (data / "msg_store_persistent").glob("*.hseg")
    with open(store, "r+b") as f:
        f.write(b"JUNK")
    got = read(spark, data).orderBy("seq_id").collect()
    assert [(r.seq_id, r._damaged) for r in got if r._damaged is None] == [(0, None)]
    [bad] = [r for r in got if r._damaged is not None]
    assert bad.file == f"msg_store_persistent/{store.name}" and bad.offset == 0
    assert bad._damaged.startswith("bad header") and bad.queue is None


async def test_a_running_brokers_directory_is_refused_unless_allow_live(spark, tmp_path):
    b = BrokerProc(tmp_path / "data").start()
    try:
        conn = await aio_pika.connect(b.url)
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("q", durable=True)
        await ch.default_exchange.publish(message("q", 0, 10), routing_key="q")
        await conn.close()
        with pytest.raises(Exception, match=rf"running broker \(pid {b.pid} holds hare.lock\)"):
            read(spark, b.data_dir).collect()
        assert [r.seq_id for r in read(spark, b.data_dir, allowLive="true").collect()] == [0]
    finally:
        b.stop()


def test_bad_options_and_directories_are_clear_errors(spark, tmp_path) -> None:
    with pytest.raises(Exception, match="hare-store: option 'allowLive' must be true or false"):
        read(spark, tmp_path, allowLive="yes").collect()
    with pytest.raises(Exception, match="hare-store: unknown option 'queue'"):
        read(spark, tmp_path, queue="q").collect()
    with pytest.raises(Exception, match="not a Hare data directory"):
        read(spark, tmp_path).collect()
    with pytest.raises(Exception, match="is not a directory"):
        read(spark, tmp_path / "nope").collect()
    os.mkdir(tmp_path / "queues")
    assert read(spark, tmp_path).count() == 0  # an empty (never used) directory


@pytest.mark.parametrize("stop", ["sigterm", "kill9"])
def test_streams_offsets_and_times(spark, tmp_path, stop) -> None:
    """A stream's rows: every message it holds, with its offset and its chunk's time, the
    same a consumer from `first` gets after a restart; a torn tail is a damage row."""
    import pika

    b = BrokerProc(tmp_path / "data").start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("events", durable=True, arguments={
            "x-queue-type": "stream", "x-stream-max-segment-size-bytes": 3000})
        ch.confirm_delivery()
        before = dt.datetime.now(dt.UTC)
        for i in range(60):
            ch.basic_publish("", "events", body_of("events", i, 90),
                             pika.BasicProperties(message_id=f"e{i}", headers={"i": i}))
        after = dt.datetime.now(dt.UTC)
        conn.close()
        if stop == "sigterm":
            assert b.stop() == 0
        else:
            b.kill()
        stream_dir = b.queue_dir("events", STREAMS)
        segments = sorted(stream_dir.glob("*.hstr"))
        assert len(segments) > 2
        df = read(spark, b.data_dir).where("queue = 'events'").orderBy("stream_offset")
        got = df.collect()
        assert [r.stream_offset for r in got] == list(range(60))
        assert [r.seq_id for r in got] == list(range(60))
        assert all(r._damaged is None and r.msg_id is None for r in got)
        assert [bytes(r.body) for r in got] == [body_of("events", i, 90) for i in range(60)]
        assert got[7].message_id == "e7" and got[7].headers == {"i": "7",
                                                                 "x-stream-offset": "7"}
        times = [r.stream_time.replace(tzinfo=dt.UTC) for r in got]
        assert times == sorted(times)
        assert before - dt.timedelta(seconds=1) <= times[0] and times[-1] <= after
        assert got[0].file.startswith(f"{stream_dir.parent.relative_to(b.data_dir)}/")
        assert got[0].file.endswith(".hstr")

        # what a consumer from the first offset gets after a restart
        b.start()
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        served_rows = []
        ch.basic_consume("events", lambda c, m, p, body: served_rows.append(
            (p.headers["x-stream-offset"], body)), arguments={"x-stream-offset": "first"})
        while len(served_rows) < 60:
            conn.process_data_events(time_limit=0.1)
        conn.close()
        assert served_rows == [(r.stream_offset, bytes(r.body)) for r in got]
    finally:
        b.stop()
    with open(segments[-1], "ab") as f:  # half a chunk at the end, as a crash leaves it
        f.write(b"\x00\x00\x00\x01\x00\x00\x01\x00\x03" + b"\x00" * 40)
    damaged = read(spark, b.data_dir).where("_damaged IS NOT NULL").collect()
    assert [(r.queue, r.file.endswith(segments[-1].name), r._damaged) for r in damaged] == [
        ("events", True, "torn tail (49 bytes)")]
