"""A data pipeline on Hare and Spark, end to end, on one machine: `make pipeline`.

1. Starts a Hare of its own (or uses the broker given with --url).
2. Publishes synthetic order events to the topic exchange "orders" (routing keys
   order.<region>.<kind>); a durable queue "orders.audit" keeps a copy of the paid ones that
   nobody consumes.
3. A Structured Streaming query reads the queue "orders.events" with the "amqp" source and
   sums orders and amounts per routing key per minute of event time. Each micro-batch appends
   its updated totals to Parquet and publishes them to the exchange "orders.totals".
4. A plain consumer prints the totals as they arrive.
5. The same events, kept in the stream "orders.feed", are replayed from its first offset by a
   second query with the "amqp-stream" source into Parquet: each event exactly once, however
   often the query is restarted.
6. The broker is stopped and Spark reads its data directory with "hare-store": a backlog report
   of what the queues and the stream still hold.

Spark's Python workers must import `broker`: PYSPARK_PYTHON names their interpreter, and
local_session() points it at this one unless you set it (see docs/SPARK.md).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika

EVENTS = "orders"
EVENTS_QUEUE = "orders.events"
AUDIT_QUEUE = "orders.audit"
FEED = "orders.feed"  # a stream: every event, kept to be read again
TOTALS = "orders.totals"
TOTALS_QUEUE = "orders.totals.print"
REGIONS = ("eu", "us", "apac")
KINDS = ("created", "paid", "shipped")


def start_hare(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    """A hare-server on a free port; returns the process and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "--port", "0", "--data-dir", str(data_dir),
         "--management-port", "0", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on port" in line:
            return proc, f"amqp://guest:guest@127.0.0.1:{int(line.rsplit(' ', 1)[1])}/"
    raise SystemExit("hare-server did not start")


def declare(url: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.exchange_declare(EVENTS, "topic", durable=True)
    channel.exchange_declare(TOTALS, "fanout", durable=True)
    for queue, exchange, key in ((EVENTS_QUEUE, EVENTS, "order.#"),
                                 (AUDIT_QUEUE, EVENTS, "order.*.paid"),
                                 (TOTALS_QUEUE, TOTALS, "")):
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange, key)
    channel.queue_declare(FEED, durable=True, arguments={"x-queue-type": "stream"})
    channel.queue_bind(FEED, EVENTS, "order.#")
    connection.close()


def orders(count: int) -> Iterator[tuple[str, dict[str, object]]]:
    """`count` synthetic order events (routing key, order), the same on every run; event time
    runs a minute every 600 orders."""
    rng = random.Random(7)
    start_event_time = 1_767_225_600  # 2026-01-01T00:00:00Z
    for i in range(count):
        region, kind = rng.choice(REGIONS), rng.choice(KINDS)
        yield f"order.{region}.{kind}", {"order_id": i, "region": region, "kind": kind,
                                         "amount": round(rng.uniform(5, 500), 2),
                                         "ts": start_event_time + i // 10}


def publish_orders(url: str, count: int, seconds: float) -> None:
    """The orders, published (confirmed, persistent) over `seconds`."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    pause = seconds / count
    for key, order in orders(count):
        channel.basic_publish(EVENTS, key, json.dumps(order).encode(),
                              pika.BasicProperties(content_type="application/json",
                                                   message_id=str(order["order_id"]),
                                                   timestamp=order["ts"], delivery_mode=2))
        if pause:
            time.sleep(pause)
    connection.close()


def print_totals(url: str, stop: threading.Event) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    for method, _props, body in channel.consume(TOTALS_QUEUE, inactivity_timeout=0.5):
        if method is not None:
            total = json.loads(body)
            print(f"  totals  {total['minute']}  {total['routing_key']:<20} "
                  f"{total['orders']:>4} orders  {total['amount']:>10.2f}", flush=True)
            channel.basic_ack(method.delivery_tag)
        elif stop.is_set():
            break
    connection.close()


def start_query(spark, url: str, out: Path):
    """The streaming query: orders from the queue, totals per routing key and minute of event
    time; each micro-batch appends its updated totals to Parquet and publishes them."""
    from pyspark.sql import functions as F

    order = "order_id long, region string, kind string, amount double, ts long"
    orders = (spark.readStream.format("amqp").option("url", url)
              .option("queue", EVENTS_QUEUE).option("maxMessagesPerBatch", "1000").load()
              .select("routing_key",
                      F.from_json(F.col("body").cast("string"), order).alias("o"))
              .select("routing_key", "o.amount",
                      F.timestamp_seconds("o.ts").alias("event_time")))
    totals = (orders.groupBy("routing_key", F.window("event_time", "1 minute").alias("w"))
              .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("amount"))
              .select("routing_key",
                      F.date_format("w.start", "yyyy-MM-dd HH:mm").alias("minute"),
                      "orders", "amount"))

    def store_and_publish(batch, batch_id: int) -> None:
        batch = batch.withColumn("batch_id", F.lit(batch_id)).persist()
        batch.write.mode("append").parquet(str(out / "totals"))
        # Each total is the running total of its key and minute, so a consumer keeps the one
        # of the highest batch; the message id names batch, key and minute.
        (batch.select(F.to_json(F.struct("routing_key", "minute", "orders", "amount"))
                      .alias("body"),
                      F.concat_ws("/", "batch_id", "routing_key", "minute").alias("message_id"),
                      F.lit("application/json").alias("content_type"))
         .write.format("amqp").option("url", url).option("exchange", TOTALS)
         .mode("append").save())
        batch.unpersist()

    return (totals.writeStream.outputMode("update").foreachBatch(store_and_publish)
            .option("checkpointLocation", str(out / "checkpoint"))
            .trigger(processingTime="2 seconds").start())


def replay_feed(spark, url: str, out: Path) -> None:
    """Every event again, from the stream's first offset: a query with the "amqp-stream"
    source into Parquet (Spark's file sink writes each batch once: exactly once), run until
    it has read what the stream holds."""
    from pyspark.sql import functions as F

    query = (spark.readStream.format("amqp-stream").option("url", url).option("stream", FEED)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "1000")
             .load().select("offset", "routing_key", "body")
             .writeStream.format("parquet").option("path", str(out / "feed"))
             .option("checkpointLocation", str(out / "feed-checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    feed = spark.read.parquet(str(out / "feed"))
    span = feed.agg(F.count("*").alias("n"), F.min("offset").alias("first"),
                    F.max("offset").alias("last")).first()
    print(f"\nreplayed {span.n} events from stream {FEED!r} (offsets {span.first}.."
          f"{span.last}) into {out / 'feed'}, each once:")
    feed.groupBy("routing_key").count().orderBy("routing_key").show(truncate=False)


def run(spark, args: argparse.Namespace, work: Path) -> None:
    """The pipeline on `spark`, its files under `work` (see the module docstring)."""
    out = work / "out"
    hare = None
    data_dir = args.data_dir
    if args.url:
        url = args.url
    else:
        data_dir = work / "hare-data"
        hare, url = start_hare(data_dir)
        print(f"started Hare at {url} (data in {data_dir})")
    try:
        declare(url)
        stop = threading.Event()
        printer = threading.Thread(target=print_totals, args=(url, stop))
        printer.start()
        try:
            query = start_query(spark, url, out)
            print(f"publishing {args.events} order events to exchange {EVENTS!r} ...")
            publish_orders(url, args.events, args.seconds)
            # Every event is in the queue (confirmed): run until all went through a committed
            # batch, then stop. (Their acks went out when the query next asked for data.)
            query.processAllAvailable()
            query.stop()
        finally:
            stop.set()  # the printer drains what is queued, then stops
            printer.join()
        print(f"\nParquet totals in {out / 'totals'} (latest update per key and minute):")
        latest_totals(spark.read.parquet(str(out / "totals"))).show(12, truncate=False)
        replay_feed(spark, url, out)
        if hare is not None:
            hare.terminate()
            hare.wait(30)
            hare = None
        if data_dir is None:
            print("\nno --data-dir given: no backlog report")
        else:
            backlog_report(spark, data_dir)
    finally:
        if hare is not None:
            hare.kill()
            hare.wait()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="use this broker instead of starting a Hare")
    parser.add_argument("--data-dir", type=Path,
                        help="with --url: that broker's data directory, for the backlog "
                             "report (stop the broker first, or the reader refuses it)")
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=10.0, help="publishing time")
    parser.add_argument("--work", type=Path,
                        help="where Parquet, checkpoint and Hare's data go (default: a new "
                             "temporary directory)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from broker.spark.local import local_session

    work = args.work or Path(tempfile.mkdtemp(prefix="hare-pipeline-"))
    spark = local_session("hare-pipeline", work)
    try:
        run(spark, args, work)
    finally:
        spark.stop()
    return 0


def latest_totals(result):
    """Each micro-batch appended the totals it updated: keep the last one per key and minute."""
    from pyspark.sql import functions as F

    latest = F.max_by(F.struct("orders", "amount"), "batch_id").alias("t")
    return (result.groupBy("minute", "routing_key").agg(latest)
            .select("minute", "routing_key", "t.orders", "t.amount")
            .orderBy("minute", "routing_key"))


def backlog_report(spark, data_dir: Path) -> None:
    """What a stopped broker's queues still hold, read from its files by Spark."""
    from pyspark.sql import functions as F

    print(f"\nbacklog of the stopped broker, read from {data_dir} with hare-store:")
    backlog = spark.read.format("hare-store").load(str(data_dir))
    (backlog.groupBy("vhost", "queue")
     .agg(F.count("*").alias("messages"), F.sum("size").alias("bytes"),
          F.min("timestamp").alias("oldest"))
     .orderBy("vhost", "queue").show(truncate=False))


if __name__ == "__main__":
    sys.exit(main())
