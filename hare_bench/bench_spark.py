"""The Spark connector beside plain pika: `python -m hare_bench.bench_spark --url URL`.

source: N messages are put on a queue, then drained once by a plain pika consumer (same
prefetch, one multiple-ack per batch) and once by a Structured Streaming query on the "amqp"
source (Trigger.AvailableNow into the noop sink), alternating for --runs rounds. Spark's rate
is that of the batches after the first (the query's start-up and the first batch's warm-up
are reported apart as start-up).

sink: N rows written with df.write.format("amqp") (pipelined confirms), beside one pika
BlockingChannel publishing the same messages with confirms on, which waits for each confirm.

stream: N messages are put on a stream queue once, then read from its first offset by a plain
pika consumer (x-stream-offset first, same prefetch, one multiple-ack per batch) and by a query
on the "amqp-stream" source (startingOffsets earliest, Trigger.AvailableNow, noop sink),
alternating; a stream keeps its messages, so every round reads the same ones.

pyspark is imported inside the functions: the rest of hare_bench runs without it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pika

from hare_perf.cli import DEFAULT_URL

__all__ = ["main"]

QUEUE = "bench-spark"
EXCHANGE = "bench-spark-x"
SINK_QUEUE = "bench-spark-sink"
STREAM = "bench-spark-stream"


def _channel(url: str) -> tuple[pika.BlockingConnection, Any]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    return connection, connection.channel()


def _fill(url: str, count: int, size: int) -> None:
    connection, channel = _channel(url)
    channel.queue_declare(QUEUE)
    channel.queue_purge(QUEUE)
    body = b"x" * size
    for _ in range(count):
        channel.basic_publish("", QUEUE, body)
    # A passive declare after the publishes: the broker has routed them all.
    while channel.queue_declare(QUEUE, passive=True).method.message_count < count:
        time.sleep(0.05)
    connection.close()


def _fill_stream(url: str, count: int, size: int) -> None:
    connection, channel = _channel(url)
    channel.queue_delete(STREAM)
    channel.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    body = b"x" * size
    for _ in range(count):
        channel.basic_publish("", STREAM, body)
    # A stream counts what it has committed: all of them, once on disk.
    while channel.queue_declare(STREAM, passive=True).method.message_count < count:
        time.sleep(0.05)
    connection.close()


def pika_consume(url: str, count: int, prefetch: int, batch: int, queue: str = QUEUE,
                 arguments: dict[str, Any] | None = None) -> float:
    """Messages per second of a plain pika consumer reading `count` messages."""
    connection, channel = _channel(url)
    channel.basic_qos(prefetch_count=prefetch)
    start = time.perf_counter()
    for got, (method, _props, _body) in enumerate(
            channel.consume(queue, inactivity_timeout=30, arguments=arguments), 1):
        if method is None:
            raise SystemExit("pika consumer: queue ran dry")
        if got % batch == 0 or got == count:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if got == count:
            break
    elapsed = time.perf_counter() - start
    channel.cancel()
    connection.close()
    return count / elapsed


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def spark_consume(spark: Any, url: str, count: int, batch: int, scratch: Path,
                  stream: bool = False) -> tuple[float, float]:
    """(messages per second over the batches, start-up seconds) of the amqp source, or of
    the amqp-stream source from the stream's first offset."""
    started = time.perf_counter()
    if stream:
        reader = (spark.readStream.format("amqp-stream").option("stream", STREAM)
                  .option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", str(batch)))
    else:
        reader = (spark.readStream.format("amqp").option("queue", QUEUE)
                  .option("maxMessagesPerBatch", str(batch)))
    query = (reader.option("url", url).load()
             .writeStream.format("noop")
             .option("checkpointLocation", tempfile.mkdtemp(dir=scratch))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"spark query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    if rows != count:
        raise SystemExit(f"spark read {rows} messages, expected {count}")

    def end(p: dict[str, Any]) -> float:
        return _when(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000

    # The first batch carries the query's warm-up (code generation, the first Python
    # workers): the rate is that of the batches after it.
    first, last = end(progress[0]), max(end(p) for p in progress)
    steady = rows - progress[0]["numInputRows"]
    startup = time.perf_counter() - started - (last - first)
    return steady / (last - first), startup


def pika_publish(url: str, count: int, size: int) -> float:
    connection, channel = _channel(url)
    channel.confirm_delivery()
    body = b"x" * size
    props = pika.BasicProperties(delivery_mode=2)
    start = time.perf_counter()
    for _ in range(count):
        channel.basic_publish(EXCHANGE, "k", body, props, mandatory=True)
    elapsed = time.perf_counter() - start
    channel.queue_purge(SINK_QUEUE)
    connection.close()
    return count / elapsed


def spark_publish(spark: Any, url: str, count: int, size: int) -> float:
    from pyspark.sql import functions as F

    df = (spark.range(count, numPartitions=2)
          .select(F.expr(f"repeat('x', {size})").alias("body"), F.lit("k").alias("routing_key"))
          .cache())
    df.count()  # materialize, so the timing is the publishing
    start = time.perf_counter()
    df.write.format("amqp").option("url", url).option("exchange", EXCHANGE).mode(
        "append").save()
    elapsed = time.perf_counter() - start
    df.unpersist()
    connection, channel = _channel(url)
    got = channel.queue_declare(SINK_QUEUE, passive=True).method.message_count
    channel.queue_purge(SINK_QUEUE)
    connection.close()
    if got != count:
        raise SystemExit(f"spark sink: {got} messages arrived, expected {count}")
    return count / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hare_bench.bench_spark",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--sink-count", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--batch", type=int, default=30000,
                        help="maxMessagesPerBatch (the source's default)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=("source", "sink", "stream"))
    args = parser.parse_args(argv)

    from broker.spark.local import local_session

    scratch = Path(tempfile.mkdtemp(prefix="hare-bench-spark-"))
    spark = local_session("hare-bench-spark", scratch)
    try:
        if args.only in (None, "source"):
            # A first query warms the JVM up (class loading, JIT, the Python workers).
            _fill(args.url, 2 * args.batch, args.size)
            spark_consume(spark, args.url, 2 * args.batch, args.batch, scratch)
            plain, ours, startups = [], [], []
            for run in range(args.runs):
                _fill(args.url, args.count, args.size)
                plain.append(pika_consume(args.url, args.count, 2 * args.batch, args.batch))
                _fill(args.url, args.count, args.size)
                rate, startup = spark_consume(spark, args.url, args.count, args.batch, scratch)
                ours.append(rate)
                startups.append(startup)
                print(f"source run {run + 1}: pika {plain[-1]:,.0f} msg/s, spark "
                      f"{ours[-1]:,.0f} msg/s (+{startup:.1f} s start-up), "
                      f"ratio {ours[-1] / plain[-1]:.2f}", flush=True)
            ratio = statistics.median(o / p for o, p in zip(ours, plain, strict=True))
            print(f"source median: pika {statistics.median(plain):,.0f} msg/s, spark "
                  f"{statistics.median(ours):,.0f} msg/s, ratio (median of the runs' ratios) "
                  f"{ratio:.2f}; start-up {statistics.median(startups):.1f} s")
        if args.only in (None, "stream"):
            _fill_stream(args.url, args.count, args.size)
            spark_consume(spark, args.url, args.count, args.batch, scratch, stream=True)  # warm
            plain, ours, startups = [], [], []
            for run in range(args.runs):
                plain.append(pika_consume(args.url, args.count, 2 * args.batch, args.batch,
                                          STREAM, {"x-stream-offset": "first"}))
                rate, startup = spark_consume(spark, args.url, args.count, args.batch, scratch,
                                              stream=True)
                ours.append(rate)
                startups.append(startup)
                print(f"stream run {run + 1}: pika {plain[-1]:,.0f} msg/s, spark "
                      f"{ours[-1]:,.0f} msg/s (+{startup:.1f} s start-up), "
                      f"ratio {ours[-1] / plain[-1]:.2f}", flush=True)
            ratio = statistics.median(o / p for o, p in zip(ours, plain, strict=True))
            print(f"stream median: pika {statistics.median(plain):,.0f} msg/s, spark "
                  f"{statistics.median(ours):,.0f} msg/s, ratio (median of the runs' ratios) "
                  f"{ratio:.2f}; start-up {statistics.median(startups):.1f} s")
        if args.only in (None, "sink"):
            connection, channel = _channel(args.url)
            channel.exchange_declare(EXCHANGE, "direct")
            channel.queue_declare(SINK_QUEUE)
            channel.queue_bind(SINK_QUEUE, EXCHANGE, "k")
            connection.close()
            spark_publish(spark, args.url, 2000, args.size)  # warm-up, not counted
            plain, ours = [], []
            for run in range(args.runs):
                plain.append(pika_publish(args.url, args.sink_count, args.size))
                ours.append(spark_publish(spark, args.url, args.sink_count, args.size))
                print(f"sink run {run + 1}: pika (confirm each) {plain[-1]:,.0f} msg/s, "
                      f"spark {ours[-1]:,.0f} msg/s, ratio {ours[-1] / plain[-1]:.2f}",
                      flush=True)
            ratio = statistics.median(o / p for o, p in zip(ours, plain, strict=True))
            print(f"sink median: pika (confirm each) {statistics.median(plain):,.0f} msg/s, "
                  f"spark {statistics.median(ours):,.0f} msg/s, ratio (median of the runs' "
                  f"ratios) {ratio:.2f}")
    finally:
        connection, channel = _channel(args.url)
        for queue in (QUEUE, SINK_QUEUE, STREAM):
            channel.queue_delete(queue)
        channel.exchange_delete(EXCHANGE)
        connection.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
