"""kombu (Celery's transport, on the py-amqp client): a third client implementation."""

from __future__ import annotations

import kombu
import pytest


def test_kombu_publish_consume_and_ack(broker):
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}//"
    exchange = kombu.Exchange("kombu-x", type="topic", durable=False)
    queue = kombu.Queue("kombu-q", exchange, routing_key="tasks.#", auto_delete=True)
    with kombu.Connection(url) as conn:
        with conn.Producer() as producer:
            for i in range(5):
                producer.publish({"n": i}, exchange=exchange, routing_key="tasks.add",
                                 declare=[queue], serializer="json")
        got: list[int] = []

        def on_message(body, message):
            got.append(body["n"])
            message.ack()

        with conn.Consumer(queue, callbacks=[on_message], accept=["json"]):
            while len(got) < 5:
                conn.drain_events(timeout=5)
    assert got == [0, 1, 2, 3, 4]


def test_kombu_simple_queue_get(broker):
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}//"
    with kombu.Connection(url) as conn:
        q = conn.SimpleQueue("kombu-simple")
        q.put({"hello": "hare"})
        msg = q.get(block=True, timeout=5)
        assert msg.payload == {"hello": "hare"}
        msg.ack()
        with pytest.raises(q.Empty):
            q.get(block=True, timeout=0.5)
        q.clear()
        q.close()
