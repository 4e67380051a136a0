"""The "amqp-stream" source: a stream queue read by offset, exactly-once into Spark.

Spark's offset is the stream's: a batch (start, end) is the messages at offsets start ..
end-1, whatever consumer reads them. So nothing is acked to mark progress (a stream forgets
nothing; the consumer's acks only give its credit back), and a batch Spark replays after a
restart (`readBetweenOffsets`, planned but not committed) is read again by offset: the same
messages, so a sink that is idempotent per batch sees each message once.

Where the code runs is as for the "amqp" source (source.py): one reader instance lives in the
driver's source runner, its consumer (consumer.py) on a thread of its own, and `read(start)`
returns the next batch as one Arrow record batch. A replayed batch is read by a consumer of
its own on whatever process Spark runs it.

Offsets are ``{"offset": n}``: the next offset to read. Until the first message is read the
start is symbolic (``{"start": "earliest"}``, ``"latest"`` or a time) and the first batch's end
also says where it began (``"from"``), so a replay of it reads the same messages even though
"latest" would resolve elsewhere by then.
"""

from __future__ import annotations

import datetime
import logging
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pika
import pyarrow as pa
from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from broker.spark.columns import STREAM_SCHEMA, to_stream_batch
from broker.spark.consumer import ConsumerError, Delivery, QueueConsumer
from broker.spark.options import MAX_PREFETCH, StreamSourceOptions

__all__ = ["AmqpStreamDataSource", "AmqpStreamSourceReader", "DataLoss"]

log = logging.getLogger("hare.spark.stream_source")

Offset = dict[str, Any]
RECONNECT_S = 60.0  # how long read() tries to reach the broker again before the query fails
REPLAY_WAIT_S = 30.0  # a replay waits this long for a message it knows was there


class DataLoss(RuntimeError):
    """Offsets the query wanted are gone from the stream (retention dropped them)."""


def _offset(d: Delivery) -> int:
    headers = d.properties.headers or {}
    value = headers.get("x-stream-offset")
    if not isinstance(value, int):
        raise RuntimeError(f"amqp-stream source: a delivery without an x-stream-offset header "
                           f"(routing key {d.routing_key!r}): the queue is not a stream")
    return int(value)  # pika's `long` is an int subclass


class AmqpStreamSourceReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: StreamSourceOptions) -> None:
        self.options = options
        self._consumer: QueueConsumer | None = None
        self._position: int | None = None  # the offset the consumer delivers next
        self._available_until: int | None = None  # Trigger.AvailableNow: the end to read to

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}  # a copy for readBetweenOffsets needs no more

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # -- driver side: the source runner ----------------------------------------------------
    def initialOffset(self) -> Offset:
        start = self.options.starting
        if isinstance(start, int):
            return {"offset": start}
        if isinstance(start, datetime.datetime):
            return {"start": start.isoformat()}
        return {"start": start}

    def prepareForTriggerAvailableNow(self) -> None:
        """The stream's end now (its first offset plus what it holds): the query reads up to
        it, waiting for what is known to be there, and stops; what arrives later is for the
        next run. A busy stream cannot keep it going."""
        connection = pika.BlockingConnection(pika.URLParameters(self.options.url))
        try:
            channel = connection.channel()
            held = int(channel.queue_declare(self.options.stream, passive=True)
                       .method.message_count)
            self._available_until = 0
            if held:
                channel.basic_qos(prefetch_count=1)
                for method, props, _ in channel.consume(
                        self.options.stream, arguments={"x-stream-offset": "first"},
                        inactivity_timeout=REPLAY_WAIT_S):
                    if method is not None:
                        first = int((props.headers or {}).get("x-stream-offset", 0))
                        self._available_until = first + held
                    break
        finally:
            connection.close()

    def read(self, start: Offset) -> tuple[Iterator[pa.RecordBatch], Offset]:
        """The batch from `start` on: at most maxOffsetsPerTrigger messages, waiting up to
        pollTimeoutMs for the first; `start` back and no rows when none came."""
        wanted = self.options.max_offsets_per_trigger
        poll = self.options.poll_timeout_ms / 1000
        until = self._available_until
        if until is not None:  # Trigger.AvailableNow: up to the end it found
            at = start.get("offset", self._position)
            if start.get("start") == "latest" and at is None:
                return iter(()), start  # nothing was there for it
            if at is not None:
                if at >= until:
                    return iter(()), start
                wanted = min(wanted, until - at)
                poll = max(poll, REPLAY_WAIT_S)  # these offsets exist: wait for them
            elif start.get("start") == "earliest" and until:
                poll = max(poll, REPLAY_WAIT_S)
        deliveries = self._take(start, wanted, poll)
        if not deliveries:
            return iter(()), start
        offsets = [_offset(d) for d in deliveries]
        want = start.get("offset")
        if want is not None and offsets[0] > want:
            self._lost(want, offsets[0])
        self._position = offsets[-1] + 1
        end: Offset = {"offset": self._position}
        if want is None:
            end["from"] = offsets[0]
        # A list iterator: pyspark copies it to replay the batch from its cache.
        return iter([to_stream_batch(deliveries, offsets, self.options.stream)]), end

    def commit(self, end: Offset) -> None:
        """Nothing to do: the stream keeps every message, and Spark keeps the offset."""

    def _take(self, start: Offset, wanted: int, poll: float) -> list[Delivery]:
        """The next deliveries at the consumer's position (opened, or re-opened after the
        broker went away, at `start`'s offset)."""
        deadline = time.monotonic() + RECONNECT_S
        want = start.get("offset")
        while True:
            try:
                if self._consumer is None or (want is not None and want != self._position):
                    self._open(want if want is not None else self._spec(start))
                assert self._consumer is not None
                deliveries = self._consumer.take(wanted, poll)
                if deliveries:  # credit back: the broker sends on while Spark works
                    self._consumer.ack_through(deliveries[-1].delivery_tag)
                return deliveries
            except ConsumerError as exc:
                self._close()
                if time.monotonic() > deadline:
                    raise
                log.warning("amqp-stream source: %s; connecting again at offset %s", exc,
                            self._position if self._position is not None else want)
                if self._position is not None:
                    want = self._position
                time.sleep(1.0)

    def _spec(self, start: Offset) -> object:
        """x-stream-offset for a symbolic start."""
        spec = start["start"]
        if spec == "earliest":
            return "first"
        if spec == "latest":
            return "next"
        return datetime.datetime.fromisoformat(spec)

    def _open(self, at: object) -> None:
        self._close()
        consumer = QueueConsumer(self.options.url, self.options.stream, self.options.prefetch,
                                 name=f"hare-spark stream source {self.options.stream}",
                                 arguments={"x-stream-offset": at})
        weakref.finalize(self, consumer.close)
        self._consumer = consumer
        self._position = at if isinstance(at, int) else None

    def _close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _lost(self, want: int, got: int) -> None:
        text = (f"amqp-stream source: offsets {want}..{got - 1} of stream "
                f"{self.options.stream!r} are gone (retention dropped them)")
        if self.options.fail_on_data_loss:
            raise DataLoss(text + "; set failOnDataLoss=false to go on without them")
        log.warning("%s; going on at %s", text, got)

    # -- anywhere: a batch replayed after a restart ----------------------------------------
    def readBetweenOffsets(self, start: Offset, end: Offset) -> Iterator[pa.RecordBatch]:
        """The messages at offsets start..end-1 again, by a consumer of their own."""
        first = start.get("offset", end.get("from"))
        stop = int(end["offset"])
        if first is None or first >= stop:
            return iter(())
        return iter(self._replay(int(first), stop))

    def _replay(self, first: int, stop: int) -> list[pa.RecordBatch]:
        consumer = QueueConsumer(self.options.url, self.options.stream,
                                 min(stop - first, MAX_PREFETCH),
                                 name=f"hare-spark stream replay {self.options.stream}",
                                 arguments={"x-stream-offset": first})
        batches: list[pa.RecordBatch] = []
        try:
            seen = first
            lost_checked = False
            while seen < stop:
                got = consumer.take(self.options.max_offsets_per_trigger, REPLAY_WAIT_S)
                if not got:
                    break  # the rest is gone (or never was: a failed write's gap)
                consumer.ack_through(got[-1].delivery_tag)
                offsets = [_offset(d) for d in got]
                if not lost_checked:
                    lost_checked = True
                    if offsets[0] > first:
                        self._lost(first, offsets[0])
                keep = [i for i, o in enumerate(offsets) if o < stop]
                if keep:
                    batches.append(to_stream_batch([got[i] for i in keep],
                                                   [offsets[i] for i in keep],
                                                   self.options.stream))
                seen = offsets[-1] + 1
        finally:
            consumer.close()
        return batches



class AmqpStreamDataSource(DataSource):
    """`spark.readStream.format("amqp-stream")`: one stream queue, read by offset."""

    @classmethod
    def name(cls) -> str:
        return "amqp-stream"

    def schema(self) -> StructType:
        return STREAM_SCHEMA

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return AmqpStreamSourceReader(StreamSourceOptions.parse(self.options))
