"""The "amqp" streaming source: one queue, at-least-once, acks after Spark's commit.

Where the code runs (Spark 4's Python Data Source API): Spark keeps one long-lived Python
process per streaming source on the driver (pyspark's python_streaming_source_runner) and
calls `initialOffset`, `latestOffset`, `partitions`, `commit` and `stop` of ONE reader instance
there, for the life of the query. That is where the consumer connection lives: opened on first
use, kept across micro-batches. Executors only run `read(partition)`, on a pickled copy of the
reader (made before the query starts, with no connection); the partition carries the batch's
messages as Arrow IPC bytes, so executors never talk to the broker.

Offsets are ``{"seq": n}``: n counts the messages this query has taken from the queue. A batch
(start, end) is the deliveries numbered start..end-1 on the current connection; their delivery
tags are kept until the batch is known to be committed, then acked with one basic.ack(multiple).

Spark calls `commit(end)` late: only when it plans a batch after `end`, i.e. when new data has
arrived. It calls `latestOffset(start)` only once `start` is committed (the commit log is
written before the next batch is planned), so both ack up to their offset. An idle queue
therefore holds no batch unacked beyond one poll.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from broker.spark.columns import to_record_batch
from broker.spark.consumer import Delivery, QueueConsumer
from broker.spark.options import SourceOptions

__all__ = ["AmqpPartition", "AmqpStreamReader"]

log = logging.getLogger("hare.spark.source")


class AmqpPartition(InputPartition):
    """One batch's messages as an Arrow IPC stream (empty bytes: no rows)."""

    def __init__(self, payload: bytes) -> None:
        super().__init__(None)
        self.payload = payload


@dataclass
class _Batch:
    start: int
    end: int
    last_tag: int
    deliveries: list[Delivery]


def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


class AmqpStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: QueueConsumer | None = None
        self._batches: deque[_Batch] = deque()  # taken, not yet acked, in order
        self._next_seq: int | None = None  # unknown until Spark tells us where we stand
        self._available_now: int | None = None  # messages left under Trigger.AvailableNow

    def __getstate__(self) -> dict[str, Any]:
        # The executors' copy needs only the options; a connection is never pickled.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # -- driver side: the source runner process ---------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        # What the queue holds now: what we have buffered plus what is ready on the broker.
        ready = self._ready_count()
        self._available_now = self._open().buffered() + ready

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        seq = int(start["seq"])
        # Spark asks for the next batch only after `start` is committed: ack through it.
        self._ack_through(seq)
        if self._next_seq is None:
            self._next_seq = seq
        elif seq != self._next_seq:
            raise RuntimeError(f"amqp source: Spark asked for data after offset {seq}, "
                               f"but the source stands at {self._next_seq}")
        if isinstance(limit, ReadAllAvailable):
            wanted = self.options.prefetch
        elif isinstance(limit, ReadMaxRows):
            wanted = limit.max_rows
        else:
            wanted = self.options.max_messages_per_batch
        if self._available_now is not None:
            wanted = min(wanted, self._available_now)
            if wanted == 0:
                return start
        consumer = self._open()
        deliveries = consumer.take(wanted, self.options.poll_timeout_ms / 1000)
        if not deliveries:
            return start
        if self._available_now is not None:
            self._available_now -= len(deliveries)
        end = seq + len(deliveries)
        self._batches.append(_Batch(seq, end, deliveries[-1].delivery_tag, deliveries))
        self._next_seq = end
        return {"seq": end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[AmqpPartition]:
        first, last = int(start["seq"]), int(end["seq"])
        deliveries = [d for b in self._batches if first <= b.start and b.end <= last
                      for d in b.deliveries]
        if not deliveries:
            if last > first:
                # A batch planned before a restart: its messages were never acked, the broker
                # redelivers them to this connection and they come in the next batch.
                log.info("amqp source: batch %s..%s is replayed empty; its messages come "
                         "back redelivered", first, last)
            return []
        return [AmqpPartition(_ipc(to_record_batch(deliveries, self.options.queue)))]

    def commit(self, end: dict[str, int]) -> None:
        self._ack_through(int(end["seq"]))

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- executors ------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, AmqpPartition)
        if partition.payload:
            yield from pa.ipc.open_stream(partition.payload)

    # -- helpers --------------------------------------------------------------------------

    def _open(self) -> QueueConsumer:
        if self._consumer is None:
            self._consumer = QueueConsumer(self.options.url, self.options.queue,
                                           self.options.prefetch,
                                           name=f"hare-spark source {self.options.queue}")
        return self._consumer

    def _ack_through(self, seq: int) -> None:
        last_tag = None
        batches = self._batches
        while batches and batches[0].end <= seq:
            last_tag = batches.popleft().last_tag
        if last_tag is not None and self._consumer is not None:
            self._consumer.ack_through(last_tag)

    def _ready_count(self) -> int:
        connection = pika.BlockingConnection(pika.URLParameters(self.options.url))
        try:
            ok = connection.channel().queue_declare(self.options.queue, passive=True)
            return int(ok.method.message_count)
        finally:
            connection.close()
