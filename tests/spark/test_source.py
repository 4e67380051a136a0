"""The "amqp" streaming source against a real Hare: columns, admission control, acks that wait
for Spark's commit, and no loss across a crash of the source mid-batch."""

from __future__ import annotations

import gc
import threading
from datetime import UTC, datetime
from pathlib import Path

import pika
import pytest

from broker.spark.columns import SOURCE_ARROW_SCHEMA
from broker.spark.options import SourceOptions
from broker.spark.source import AmqpStreamReader
from tests.spark.helpers import counts, kill, publish, source_runners, wait_for


def drained(hare, queue: str) -> None:
    """0 ready, 0 unacked, no consumer: once the source's connection is closed (Spark stops
    the source runner asynchronously), anything it had not acked would be ready again."""
    last = [(-1, -1, -1)]

    def empty() -> bool:
        last[0] = counts(hare, queue)
        return last[0] == (0, 0, 0)

    try:
        wait_for(empty, timeout=30, what=f"{queue} drained")
    except AssertionError as e:
        raise AssertionError(f"{e}: (ready, unacked, consumers) = {last[0]}") from None


def stream(spark, hare, queue: str, **options: object):
    reader = spark.readStream.format("amqp").option("url", hare.url).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


# -- options ------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "error"), [
    ({"prefech": 1000}, "amqp source: unknown option 'prefech'"),
    ({"prefetch": 100}, r"'prefetch' \(100\) must be at least 2 x maxMessagesPerBatch \(200\)"),
])
def test_bad_option_fails_the_query(spark, hare, tmp_path: Path, options: dict[str, int],
                                    error: str) -> None:
    df = stream(spark, hare, "src-badopt", maxMessagesPerBatch=100, **options)
    query = df.writeStream.format("noop").option(
        "checkpointLocation", str(tmp_path / "ckpt")).start()
    try:
        with pytest.raises(Exception, match=error):
            query.awaitTermination(60)
    finally:
        query.stop()


# -- reading ------------------------------------------------------------------------------


def test_reader_hands_batches_over_and_acks_them_once_committed(hare) -> None:
    """The reader's calls as Spark's source runner makes them, without Spark."""
    queue = "src-reader"
    publish(hare.url, queue, (b"%d" % i for i in range(30)))
    reader = AmqpStreamReader(SourceOptions.parse(
        {"url": hare.url, "queue": queue, "maxMessagesPerBatch": "10"}))
    rows, end = reader.read({"seq": 0})
    [batch] = list(rows)
    assert end == {"seq": 10} and batch.schema == SOURCE_ARROW_SCHEMA
    assert batch.column("body").to_pylist() == [b"%d" % i for i in range(10)]
    # prefetch 2 x 10: nothing acked while the batch is not committed
    wait_for(lambda: counts(hare, queue) == (10, 20, 1), what="two batches delivered")
    reader.commit({"seq": 10})
    wait_for(lambda: counts(hare, queue) == (0, 20, 1), what="batch 0..10 acked")
    rows, end = reader.read({"seq": 10})
    assert end == {"seq": 20}
    with pytest.raises(RuntimeError, match="after offset 5, but the source stands at 20"):
        reader.read({"seq": 5})
    # Spark reads after 20 only once 20 is committed, and may not call commit(20) before.
    rows, end = reader.read({"seq": 20})
    assert end == {"seq": 30}
    assert next(rows).column("body").to_pylist() == [b"%d" % i for i in range(20, 30)]
    wait_for(lambda: counts(hare, queue) == (0, 10, 1), what="batch 10..20 acked")
    # An executor replaying a batch planned before a restart gets no rows: they come back
    # redelivered on the new connection.
    assert list(reader.readBetweenOffsets({"seq": 20}, {"seq": 30})) == []
    # A reader dropped with a batch unacked closes its connection: the batch is back.
    del reader, rows
    gc.collect()
    wait_for(lambda: counts(hare, queue) == (10, 0, 0), what="last batch requeued")


def test_poll_timeout_is_how_long_a_batch_waits_for_its_first_message(hare) -> None:
    queue = "src-poll"
    publish(hare.url, queue, ())  # declared, empty
    quick = AmqpStreamReader(SourceOptions.parse(
        {"url": hare.url, "queue": queue, "pollTimeoutMs": "0"}))
    rows, end = quick.read({"seq": 0})
    assert end == {"seq": 0} and list(rows) == []  # nothing came: no batch
    del quick
    gc.collect()  # its consumer goes, so the message below can only go to the patient one
    wait_for(lambda: counts(hare, queue) == (0, 0, 0), what="quick reader closed")
    patient = AmqpStreamReader(SourceOptions.parse(
        {"url": hare.url, "queue": queue, "pollTimeoutMs": "60000"}))
    # Published while the reader waits: the same read returns it.
    later = threading.Timer(0.5, publish, (hare.url, queue, [b"late"]))
    later.start()
    try:
        rows, end = patient.read({"seq": 0})
    finally:
        later.join()
    assert end == {"seq": 1}
    assert next(rows).column("body").to_pylist() == [b"late"]
    del patient, rows
    gc.collect()
    wait_for(lambda: counts(hare, queue) == (1, 0, 0), what="uncommitted batch requeued")


def test_columns_and_batches(spark, hare, tmp_path: Path) -> None:
    queue = "src-columns"
    stamp = 1_700_000_000

    def props(i: int) -> pika.BasicProperties:
        return pika.BasicProperties(
            message_id=f"id-{i}", correlation_id=f"c-{i}", content_type="text/plain",
            timestamp=stamp + i,
            headers={"n": i, "s": "x", "b": b"raw", "t": True, "nested": {"k": [1, "a"]}})

    publish(hare.url, queue, (f"m{i}".encode() for i in range(25)), props)
    # One message delivered and requeued first: it comes back with redelivered set.
    connection = pika.BlockingConnection(pika.URLParameters(hare.url))
    method, _, _ = connection.channel().basic_get(queue)
    assert method is not None
    connection.close()

    df = stream(spark, hare, queue, maxMessagesPerBatch=10)
    query = (df.writeStream.format("memory").queryName("src_columns")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    rows = {r.body: r for r in spark.sql("select * from src_columns").collect()}
    assert sorted(rows) == sorted(f"m{i}".encode() for i in range(25))

    first = rows[b"m0"]
    assert first.redelivered is True
    assert first.exchange == "" and first.routing_key == queue and first.queue == queue
    assert first.message_id == "id-0" and first.correlation_id == "c-0"
    assert first.content_type == "text/plain"
    assert first.timestamp.astimezone(UTC) == datetime.fromtimestamp(stamp, UTC)
    assert first.headers == {"n": "0", "s": "x", "b": "raw", "t": "true",
                             "nested": '{"k":[1,"a"]}'}
    assert rows[b"m7"].redelivered is False and rows[b"m7"].message_id == "id-7"
    assert len({r.delivery_tag for r in rows.values()}) == 25

    # maxMessagesPerBatch is the admission limit of every batch.
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 25 and max(sizes) <= 10
    # Every message acked once its batch was committed (the consumer closes after the query).
    drained(hare, queue)


def test_acks_wait_for_the_commit_and_an_idle_stream_acks_its_last_batch(
        spark, hare, tmp_path: Path) -> None:
    queue = "src-acks"
    publish(hare.url, queue, (b"x%d" % i for i in range(20)))
    in_batch = threading.Event()
    release = threading.Event()
    seen: list[int] = []

    def each_batch(df, batch_id: int) -> None:
        seen.append(df.count())
        if batch_id == 0:
            in_batch.set()
            release.wait(60)

    df = stream(spark, hare, queue, maxMessagesPerBatch=20)
    query = (df.writeStream.foreachBatch(each_batch)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        assert in_batch.wait(60)
        # Mid-batch: all 20 delivered to the source, none acked yet.
        assert counts(hare, queue) == (0, 20, 1)
        release.set()
        # Nothing else is published, so Spark never calls commit(end) for batch 0; the
        # source acks it when Spark asks for the next offset after it.
        wait_for(lambda: counts(hare, queue) == (0, 0, 1), what="batch 0 acked")
    finally:
        release.set()
        query.stop()
    assert seen == [20]
    drained(hare, queue)


@pytest.mark.parametrize("crash", ["kill-source-runner", "batch-fails"])
def test_restart_from_checkpoint_loses_nothing(spark, hare, tmp_path: Path, crash: str) -> None:
    queue = f"src-crash-{crash}"
    total = 300
    publish(hare.url, queue, (b"%d" % i for i in range(total)))
    jvm_pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
    got: list[tuple[bytes, bool]] = []

    def each_batch(df, batch_id: int) -> None:
        got.extend((r.body, r.redelivered) for r in df.select("body", "redelivered").collect())
        if batch_id == 2 and not restarted:
            # Mid-batch: this batch's rows are out, its commit is not written.
            if crash == "kill-source-runner":
                runners = source_runners(jvm_pid)
                assert len(runners) == 1, runners
                kill(runners[0])
            raise RuntimeError("crash in batch 2")

    def run(trigger: dict[str, bool] | None = None):
        df = stream(spark, hare, queue, maxMessagesPerBatch=40)
        writer = (df.writeStream.foreachBatch(each_batch)
                  .option("checkpointLocation", str(tmp_path / "ckpt")))
        return writer.trigger(**trigger).start() if trigger else writer.start()

    restarted = False
    query = run()
    with pytest.raises(Exception, match="crash in batch 2"):
        query.awaitTermination(120)
    assert len(got) == 120
    restarted = True
    # The source's connection is gone: the unacked messages are back in the queue.
    wait_for(lambda: counts(hare, queue)[1:] == (0, 0), what="crashed consumer gone")

    query = run({"availableNow": True})
    query.awaitTermination(120)
    assert query.exception() is None

    bodies = [body for body, _ in got]
    assert set(bodies) == {b"%d" % i for i in range(total)}  # every message at least once
    first_run = {body for body, _ in got[:120]}
    for body, redelivered in got[120:]:
        if body in first_run:  # a duplicate is a redelivery of batch 2's messages
            assert redelivered, body
    assert len(bodies) - total <= 40
    drained(hare, queue)
