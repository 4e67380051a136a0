"""ConfirmPublisher against a real Hare, without Spark: confirms pipelined, never more than
maxInFlight outstanding, every message confirmed before run() returns."""

from __future__ import annotations

from collections.abc import Iterator

import pika

from broker.spark.publisher import ConfirmPublisher, OutMessage
from tests.spark.helpers import counts


def test_publishes_are_pipelined_and_bounded_by_max_in_flight(hare) -> None:
    queue = "pub-in-flight"
    connection = pika.BlockingConnection(pika.URLParameters(hare.url))
    connection.channel().queue_declare(queue)
    connection.close()
    publisher = ConfirmPublisher(hare.url, max_in_flight=8)
    outstanding: list[int] = []  # unconfirmed publishes each time the next message is taken

    def messages() -> Iterator[OutMessage]:
        for i in range(100):
            outstanding.append(publisher.in_flight)
            yield OutMessage("", queue, b"%d" % i, pika.BasicProperties(delivery_mode=1))

    assert publisher.run(messages()) == 100
    # The first eight go out before any confirm can arrive; never a ninth unconfirmed.
    assert outstanding[:8] == list(range(8))
    assert max(outstanding) == 7
    assert publisher.in_flight == 0
    assert counts(hare, queue)[0] == 100
