"""The consistent-hash exchange over real sockets with pika: declare, weighted bindings, routing
by key, header and property, the plugin's refusals, and a durable one across a restart."""

from __future__ import annotations

import uuid
from collections import Counter

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def setup(ch, arguments: dict | None = None, queues: int = 3, durable: bool = False
          ) -> tuple[str, list[str]]:  # type: ignore[type-arg]
    x = unique("chx")
    ch.exchange_declare(x, "x-consistent-hash", durable=durable, arguments=arguments)
    names = [f"{x}-q{i}" for i in range(queues)]
    for q in names:
        ch.queue_declare(q, durable=durable)
        ch.queue_bind(q, x, routing_key="10")
    return x, names


def drain(ch, queues: list[str]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for q in queues:
        got = out.setdefault(q, [])
        while True:
            method, _props, body = ch.basic_get(q, auto_ack=True)
            if method is None:
                break
            got.append(body)
    return out


def where(got: dict[str, list[bytes]]) -> dict[bytes, str]:
    return {body: q for q, bodies in got.items() for body in bodies}


def test_routes_each_key_to_one_queue_always(pika_conns) -> None:
    ch = pika_conns().channel()
    ch.confirm_delivery()
    x, queues = setup(ch)
    for round_ in range(2):
        for i in range(300):
            ch.basic_publish(x, f"k{i}", f"{round_}:k{i}".encode())
    got = drain(ch, queues)
    assert sum(len(b) for b in got.values()) == 600  # each message to exactly one queue
    placed = where(got)
    for i in range(300):
        assert placed[f"0:k{i}".encode()] == placed[f"1:k{i}".encode()]
    assert all(len(b) > 30 for b in got.values())  # every queue takes a share


def test_hash_header_and_hash_property(pika_conns) -> None:
    ch = pika_conns().channel()
    ch.confirm_delivery()
    xh, qh = setup(ch, {"hash-header": "user"})
    xp, qp = setup(ch, {"hash-property": "message_id"})
    for i in range(200):
        user = f"u{i % 20}"
        ch.basic_publish(xh, f"rk{i}", f"{user}:{i}".encode(),
                         pika.BasicProperties(headers={"user": user}))
        ch.basic_publish(xp, f"rk{i}", f"{user}:{i}".encode(),
                         pika.BasicProperties(message_id=user))
    for queues in (qh, qp):
        got = drain(ch, queues)
        owners: dict[str, set[str]] = {}
        for q, bodies in got.items():
            for body in bodies:
                owners.setdefault(body.decode().split(":")[0], set()).add(q)
        assert len(owners) == 20 and all(len(qs) == 1 for qs in owners.values())
        # spread over more than one queue; not "all three": the ring's points come from the
        # random queue names, so a queue can own none of the 20 values (about 1 run in 8)
        assert len({q for qs in owners.values() for q in qs}) >= 2


def test_weights_share_out_the_messages(pika_conns) -> None:
    ch = pika_conns().channel()
    ch.confirm_delivery()
    x = unique("chx-w")
    ch.exchange_declare(x, "x-consistent-hash")
    for q, weight in ((f"{x}-a", "100"), (f"{x}-b", "300")):
        ch.queue_declare(q)
        ch.queue_bind(q, x, routing_key=weight)
    for i in range(2000):
        ch.basic_publish(x, str(i), b"")
    counts = Counter({q: len(b) for q, b in drain(ch, [f"{x}-a", f"{x}-b"]).items()})
    assert 2 < counts[f"{x}-b"] / counts[f"{x}-a"] < 4.5, counts


def test_a_non_integer_binding_key_is_refused(pika_conns) -> None:
    ch = pika_conns().channel()
    x = unique("chx-bad")
    ch.exchange_declare(x, "x-consistent-hash")
    ch.queue_declare(x)
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.queue_bind(x, x, routing_key="heavy")
    assert err.value.reply_code == 406
    assert "binding key must be an integer" in err.value.reply_text


@pytest.mark.parametrize(
    ("arguments", "text"),
    [({"hash-header": "h", "hash-property": "message_id"}, "mutually exclusive"),
     ({"hash-property": "app_id"}, "Unsupported property: app_id")],
)
def test_bad_exchange_arguments_are_refused(pika_conns, arguments: dict, text: str) -> None:  # type: ignore[type-arg]
    c = pika_conns()
    ch = c.channel()
    x = unique("chx-args")
    with pytest.raises(ChannelClosedByBroker) as err:
        ch.exchange_declare(x, "x-consistent-hash", arguments=arguments)
    assert err.value.reply_code == 406 and text in err.value.reply_text
    ch = c.channel()
    with pytest.raises(ChannelClosedByBroker) as err:  # nothing was declared
        ch.exchange_declare(x, "x-consistent-hash", passive=True)
    assert err.value.reply_code == 404


def test_a_durable_one_keeps_its_bindings_and_placement_across_a_restart(fresh_broker) -> None:
    b = fresh_broker.start()

    def connect() -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(b.url + "%2F?heartbeat=0"))

    c = connect()
    ch = c.channel()
    ch.confirm_delivery()
    x, queues = setup(ch, {"hash-header": "user"}, durable=True)
    for i in range(100):
        ch.basic_publish(x, "", str(i).encode(), pika.BasicProperties(headers={"user": str(i)}))
    before = where(drain(ch, queues))
    c.close()
    b.restart()
    c = connect()
    ch = c.channel()
    ch.confirm_delivery()
    ch.exchange_declare(x, "x-consistent-hash", passive=True)
    for i in range(100):
        ch.basic_publish(x, "", str(i).encode(), pika.BasicProperties(headers={"user": str(i)}))
    assert where(drain(ch, queues)) == before
    c.close()
