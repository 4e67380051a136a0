"""Publish a stream of messages with publisher confirms pipelined, a bounded number in flight.

A Spark write task calls `ConfirmPublisher.run(messages)` once for its partition. It returns
when every message is confirmed, and raises `PublishError` when the broker nacks one, returns
one (``mandatory``: it reached no queue), closes the channel or connection, or cannot be
reached: the task fails and Spark retries it. pika's BlockingChannel waits for each confirm in
turn; its SelectConnection lets us keep `max_in_flight` publishes outstanding instead, on one
thread, with no extra client library.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import pika
from pika.spec import Basic

__all__ = ["ConfirmPublisher", "OutMessage", "PublishError"]


class OutMessage(NamedTuple):
    exchange: str
    routing_key: str
    body: bytes
    properties: pika.BasicProperties


class PublishError(RuntimeError):
    """A message was not accepted by the broker; the write task must fail."""


class ConfirmPublisher:
    def __init__(self, url: str, max_in_flight: int = 1000, mandatory: bool = True,
                 name: str = "hare-spark sink") -> None:
        self.url = url
        self.max_in_flight = max_in_flight
        self.mandatory = mandatory
        self.name = name
        self.published = 0
        self._confirmed = 0  # every tag <= this is confirmed
        self._confirmed_above: set[int] = set()  # single acks that came out of order
        self._messages: Iterator[OutMessage] = iter(())
        self._exhausted = False
        self._done = False
        self._error: str | None = None
        self._exception: BaseException | None = None
        self._connection: pika.SelectConnection | None = None
        self._channel: Any = None

    def run(self, messages: Iterator[OutMessage]) -> int:
        """Publish all `messages`; return how many, once all are confirmed."""
        self._messages = messages
        params = pika.URLParameters(self.url)
        params.client_properties = {"connection_name": self.name}
        self._connection = pika.SelectConnection(
            params, on_open_callback=self._on_open, on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed)
        self._connection.ioloop.start()  # until _on_closed stops it
        if self._exception is not None:
            raise self._exception
        if self._error is not None:
            raise PublishError(self._error)
        return self.published

    @property
    def in_flight(self) -> int:
        return self.published - self._confirmed - len(self._confirmed_above)

    # -- connection and channel ------------------------------------------------------------

    def _on_open(self, connection: pika.SelectConnection) -> None:
        connection.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, connection: pika.SelectConnection, error: Any) -> None:
        self._error = f"cannot connect to {self._safe_url()}: {error!r}"
        connection.ioloop.stop()

    def _on_closed(self, connection: pika.SelectConnection, reason: Any) -> None:
        if not self._done and self._error is None and self._exception is None:
            self._error = f"connection closed with {self.in_flight} publishes unconfirmed: " \
                          f"{reason!r}"
        connection.ioloop.stop()

    def _on_channel(self, channel: Any) -> None:
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm,
                                 callback=lambda _frame: self._pump())

    def _on_channel_closed(self, _channel: Any, reason: Any) -> None:
        if not self._done:  # our own close after the last confirm is no failure
            self._fail(f"channel closed: {reason!r}")

    # -- confirms and returns ------------------------------------------------------------

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        # The broker sends basic.return before the basic.ack of the same message.
        self._fail(f"message {properties.message_id!r} returned: {method.reply_code} "
                   f"{method.reply_text} (exchange {method.exchange!r}, routing key "
                   f"{method.routing_key!r})")

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, Basic.Nack):
            self._fail(f"broker nacked publish {method.delivery_tag}"
                       f"{' and earlier' if method.multiple else ''}")
            return
        tag = method.delivery_tag
        if method.multiple:
            if tag > self._confirmed:
                self._confirmed = tag
                self._confirmed_above = {t for t in self._confirmed_above if t > tag}
        elif tag == self._confirmed + 1:
            self._confirmed = tag
            while self._confirmed + 1 in self._confirmed_above:
                self._confirmed += 1
                self._confirmed_above.discard(self._confirmed)
        else:
            self._confirmed_above.add(tag)
        self._pump()

    # -- publishing ----------------------------------------------------------------------

    def _pump(self) -> None:
        if self._error is not None or self._done:
            return
        channel = self._channel
        mandatory = self.mandatory
        room = self.max_in_flight - self.in_flight
        try:
            while room > 0 and not self._exhausted:
                message = next(self._messages, None)
                if message is None:
                    self._exhausted = True
                    break
                channel.basic_publish(message.exchange, message.routing_key, message.body,
                                      message.properties, mandatory=mandatory)
                self.published += 1
                room -= 1
        except BaseException as exc:  # the rows' iterator failed: fail the task with it
            self._exception = exc
            self._fail(f"{exc!r}")
            return
        if self._exhausted and self.in_flight == 0:
            self._done = True
            self._close()

    def _fail(self, error: str) -> None:
        if self._error is None:
            self._error = error
        self._close()

    def _close(self) -> None:
        connection = self._connection
        if connection is not None and not (connection.is_closing or connection.is_closed):
            connection.close()

    def _safe_url(self) -> str:
        params = pika.URLParameters(self.url)
        return f"{params.host}:{params.port}{params.virtual_host}"
