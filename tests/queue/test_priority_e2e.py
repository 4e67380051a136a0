"""Priority queues (x-max-priority) end to end through pika: highest priority first and FIFO
within a priority for consumers and basic.get, requeues, paging under memory pressure,
persistence across clean and unclean restarts, and dead-lettering into a priority queue."""

from __future__ import annotations

import time

import pika
import pytest

from broker.store.layout import TRANSIENT_QUEUES


def connect(b) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(b.url + "%2F?heartbeat=0"))


@pytest.fixture
def conn(pika_conns):
    return pika_conns()


def publish(ch, queue: str, items: list[tuple[int, int | None]], **props) -> None:
    for n, priority in items:
        ch.basic_publish("", queue, b"%d" % n, pika.BasicProperties(priority=priority, **props))


def expected(items: list[tuple[int, int | None]], max_priority: int) -> list[int]:
    return [n for n, p in sorted(items, key=lambda x: (-min(x[1] or 0, max_priority), x[0]))]


def get_all(ch, queue: str) -> list[tuple[int, bool]]:
    out = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((int(body), method.redelivered))


def wait_count(ch, queue: str, n: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while ch.queue_declare(queue, passive=True).method.message_count != n:
        assert time.monotonic() < deadline, f"{queue} never held {n}"
        time.sleep(0.02)


ITEMS = [(n, [None, 4, 1, 9, 4, 0, 30][n % 7]) for n in range(70)]


def test_basic_get_highest_first_fifo_within_priority(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True, arguments={"x-max-priority": 9}).method.queue
    publish(ch, q, ITEMS)
    assert [n for n, _ in get_all(ch, q)] == expected(ITEMS, 9)


def test_consumer_gets_priority_order_and_requeues_go_back_in_place(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True, arguments={"x-max-priority": 5}).method.queue
    items = [(n, n % 3 * 2) for n in range(12)]  # priorities 0, 2, 4
    publish(ch, q, items)
    ch.basic_qos(prefetch_count=3)
    first: list[int] = []
    rest: list[tuple[int, bool]] = []

    def on_message(chan, method, properties, body):
        if len(first) < 3:
            first.append(int(body))
            if len(first) == 3:  # hand the first three back
                chan.basic_nack(method.delivery_tag, multiple=True, requeue=True)
            return
        rest.append((int(body), method.redelivered))
        chan.basic_ack(method.delivery_tag)

    ch.basic_consume(q, on_message)
    deadline = time.monotonic() + 5
    while len(rest) < 12:
        assert time.monotonic() < deadline, (first, rest)
        conn.process_data_events(time_limit=0.02)
    assert first == [2, 5, 8]  # the three of priority 4, in order
    assert [n for n, _ in rest] == expected(items, 5)
    assert [r for _, r in rest[:4]] == [True, True, True, False]


def test_paging_keeps_priority_order(broker_factory):
    # the paging threshold far below the broker's own RSS: every queue pages everything
    b = broker_factory(args=["--vm-memory-high-watermark", "4GiB",
                             "--vm-memory-high-watermark-paging-ratio", "0.001",
                             "--memory-monitor-interval-s", "0.05"]).start()
    c = connect(b)
    ch = c.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("pq-paged", arguments={"x-max-priority": 9}).method.queue
    items = [(n, [None, 4, 1, 9, 4, 0, 30][n % 7]) for n in range(1400)]
    for i in range(0, len(items), 200):
        publish(ch, q, items[i:i + 200], delivery_mode=2 if i % 400 else 1)
        time.sleep(0.1)  # let the memory monitor page between batches
    paged = [f for d in b.node_dirs() for f in (d / TRANSIENT_QUEUES).rglob("*.hqi")]
    assert paged, "nothing was paged out"
    assert [n for n, _ in get_all(ch, q)] == expected(items, 9)
    c.close()


@pytest.mark.parametrize("clean", [True, False])
def test_persistent_priorities_survive_a_restart(fresh_broker, clean):
    b = fresh_broker.start()
    c = connect(b)
    ch = c.channel()
    ch.confirm_delivery()
    ch.queue_declare("pq-durable", durable=True, arguments={"x-max-priority": 9})
    publish(ch, "pq-durable", ITEMS, delivery_mode=2)
    # two deliveries left unacked: they come back redelivered, in their place
    ch.basic_qos(prefetch_count=2)
    held: list[int] = []
    ch.basic_consume("pq-durable", lambda chn, m, p, body: held.append(int(body)))
    deadline = time.monotonic() + 5
    while len(held) < 2:
        assert time.monotonic() < deadline
        c.process_data_events(time_limit=0.02)
    c.close()
    b.restart(clean=clean)
    c = connect(b)
    ch = c.channel()
    got = get_all(ch, "pq-durable")
    assert [n for n, _ in got] == expected(ITEMS, 9)
    assert {n for n, redelivered in got if redelivered} == set(held)
    # and the queue goes on numbering each level after what it recovered
    publish(ch, "pq-durable", [(1000, 9), (1001, 0), (1002, 9)], delivery_mode=2)
    assert [n for n, _ in get_all(ch, "pq-durable")] == [1000, 1002, 1001]
    c.close()


def test_dead_letters_are_ordered_by_priority(conn):
    ch = conn.channel()
    dlq = ch.queue_declare("", exclusive=True, arguments={"x-max-priority": 9}).method.queue
    src = ch.queue_declare("", exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq,
        "x-message-ttl": 0}).method.queue
    publish(ch, src, ITEMS)
    wait_count(ch, dlq, len(ITEMS))
    assert [n for n, _ in get_all(ch, dlq)] == expected(ITEMS, 9)
