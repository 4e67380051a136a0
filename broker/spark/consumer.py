"""One AMQP consumer on one queue, owned by a thread of its own.

The stream reader's calls come from Spark at its own pace (one `latestOffset` per micro-batch,
seconds apart when batches are slow). A pika connection that is only served during those calls
would miss heartbeats and leave deliveries in the socket. So a thread owns the connection: it
serves I/O continuously, appends deliveries to a buffer, and runs the acks the reader asks for.
pika's BlockingConnection is not thread-safe; the only call made from another thread is
`add_callback_threadsafe`, which is made for exactly this.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, NamedTuple

import pika
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

__all__ = ["ConsumerError", "Delivery", "QueueConsumer"]


class Delivery(NamedTuple):
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: Any  # pika.BasicProperties
    body: bytes


class ConsumerError(RuntimeError):
    """The consumer's connection or channel failed; its unacked messages go back to the queue."""


class QueueConsumer:
    """basic.consume on `queue` with `prefetch`; `take` the buffered deliveries, `ack` them."""

    def __init__(self, url: str, queue: str, prefetch: int, name: str = "hare-spark",
                 arguments: dict[str, Any] | None = None) -> None:
        self.url = url
        self.queue = queue
        self.prefetch = prefetch
        self.arguments = arguments  # basic.consume's (a stream's x-stream-offset)
        self._name = name
        self._buffer: deque[Delivery] = deque()
        self._ready = threading.Condition()
        self._error: BaseException | None = None
        self._stopping = False
        self._connection: BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"amqp-consumer-{queue}",
                                        daemon=True)
        self._thread.start()
        self._started.wait()
        self._raise_if_failed()

    def buffered(self) -> int:
        return len(self._buffer)

    def take(self, max_count: int, timeout_s: float) -> list[Delivery]:
        """Up to `max_count` deliveries, waiting up to `timeout_s` for the first one."""
        if not self._buffer:
            with self._ready:
                self._ready.wait_for(lambda: self._buffer or self._error is not None,
                                     timeout_s)
        self._raise_if_failed()
        buffer = self._buffer
        count = min(max_count, len(buffer))
        return [buffer.popleft() for _ in range(count)]

    def ack_through(self, delivery_tag: int) -> None:
        """basic.ack(multiple) of every delivery up to and including `delivery_tag`."""
        self._raise_if_failed()
        assert self._connection is not None and self._channel is not None
        channel = self._channel
        self._connection.add_callback_threadsafe(
            lambda: channel.basic_ack(delivery_tag, multiple=True))

    def close(self) -> None:
        """Close the connection: the broker requeues what was delivered and not acked."""
        self._stopping = True
        if self._connection is not None and self._thread.is_alive():
            try:
                self._connection.add_callback_threadsafe(lambda: None)  # wake the loop
            except Exception:
                pass
        self._thread.join(10)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise ConsumerError(f"amqp source on queue {self.queue!r}: {self._error}") \
                from self._error

    def _on_message(self, _channel: BlockingChannel, method: Any, properties: Any,
                    body: bytes) -> None:
        buffer = self._buffer
        was_empty = not buffer
        buffer.append(Delivery(method.delivery_tag, method.redelivered, method.exchange,
                               method.routing_key, properties, body))
        if was_empty:  # take() only ever waits on an empty buffer
            with self._ready:
                self._ready.notify()

    def _run(self) -> None:
        try:
            params = pika.URLParameters(self.url)
            params.client_properties = {"connection_name": self._name}
            self._connection = pika.BlockingConnection(params)
            self._channel = self._connection.channel()
            self._channel.basic_qos(prefetch_count=self.prefetch)
            self._channel.basic_consume(self.queue, self._on_message, auto_ack=False,
                                        arguments=self.arguments)
        except BaseException as exc:
            self._fail(exc)
            self._started.set()
            return
        self._started.set()
        try:
            while not self._stopping:
                self._connection.process_data_events(time_limit=0.5)
        except BaseException as exc:
            self._fail(exc)
        finally:
            try:
                if self._connection.is_open:
                    self._connection.close()
            except Exception:
                pass

    def _fail(self, exc: BaseException) -> None:
        with self._ready:
            self._error = exc
            self._ready.notify_all()
