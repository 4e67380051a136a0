"""Exchange and queue names as RabbitMQ takes them: any text a shortstr holds, '>' included
(the federation plugin's "federation: X -> node" queues), through declare-ok, bind, publish,
deliver and get, with pika (which sends any name) against a real broker."""

from __future__ import annotations

import pika


def test_names_with_any_characters_work_end_to_end(broker) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url + "%2F?heartbeat=0"))
    try:
        ch = conn.channel()
        queue, exchange = "federation: x -> hare@host", "federation: x -> hare@host A <e>"
        assert ch.queue_declare(queue).method.queue == queue
        ch.exchange_declare(exchange, "fanout")
        ch.queue_bind(queue, exchange)
        ch.basic_publish(exchange, "k", b"crossed")
        method, _, body = next(ch.consume(queue, auto_ack=True, inactivity_timeout=10))
        assert body == b"crossed" and method.exchange == exchange
        ch.cancel()
        ch.basic_publish(exchange, "k", b"again")
        while (got := ch.basic_get(queue, auto_ack=True))[0] is None:
            conn.sleep(0.01)
        assert got[0].exchange == exchange and got[2] == b"again"
    finally:
        conn.close()
