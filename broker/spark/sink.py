"""The "amqp" sink: every write task publishes its partition to an exchange, confirmed.

Columns read: ``body`` (required, string or binary), and optionally ``routing_key``,
``exchange``, ``headers`` (a map), ``message_id``, ``content_type``. A null column value falls
back to the option (``exchange``, ``routingKey``) or, for ``message_id``, to a deterministic id
``<batch>-<partition>-<row>``: a retried task or a replayed micro-batch publishes the same ids,
so a consumer can drop the duplicates. For ``df.write`` the batch part is an id drawn once per
write (shared by every task and retry of that write).

AMQP has no two-phase commit: a message confirmed by the broker stays published when the task
or the batch fails later, and a retry publishes it again. That is the at-least-once contract.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pika
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, DataType, MapType, StringType, StructType

from broker.spark.options import OptionError, SinkOptions
from broker.spark.publisher import ConfirmPublisher, OutMessage

__all__ = ["AmqpBatchWriter", "AmqpStreamWriter", "PublishedCount", "check_sink_schema"]

log = logging.getLogger("hare.spark.sink")

_STRING_COLUMNS = ("routing_key", "exchange", "message_id", "content_type")
SINK_COLUMNS = ("body", *_STRING_COLUMNS, "headers")
_BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark on every micro-batch's jobs


@dataclass
class PublishedCount(WriterCommitMessage):
    partition: int
    messages: int


def check_sink_schema(schema: StructType) -> None:
    """Refuse, naming the column, a frame the sink cannot publish."""
    types: dict[str, DataType] = {f.name: f.dataType for f in schema.fields}
    if "body" not in types:
        raise OptionError(f"amqp sink: the DataFrame needs a 'body' column (string or binary); "
                          f"it has {sorted(types)}")
    if not isinstance(types["body"], StringType | BinaryType):
        raise OptionError(f"amqp sink: column 'body' must be string or binary, "
                          f"not {types['body'].simpleString()}")
    for name in _STRING_COLUMNS:
        if name in types and not isinstance(types[name], StringType):
            raise OptionError(f"amqp sink: column '{name}' must be a string, "
                              f"not {types[name].simpleString()}")
    if "headers" in types and not (isinstance(types["headers"], MapType)
                                   and isinstance(types["headers"].keyType, StringType)):
        raise OptionError(f"amqp sink: column 'headers' must be a map with string keys, "
                          f"not {types['headers'].simpleString()}")
    unknown = sorted(set(types) - set(SINK_COLUMNS))
    if unknown:
        raise OptionError(f"amqp sink: unknown column(s) {unknown}; the sink reads "
                          f"{', '.join(SINK_COLUMNS)} (select or rename before writing)")


def _messages(batches: Iterator[pa.RecordBatch], options: SinkOptions,
              id_prefix: str) -> Iterator[OutMessage]:
    """The rows of a task's Arrow batches as messages, in order."""
    delivery_mode = 2 if options.persistent else 1
    row = 0
    for batch in batches:
        n = batch.num_rows
        names = batch.schema.names

        def column(name: str, default: object = None, names: list[str] = names,
                   batch: pa.RecordBatch = batch, n: int = n) -> list:
            return batch.column(name).to_pylist() if name in names else [default] * n

        bodies = column("body")
        exchanges = column("exchange")
        keys = column("routing_key")
        ids = column("message_id")
        types = column("content_type")
        headers = column("headers")
        for i in range(n):
            body = bodies[i]
            if isinstance(body, str):
                body = body.encode()
            elif body is None:
                body = b""
            exchange = exchanges[i]
            key = keys[i]
            table = headers[i]
            props = pika.BasicProperties(
                message_id=ids[i] if ids[i] is not None else f"{id_prefix}-{row}",
                content_type=types[i],
                headers=dict(table) if table is not None else None,
                delivery_mode=delivery_mode,
            )
            yield OutMessage((options.exchange or "") if exchange is None else exchange,
                             options.routing_key if key is None else key, body, props)
            row += 1


def _publish(batches: Iterator[pa.RecordBatch], options: SinkOptions, batch_id: str,
             what: str) -> PublishedCount:
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    messages = _messages(batches, options, f"{batch_id}-{partition}")
    first = next(messages, None)
    if first is None:  # an empty partition opens no connection
        return PublishedCount(partition, 0)
    publisher = ConfirmPublisher(options.url, options.max_in_flight, options.mandatory,
                                 name=f"hare-spark sink {what} partition {partition}")
    count = publisher.run(itertools.chain([first], messages))
    return PublishedCount(partition, count)


class AmqpBatchWriter(DataSourceArrowWriter):
    """`df.write.format("amqp")`: made on the driver, pickled to every task."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex[:12]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedCount:
        return _publish(iterator, self.options, self.write_id, f"write {self.write_id}")

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("amqp sink: write %s published %d messages", self.write_id,
                 sum(m.messages for m in messages if isinstance(m, PublishedCount)))


class AmqpStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("amqp")`: every micro-batch's tasks publish their partitions."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedCount:
        ctx = TaskContext.get()
        batch_id = (ctx.getLocalProperty(_BATCH_ID_PROPERTY) if ctx is not None else None) or "0"
        return _publish(iterator, self.options, batch_id, f"batch {batch_id}")

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.debug("amqp sink: batch %d published %d messages", batchId,
                  sum(m.messages for m in messages if isinstance(m, PublishedCount)))
