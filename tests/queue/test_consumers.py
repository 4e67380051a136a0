"""Who gets a message when a queue has several consumers, through pika: consumer priorities
(x-priority on basic.consume) and single active consumer (x-single-active-consumer)."""

from __future__ import annotations

import time
from collections import defaultdict

import pika


class Inbox:
    """Deliveries by consumer tag, unacked (the test acks when it wants room)."""

    def __init__(self) -> None:
        self.by_tag: dict[str, list[tuple[bytes, bool, int]]] = defaultdict(list)
        self.channels: dict[str, pika.adapters.blocking_connection.BlockingChannel] = {}

    def consume(self, ch, queue: str, tag: str, **kw) -> None:
        self.channels[tag] = ch

        def on_message(chan, method, properties, body):
            self.by_tag[method.consumer_tag].append(
                (body, method.redelivered, method.delivery_tag))

        ch.basic_consume(queue, on_message, consumer_tag=tag, **kw)

    def bodies(self, tag: str) -> list[bytes]:
        return [b for b, _, _ in self.by_tag[tag]]

    def wait(self, conns: list[pika.BlockingConnection], total: int, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while sum(len(v) for v in self.by_tag.values()) < total:
            assert time.monotonic() < deadline, dict(self.by_tag)
            for c in conns:
                c.process_data_events(time_limit=0.02)

    def ack_all(self, tag: str) -> None:
        ch = self.channels[tag]
        for _, _, dtag in self.by_tag[tag]:
            ch.basic_ack(dtag)


def test_higher_priority_consumer_served_while_it_has_room(pika_conns):
    c = pika_conns()
    setup = c.channel()
    q = setup.queue_declare("", exclusive=True).method.queue
    high, low = c.channel(), c.channel()
    high.basic_qos(prefetch_count=3)
    inbox = Inbox()
    inbox.consume(low, q, "low")
    inbox.consume(high, q, "high", arguments={"x-priority": 10})
    for i in range(3):
        setup.basic_publish("", q, b"a%d" % i)
    inbox.wait([c], 3)
    # round-robin would have shared these; priority gives all to "high" while it has room
    assert inbox.bodies("high") == [b"a0", b"a1", b"a2"] and inbox.bodies("low") == []
    for i in range(2):
        setup.basic_publish("", q, b"b%d" % i)
    inbox.wait([c], 5)
    assert inbox.bodies("low") == [b"b0", b"b1"]  # "high" is full: the lower one gets them
    inbox.ack_all("high")
    setup.basic_publish("", q, b"c0")
    inbox.wait([c], 6)
    assert inbox.bodies("high")[-1] == b"c0"  # room again: back to the higher priority


def test_equal_priorities_share_round_robin(pika_conns):
    c = pika_conns()
    setup = c.channel()
    q = setup.queue_declare("", exclusive=True).method.queue
    inbox = Inbox()
    for tag in ("x", "y"):
        inbox.consume(c.channel(), q, tag, auto_ack=True, arguments={"x-priority": 3})
    inbox.consume(c.channel(), q, "below", auto_ack=True, arguments={"x-priority": -1})
    for i in range(6):
        setup.basic_publish("", q, b"%d" % i)
    inbox.wait([c], 6)
    assert len(inbox.bodies("x")) == 3 and len(inbox.bodies("y")) == 3
    assert inbox.bodies("below") == []


def test_single_active_consumer_takes_over_in_order(pika_conns):
    c1, c2 = pika_conns(), pika_conns()
    setup = c2.channel()
    q = f"sac-{time.monotonic_ns()}"
    setup.queue_declare(q, auto_delete=True, arguments={"x-single-active-consumer": True})
    inbox = Inbox()
    inbox.consume(c1.channel(), q, "first")
    inbox.consume(c2.channel(), q, "second")
    inbox.consume(c2.channel(), q, "third", arguments={"x-priority": 5})
    inbox.consume(c2.channel(), q, "fourth")
    for i in range(3):
        setup.basic_publish("", q, b"m%d" % i)
    inbox.wait([c1, c2], 3)
    assert inbox.bodies("first") == [b"m0", b"m1", b"m2"]  # nobody else, although unacked
    # connection loss: the waiting consumer with the highest priority takes over and gets
    # the unacked messages back, in order, redelivered
    c1.close()
    inbox.wait([c2], 6)
    assert inbox.by_tag["third"] == [(b"m%d" % i, True, i + 1) for i in range(3)]
    inbox.ack_all("third")
    inbox.channels["third"].basic_cancel("third")
    setup.basic_publish("", q, b"m3")
    inbox.wait([c2], 7)
    # then the longest waiting of equal priority
    assert inbox.bodies("second") == [b"m3"] and inbox.bodies("fourth") == []
    assert setup.queue_declare(q, passive=True).method.consumer_count == 2


def test_single_active_consumer_basic_get(pika_conns):
    c = pika_conns()
    ch = c.channel()
    q = ch.queue_declare("", exclusive=True,
                         arguments={"x-single-active-consumer": True}).method.queue
    ch.basic_publish("", q, b"got")
    assert ch.basic_get(q, auto_ack=True)[2] == b"got"


def test_lone_consumer_gets_a_backlog_larger_than_one_delivery_batch(pika_conns):
    # a queue delivers DELIVERY_BATCH (1000) per turn, then must queue itself another turn;
    # a lone consumer that never acks (no_ack, or a prefetch above the batch) sends nothing
    # that would start one
    c = pika_conns()
    setup = c.channel()
    q1 = setup.queue_declare("", exclusive=True).method.queue
    q2 = setup.queue_declare("", exclusive=True).method.queue
    for _ in range(2500):
        setup.basic_publish("", q1, b"x")
        setup.basic_publish("", q2, b"y")
    no_ack, big_window = c.channel(), c.channel()
    big_window.basic_qos(prefetch_count=3000)
    inbox = Inbox()
    inbox.consume(no_ack, q1, "no-ack", auto_ack=True)
    inbox.consume(big_window, q2, "window")
    inbox.wait([c], 5000)
    assert inbox.bodies("no-ack") == [b"x"] * 2500
    assert inbox.bodies("window") == [b"y"] * 2500
