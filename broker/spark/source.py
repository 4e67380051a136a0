"""The "amqp" streaming source: one queue, at-least-once, acks after Spark's commit.

Where the code runs. Spark keeps one long-lived Python process per streaming source on the
driver (pyspark's python_streaming_source_runner) and calls `initialOffset`, `read` and
`commit` of ONE reader instance there, for the life of the query. That is where the consumer
lives (consumer.py: a thread of its own owns the connection). The reader is a
SimpleDataSourceStreamReader: `read(start)` takes the next batch from the consumer and returns
it as one Arrow record batch, which pyspark sends to the JVM with the batch's plan; the JVM
keeps it in the driver's block manager for the batch's task. No Python worker runs for a
batch and executors never talk to the broker. (A DataSourceStreamReader would pickle each
batch into a partition for a Python worker on an executor to decode and send back: a second
hop per batch: 1.12x slower, docs/BENCHMARKS.md.)

Offsets are ``{"seq": n}``: n counts the messages this query has taken from the queue. A batch
(start, end) is the deliveries numbered start..end-1 on the current connection; the last
delivery tag of each is kept until the batch is known to be committed, then acked with one
basic.ack(multiple).

Spark calls `commit(end)` late: only when it plans a batch after `end`, i.e. when new data has
arrived. It asks for the batch after `start` (`read(start)`) only once `start` is committed
(the commit log is written before the next batch is planned), so both ack up to their offset.
An idle queue therefore holds no batch unacked beyond one poll.

Closing. Spark ends the source runner with SIGTERM when the query stops or fails, and pyspark
never calls a simple reader's stop(); the consumer thread is a daemon, so the connection ends
with the process and the broker requeues what it delivered and nobody acked, as at-least-once
wants. Where the reader is dropped while its process goes on, a finalizer closes the consumer.
"""

from __future__ import annotations

import logging
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

import pika
import pyarrow as pa
from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from broker.spark.columns import to_record_batch
from broker.spark.consumer import QueueConsumer
from broker.spark.options import SourceOptions

__all__ = ["AmqpStreamReader"]

log = logging.getLogger("hare.spark.source")

Offset = dict[str, int]


class AmqpStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: QueueConsumer | None = None
        self._unacked: deque[tuple[int, int]] = deque()  # (batch end, its last tag), in order
        self._next_seq: int | None = None  # unknown until Spark tells us where we stand
        self._available_now: int | None = None  # messages left under Trigger.AvailableNow

    def __getstate__(self) -> dict[str, Any]:
        # A copy for an executor (readBetweenOffsets) needs only the options.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # -- driver side: the source runner process ---------------------------------------------

    def initialOffset(self) -> Offset:
        return {"seq": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        # What the queue holds now: what we have buffered plus what is ready on the broker.
        ready = self._ready_count()
        self._available_now = self._open().buffered() + ready

    def read(self, start: Offset) -> tuple[Iterator[pa.RecordBatch], Offset]:
        """The batch after `start`: at most maxMessagesPerBatch messages, waiting up to
        pollTimeoutMs for the first; `start` back and no rows when none came."""
        seq = int(start["seq"])
        # Spark asks for the next batch only after `start` is committed: ack through it.
        self._ack_through(seq)
        if self._next_seq is None:
            self._next_seq = seq
        elif seq != self._next_seq:
            raise RuntimeError(f"amqp source: Spark asked for data after offset {seq}, "
                               f"but the source stands at {self._next_seq}")
        wanted = self.options.max_messages_per_batch
        if self._available_now is not None:
            wanted = min(wanted, self._available_now)
            if wanted == 0:
                return iter(()), start
        deliveries = self._open().take(wanted, self.options.poll_timeout_ms / 1000)
        if not deliveries:
            return iter(()), start
        if self._available_now is not None:
            self._available_now -= len(deliveries)
        end = seq + len(deliveries)
        self._unacked.append((end, deliveries[-1].delivery_tag))
        self._next_seq = end
        # A list iterator: pyspark copies it to replay the batch from its cache.
        return iter([to_record_batch(deliveries, self.options.queue)]), {"seq": end}

    def commit(self, end: Offset) -> None:
        self._ack_through(int(end["seq"]))

    # -- executors ------------------------------------------------------------------------

    def readBetweenOffsets(self, start: Offset, end: Offset) -> Iterator[pa.RecordBatch]:
        """Only a batch that the source runner did not read itself comes here: one planned
        before a restart. Its messages were never acked; the broker redelivers them to the new
        connection and they come in the next batch, so this one is replayed empty."""
        if int(end["seq"]) > int(start["seq"]):
            log.info("amqp source: batch %s..%s is replayed empty; its messages come back "
                     "redelivered", start["seq"], end["seq"])
        return iter(())

    # -- helpers --------------------------------------------------------------------------

    def _open(self) -> QueueConsumer:
        if self._consumer is None:
            consumer = QueueConsumer(self.options.url, self.options.queue,
                                     self.options.prefetch,
                                     name=f"hare-spark source {self.options.queue}")
            weakref.finalize(self, consumer.close)
            self._consumer = consumer
        return self._consumer

    def _ack_through(self, seq: int) -> None:
        last_tag = None
        unacked = self._unacked
        while unacked and unacked[0][0] <= seq:
            last_tag = unacked.popleft()[1]
        if last_tag is not None and self._consumer is not None:
            self._consumer.ack_through(last_tag)

    def _ready_count(self) -> int:
        connection = pika.BlockingConnection(pika.URLParameters(self.options.url))
        try:
            ok = connection.channel().queue_declare(self.options.queue, passive=True)
            return int(ok.method.message_count)
        finally:
            connection.close()
