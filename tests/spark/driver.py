"""A Spark driver in a process of its own, for the tests that kill it with SIGKILL mid-batch
(tests/spark/test_driver_kill.py): one streaming query from the "amqp" or "amqp-stream" source
into a sink that is idempotent per batch (foreachBatch writes `batch-<id>.json` whole, by
rename, so a replayed batch replaces its file).

    python tests/spark/driver.py SOURCE URL NAME CHECKPOINT OUT BATCH [--hold N]

With --hold N it prints "holding N" once batch N's file is written and then waits inside the
batch, before Spark commits it: the moment a crash costs the most. Without it, the query runs
with Trigger.AvailableNow and exits when the source has nothing more."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.spark.local import local_session


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source", choices=("amqp", "amqp-stream"))
    parser.add_argument("url")
    parser.add_argument("name")
    parser.add_argument("checkpoint")
    parser.add_argument("out", type=Path)
    parser.add_argument("batch", type=int)
    parser.add_argument("--hold", type=int)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    spark = local_session("hare-driver-test", args.out.parent / "spark-scratch", cores=1)
    reader = spark.readStream.format(args.source).option("url", args.url)
    if args.source == "amqp":
        reader = reader.option("queue", args.name).option("maxMessagesPerBatch", args.batch)
    else:
        reader = (reader.option("stream", args.name).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", args.batch))
    df = reader.load()

    def each_batch(batch, batch_id: int) -> None:
        rows = [r.body.decode() for r in batch.select("body").collect()]
        path = args.out / f"batch-{batch_id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, path)
        print(f"batch {batch_id} {len(rows)}", flush=True)
        if batch_id == args.hold:
            print(f"holding {batch_id}", flush=True)
            time.sleep(3600)

    writer = df.writeStream.foreachBatch(each_batch).option("checkpointLocation",
                                                             args.checkpoint)
    if args.hold is None:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    query.awaitTermination()
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
