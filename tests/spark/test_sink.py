"""The "amqp" sink against a real Hare: batch and streaming writes, confirmed; a return, a nack
or a missing exchange fails the write; message ids are deterministic."""

from __future__ import annotations

import re
from pathlib import Path

import pika
import pytest
from pyspark.sql import functions as F

from tests.spark.helpers import publish, wait_for


def declare(url: str, exchange: str, queue: str, binding: str = "#",
            arguments: dict[str, object] | None = None) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.exchange_declare(exchange, "topic")
    channel.queue_declare(queue, arguments=arguments)
    channel.queue_bind(queue, exchange, binding)
    connection.close()


def drain(url: str, queue: str, expected: int) -> list[tuple[pika.spec.Basic.Deliver,
                                                            pika.BasicProperties, bytes]]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    got = []

    def take() -> bool:
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            got.append((method, props, body))
        return len(got) >= expected

    wait_for(take, timeout=30, what=f"{expected} messages on {queue}")
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    connection.close()
    return got


def test_batch_write_publishes_every_row_confirmed(spark, hare) -> None:
    declare(hare.url, "sink-batch", "sink-batch-q", "orders.*")
    rows = [(f"order {i}", f"orders.{'eu' if i % 2 else 'us'}", {"n": str(i)}) for i in range(40)]
    df = spark.createDataFrame(rows, "body string, routing_key string, "
                                     "headers map<string,string>").repartition(2)
    (df.withColumn("content_type", F.lit("text/plain"))
       .write.format("amqp").option("url", hare.url).option("exchange", "sink-batch")
       .mode("append").save())

    got = drain(hare.url, "sink-batch-q", 40)
    bodies = {body.decode(): (m.routing_key, p) for m, p, body in got}
    assert sorted(bodies) == sorted(f"order {i}" for i in range(40))
    key, props = bodies["order 3"]
    assert key == "orders.eu" and props.headers == {"n": "3"}
    assert props.content_type == "text/plain" and props.delivery_mode == 2
    # No message_id column: <write id>-<partition>-<row>, unique, one write id for the write.
    ids = [p.message_id for _, (_, p) in bodies.items()]
    assert len(set(ids)) == 40
    parts = [re.fullmatch(r"([0-9a-f]{12})-(\d+)-(\d+)", i) for i in ids]
    assert all(parts) and len({m.group(1) for m in parts if m}) == 1
    assert {m.group(2) for m in parts if m} == {"0", "1"}


def test_message_id_and_exchange_columns_win_and_binary_body(spark, hare) -> None:
    declare(hare.url, "sink-ids", "sink-ids-q")
    declare(hare.url, "sink-ids-other", "sink-ids-other-q")
    df = spark.createDataFrame(
        [(b"\x00\x01", "k", "mine-1", None), (b"\x02", "k", None, None),
         (b"\x03", "k", None, "sink-ids-other")],
        "body binary, routing_key string, message_id string, exchange string")
    df.coalesce(1).write.format("amqp").option("url", hare.url).option(
        "exchange", "sink-ids").option("persistent", "false").mode("append").save()
    # A null exchange falls back to the option; a row's own exchange wins over it.
    got = {body: p for _, p, body in drain(hare.url, "sink-ids-q", 2)}
    assert got[b"\x00\x01"].message_id == "mine-1"
    assert re.fullmatch(r"[0-9a-f]{12}-0-1", got[b"\x02"].message_id)
    assert got[b"\x02"].delivery_mode == 1
    [(_, other, body)] = drain(hare.url, "sink-ids-other-q", 1)
    assert body == b"\x03" and re.fullmatch(r"[0-9a-f]{12}-0-2", other.message_id)


def test_unroutable_message_fails_the_write(spark, hare) -> None:
    declare(hare.url, "sink-return", "sink-return-q", "bound")
    df = spark.createDataFrame([("a", "bound"), ("b", "nowhere")], "body string, "
                                                                   "routing_key string")
    with pytest.raises(Exception, match="returned: 312 NO_ROUTE"):
        df.coalesce(1).write.format("amqp").option("url", hare.url).option(
            "exchange", "sink-return").mode("append").save()


def test_nack_fails_the_write(spark, hare) -> None:
    # A full queue that rejects publishes: the broker nacks the overflow.
    declare(hare.url, "sink-nack", "sink-nack-q", arguments={
        "x-max-length": 3, "x-overflow": "reject-publish"})
    df = spark.createDataFrame([(f"m{i}",) for i in range(10)], "body string")
    with pytest.raises(Exception, match="broker nacked publish"):
        df.coalesce(1).write.format("amqp").option("url", hare.url).option(
            "exchange", "sink-nack").option("routingKey", "any").mode("append").save()


def test_missing_exchange_fails_the_write(spark, hare) -> None:
    df = spark.createDataFrame([("a",)], "body string")
    with pytest.raises(Exception, match=r"404.*NOT_FOUND - no exchange 'sink-missing'"):
        df.write.format("amqp").option("url", hare.url).option(
            "exchange", "sink-missing").mode("append").save()


@pytest.mark.parametrize(("ddl", "named"), [
    ("payload string", "needs a 'body' column"),
    ("body int", "column 'body' must be string or binary"),
    ("body string, routingKey string", r"unknown column\(s\) \['routingKey'\]"),
    ("body string, headers string", "column 'headers' must be a map"),
])
def test_bad_frame_is_refused_naming_the_column(spark, hare, ddl: str, named: str) -> None:
    df = spark.createDataFrame([], ddl)
    with pytest.raises(Exception, match=named):
        df.write.format("amqp").option("url", hare.url).mode("append").save()


def test_stream_from_queue_to_exchange(spark, hare, tmp_path: Path) -> None:
    declare(hare.url, "sink-stream", "sink-stream-out")
    publish(hare.url, "sink-stream-in", (b"%d" % i for i in range(30)))
    source = (spark.readStream.format("amqp").option("url", hare.url)
              .option("queue", "sink-stream-in").option("maxMessagesPerBatch", "10").load())
    out = source.select(F.upper(F.col("body").cast("string")).alias("body"),
                        F.concat(F.lit("n."), F.col("body").cast("string")).alias("routing_key"))
    query = (out.writeStream.format("amqp").option("url", hare.url)
             .option("exchange", "sink-stream")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .queryName("sink_stream")  # Spark passes it on among the sink's options
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    got = drain(hare.url, "sink-stream-out", 30)
    assert sorted(int(body) for _, _, body in got) == list(range(30))
    assert {m.routing_key for m, _, body in got} == {f"n.{i}" for i in range(30)}
    # <batch>-<partition>-<row>: three batches of ten, so the same ids after a replay.
    ids = sorted(p.message_id for _, p, _ in got)
    assert {i.split("-")[0] for i in ids} == {"0", "1", "2"}
    assert len(set(ids)) == 30
