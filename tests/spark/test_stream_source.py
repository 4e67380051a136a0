"""The "amqp-stream" source against a real Hare: offsets as Spark's offsets, every kind of
startingOffsets, maxOffsetsPerTrigger, replays by offset, data loss, and exactly-once into
sinks that are idempotent per batch across a failed batch, a killed source runner, a broker
killed mid-batch, and two queries on one stream. (The driver killed with SIGKILL:
test_driver_kill.py.)"""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path

import pika
import pytest

from broker.spark.columns import STREAM_ARROW_SCHEMA
from broker.spark.options import OptionError, StreamSourceOptions
from broker.spark.stream_source import AmqpStreamSourceReader, DataLoss
from tests.conftest import BrokerProc
from tests.spark.helpers import kill, source_runners, wait_for


def fill(url: str, name: str, bodies: list[bytes], declare: bool = True,
         props: pika.BasicProperties | None = None, **arguments: object) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    if declare:
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream", **arguments})
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", name, body, props)
    conn.close()


def reader(url: str, name: str, **options: object) -> AmqpStreamSourceReader:
    return AmqpStreamSourceReader(StreamSourceOptions.parse(
        {"url": url, "stream": name, **{k: str(v) for k, v in options.items()}}))


def offsets(batches) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


def stream(spark, url: str, name: str, **options: object):
    r = spark.readStream.format("amqp-stream").option("url", url).option("stream", name)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


# -- options and the reader's calls, without Spark ----------------------------------------


def test_options() -> None:
    base = {"url": "amqp://h/", "stream": "s"}
    assert StreamSourceOptions.parse(base).starting == "latest"
    assert StreamSourceOptions.parse({**base, "startingOffsets": "Earliest"}).starting == (
        "earliest")
    assert StreamSourceOptions.parse({**base, "startingOffsets": "42"}).starting == 42
    when = StreamSourceOptions.parse({**base, "startingOffsets": "2026-01-01T10:00:00"})
    assert when.starting == datetime.datetime(2026, 1, 1, 10, tzinfo=datetime.UTC)
    opts = StreamSourceOptions.parse({**base, "maxOffsetsPerTrigger": "100"})
    assert (opts.max_offsets_per_trigger, opts.prefetch) == (100, 200)
    for bad, text in (({"startingOffsets": "soon"}, "'startingOffsets' must be earliest"),
                      ({"startingOffsets": "-1"}, "must not be negative"),
                      ({"queue": "q"}, "unknown option 'queue'"),
                      ({"failOnDataLoss": "maybe"}, "true or false")):
        with pytest.raises(OptionError, match=text):
            StreamSourceOptions.parse({**base, **bad})


def test_batches_are_offset_ranges_and_a_replay_reads_the_same(hare) -> None:
    name = "ss-reader"
    fill(hare.url, name, [b"m%d" % i for i in range(25)])
    r = reader(hare.url, name, startingOffsets="earliest", maxOffsetsPerTrigger=10,
               pollTimeoutMs=10_000)
    start = r.initialOffset()
    assert start == {"start": "earliest"}
    ends = []
    seen: list[int] = []
    while len(seen) < 25:  # a batch is what has arrived, at most 10
        rows, end = r.read(start)
        batch = list(rows)
        assert all(b.schema == STREAM_ARROW_SCHEMA for b in batch)
        got = offsets(batch)
        assert 0 < len(got) <= 10 and got == list(range(len(seen), len(seen) + len(got)))
        seen += got
        assert end["offset"] == len(seen)  # offset ranges, back to back
        ends.append(end)
        start = end
    # the first batch's end says where it began: its start was symbolic
    assert ends[0]["from"] == 0 and all("from" not in e for e in ends[1:])
    r2 = reader(hare.url, name, pollTimeoutMs=200)
    rows, end = r2.read({"offset": 25})
    assert list(rows) == [] and end == {"offset": 25}  # nothing after the last: start back
    # a batch planned before a restart is read again by offset: the same messages
    again = list(r.readBetweenOffsets({"offset": 10}, {"offset": 20}))
    assert offsets(again) == list(range(10, 20))
    assert again[0].column("body").to_pylist() == [b"m%d" % i for i in range(10, 20)]
    assert offsets(r.readBetweenOffsets({"start": "earliest"}, ends[0])) == list(
        range(ends[0]["offset"]))
    # commit acks nothing: the stream still holds everything
    r.commit({"offset": 25})
    fill(hare.url, name, [b"late"], declare=False,
         props=pika.BasicProperties(headers={"k": "v"}, message_id="m-late"))
    rows, end = r.read(start)
    [late] = list(rows)
    assert offsets([late]) == [25] and end == {"offset": 26}
    # the offset is a column; the headers keep what the publisher sent
    assert late.column("headers").to_pylist() == [[("k", "v")]]
    assert late.column("message_id").to_pylist() == ["m-late"]
    assert again[0].column("headers").to_pylist()[0] is None


def test_starting_offsets(hare) -> None:
    name = "ss-start"
    fill(hare.url, name, [b"a%d" % i for i in range(5)])
    # AMQP timestamps have whole seconds: the next one starts between the two publishes
    boundary = int(time.time()) + 1
    time.sleep(max(0.0, boundary - time.time()) + 0.01)
    fill(hare.url, name, [b"b%d" % i for i in range(5)], declare=False)

    def first_batch(**options: object) -> list[int]:
        """What a new query reads from its start, until a poll finds nothing."""
        r = reader(hare.url, name, pollTimeoutMs=1000, **options)
        start, got = r.initialOffset(), []
        while True:
            rows, end = r.read(start)
            batch = offsets(rows)
            if not batch:
                return got
            got += batch
            start = end

    assert first_batch(startingOffsets="earliest") == list(range(10))
    assert first_batch(startingOffsets=7) == [7, 8, 9]
    when = datetime.datetime.fromtimestamp(boundary, datetime.UTC).isoformat()
    assert first_batch(startingOffsets=when) == list(range(5, 10))
    # latest: only what comes after the query started
    r = reader(hare.url, name, pollTimeoutMs=300)
    start = r.initialOffset()
    rows, end = r.read(start)
    assert list(rows) == [] and end == start == {"start": "latest"}
    threading.Timer(0.3, fill, (hare.url, name, [b"new"], False)).start()
    r = reader(hare.url, name, pollTimeoutMs=30_000)
    rows, end = r.read(r.initialOffset())
    assert offsets(rows) == [10] and end == {"offset": 11, "from": 10}


def test_available_now_reads_to_the_end_it_found(hare) -> None:
    """Trigger.AvailableNow: up to the stream's end when the query starts, then it stops,
    even while more arrives (a busy stream cannot keep it going)."""
    name = "ss-available"
    fill(hare.url, name, [b"%d" % i for i in range(30)])
    r = reader(hare.url, name, startingOffsets="earliest", maxOffsetsPerTrigger=8)
    r.prepareForTriggerAvailableNow()
    fill(hare.url, name, [b"later"] * 5, declare=False)
    start: dict = r.initialOffset()
    got: list[int] = []
    while True:
        rows, end = r.read(start)
        batch = offsets(rows)
        if not batch:
            break
        assert len(batch) <= 8
        got += batch
        start = end
    assert got == list(range(30)) and start == {"offset": 30}


def test_offsets_gone_fail_the_query_unless_told_otherwise(hare) -> None:
    name = "ss-retention"
    segment = {"x-stream-max-segment-size-bytes": 2000, "x-max-length-bytes": 4000}
    fill(hare.url, name, [b"%03d" % i + b"." * 200 for i in range(40)], **segment)
    with pytest.raises(DataLoss, match=r"offsets 0\.\.\d+ of stream 'ss-retention' are gone"):
        reader(hare.url, name, startingOffsets=0, pollTimeoutMs=10_000).read({"offset": 0})
    r = reader(hare.url, name, startingOffsets=0, failOnDataLoss="false", pollTimeoutMs=1000)
    start: dict = {"offset": 0}
    got: list[int] = []
    while True:
        rows, end = r.read(start)
        batch = offsets(rows)
        if not batch:
            break
        got += batch
        start = end
    assert got[0] > 0 and got == list(range(got[0], 40)) and start == {"offset": 40}


def test_a_queue_that_is_not_a_stream_is_refused(hare) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(hare.url))
    ch = conn.channel()
    ch.queue_declare("ss-classic")
    ch.basic_publish("", "ss-classic", b"x")
    conn.close()
    with pytest.raises(RuntimeError, match="the queue is not a stream"):
        reader(hare.url, "ss-classic", startingOffsets="earliest",
               pollTimeoutMs=10_000).read({"start": "earliest"})


# -- queries --------------------------------------------------------------------------------


@pytest.mark.parametrize("crash", ["batch-fails", "kill-source-runner"])
def test_restart_after_a_crash_mid_batch_gives_each_message_once(spark, hare, tmp_path: Path,
                                                                 crash: str) -> None:
    name = f"ss-crash-{crash}"
    total = 300
    fill(hare.url, name, [b"%d" % i for i in range(total)])
    jvm_pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
    sink: dict[int, list[bytes]] = {}  # idempotent per batch: a replay replaces its batch
    restarted = False

    def each_batch(df, batch_id: int) -> None:
        sink[batch_id] = [r.body for r in df.select("body").collect()]
        if batch_id == 2 and not restarted:
            if crash == "kill-source-runner":
                kill(source_runners(jvm_pid)[0])
            raise RuntimeError("crash in batch 2")

    def run(**trigger: bool):
        writer = (stream(spark, hare.url, name, startingOffsets="earliest",
                         maxOffsetsPerTrigger=40)
                  .writeStream.foreachBatch(each_batch)
                  .option("checkpointLocation", str(tmp_path / "ckpt")))
        return (writer.trigger(**trigger) if trigger else writer).start()

    query = run()
    with pytest.raises(Exception, match="crash in batch 2"):
        query.awaitTermination(120)
    first_try = list(sink[2])
    restarted = True
    query = run(availableNow=True)
    query.awaitTermination(120)
    assert query.exception() is None
    assert sink[2] == first_try  # the same batch again, by offset
    got = [b for rows in sink.values() for b in rows]
    assert sorted(got) == sorted(b"%d" % i for i in range(total)) and len(got) == total


def test_broker_killed_mid_batch_and_restarted(spark, tmp_path: Path) -> None:
    """The source reconnects at the offset after its last batch: the query goes on, the
    Parquet file sink holds each message once."""
    b = BrokerProc(tmp_path / "data").start()
    name = "ss-broker-kill"
    try:
        fill(b.url, name, [b"before-%d" % i for i in range(200)])
        killed = threading.Event()

        def each_batch(df, batch_id: int) -> None:
            df.write.mode("append").parquet(str(tmp_path / "out" / f"batch={batch_id}"))
            if batch_id == 1 and not killed.is_set():
                b.kill()  # mid-batch: this batch's data is in Spark already
                b.start()  # the same port, the same data
                killed.set()

        # foreachBatch's writes are keyed by batch (a replay overwrites nothing here: it
        # would write a second file); the check below finds any duplicate
        query = (stream(spark, b.url, name, startingOffsets="earliest", maxOffsetsPerTrigger=50)
                 .writeStream.foreachBatch(each_batch)
                 .option("checkpointLocation", str(tmp_path / "ckpt")).start())
        try:
            assert killed.wait(120)
            fill(b.url, name, [b"after-%d" % i for i in range(100)], declare=False)

            def arrived() -> bool:
                if query.exception() is not None:
                    raise AssertionError(query.exception())
                try:
                    return spark.read.parquet(str(tmp_path / "out")).count() >= 300
                except Exception:
                    return False

            wait_for(arrived, timeout=180, what="every message in the sink")
        finally:
            query.stop()
        got = [r.body for r in spark.read.parquet(str(tmp_path / "out")).collect()]
        want = [b"before-%d" % i for i in range(200)] + [b"after-%d" % i for i in range(100)]
        assert sorted(got) == sorted(want) and len(got) == 300
    finally:
        b.stop()


def test_two_queries_read_one_stream_independently(spark, hare, tmp_path: Path) -> None:
    name = "ss-two"
    fill(hare.url, name, [b"%d" % i for i in range(120)])
    queries = []
    for i, (start, size) in enumerate((("earliest", 25), ("60", 7))):
        queries.append(stream(spark, hare.url, name, startingOffsets=start,
                              maxOffsetsPerTrigger=size)
                       .writeStream.format("memory").queryName(f"ss_two_{i}")
                       .option("checkpointLocation", str(tmp_path / f"ckpt{i}"))
                       .trigger(availableNow=True).start())
    for q in queries:
        q.awaitTermination(120)
        assert q.exception() is None
    a = [r.offset for r in spark.sql("select offset from ss_two_0").collect()]
    b = [r.offset for r in spark.sql("select offset from ss_two_1").collect()]
    assert sorted(a) == list(range(120)) and sorted(b) == list(range(60, 120))
    sizes = [p["numInputRows"] for p in queries[1].recentProgress if p["numInputRows"]]
    assert max(sizes) <= 7  # maxOffsetsPerTrigger
