"""Quorum queues on a single node (a queue of one member), with pika against a real broker:
what a client sees is RabbitMQ 3.10.8's (probed on the RabbitMQ installed here): every message
kept on disk, confirms after the fsync, x-delivery-count on redeliveries, x-delivery-limit,
overflow, basic.get, single active consumer, dead-lettering at least once, and a restart (clean
or kill -9) that keeps every confirmed message."""

from __future__ import annotations

import itertools
import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError

from tests.mgmt.helpers import MgmtBroker

_n = itertools.count(1)
QUORUM = {"x-queue-type": "quorum"}


def qname(prefix: str = "qq") -> str:
    return f"{prefix}-{next(_n)}-{time.monotonic_ns() % 100000}"


@pytest.fixture
def ch(pika_conns):
    channel = pika_conns().channel()
    channel.confirm_delivery()
    return channel


def get(ch, name: str, *, ack: bool = False):
    """basic.get, retried briefly (the broker answers from what is committed)."""
    method, props, body = ch.basic_get(name, auto_ack=ack)
    return method, props, body


def test_declare_publish_confirm_get(ch):
    name = qname()
    ok = ch.queue_declare(name, durable=True, arguments=QUORUM)
    assert ok.method.message_count == 0
    ch.basic_publish("", name, b"one", pika.BasicProperties(delivery_mode=1))
    ch.basic_publish("", name, b"two", pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare(name, passive=True).method.message_count == 2
    method, props, body = ch.basic_get(name)
    # basic.get says x-delivery-count 0 on a first delivery, as RabbitMQ; the delivery mode is
    # kept as published (a quorum queue stores every message, it does not rewrite them)
    assert body == b"one" and not method.redelivered
    assert props.headers == {"x-delivery-count": 0} and props.delivery_mode == 1
    ch.basic_ack(method.delivery_tag)
    method, props, body = ch.basic_get(name, auto_ack=True)
    assert body == b"two" and props.delivery_mode == 2
    assert ch.basic_get(name)[0] is None
    ch.queue_delete(name)


def test_publish_then_get_on_another_channel_sees_it(pika_conns):
    """AMQP's order holds across the commit: a get right after a publish finds it."""
    conn = pika_conns()
    pub, other = conn.channel(), conn.channel()
    name = qname()
    pub.queue_declare(name, durable=True, arguments=QUORUM)
    for i in range(20):
        pub.basic_publish("", name, str(i).encode())
        _, _, body = pub.basic_get(name, auto_ack=True)
        assert body == str(i).encode(), i
    pub.basic_publish("", name, b"x")
    assert other.basic_get(name, auto_ack=True)[2] == b"x"
    pub.queue_delete(name)


def test_delivery_count_and_limit(ch):
    """Each return counts; redeliveries carry x-delivery-count and the redelivered flag;
    past x-delivery-limit the message is dropped (no dead-letter exchange)."""
    name = qname()
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-delivery-limit": 2})
    ch.basic_publish("", name, b"poison")
    seen = []
    for _ in range(4):
        method, props, _ = ch.basic_get(name)
        if method is None:
            break
        seen.append((method.redelivered, props.headers["x-delivery-count"]))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert seen == [(False, 0), (True, 1), (True, 2)]
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    ch.queue_delete(name)


def test_delivery_limit_dead_letters_with_reason(ch):
    name, dlq = qname(), qname("dlq")
    ch.exchange_declare(f"{name}.dlx", "fanout")
    ch.queue_declare(dlq, durable=True)
    ch.queue_bind(dlq, f"{name}.dlx")
    ch.queue_declare(name, durable=True, arguments={
        **QUORUM, "x-delivery-limit": 1, "x-dead-letter-exchange": f"{name}.dlx"})
    ch.basic_publish("", name, b"m")
    for _ in range(2):
        method, _, _ = ch.basic_get(name)
        ch.basic_reject(method.delivery_tag, requeue=True)
    deadline = time.monotonic() + 10
    while (got := ch.basic_get(dlq, auto_ack=True))[0] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    _, props, body = got
    assert body == b"m"
    death = props.headers["x-death"][0]
    assert death["reason"] == "delivery_limit" and death["queue"] == name
    assert props.headers["x-first-death-reason"] == "delivery_limit"
    for q in (name, dlq):
        ch.queue_delete(q)
    ch.exchange_delete(f"{name}.dlx")


def test_consumer_redelivery_after_channel_close(pika_conns):
    """A consumer's channel closes with the message unacked: it is returned, and the next
    delivery says so (RabbitMQ: no header on a first consumer delivery)."""
    conn = pika_conns()
    ch = conn.channel()
    name = qname()
    ch.queue_declare(name, durable=True, arguments=QUORUM)
    ch.basic_publish("", name, b"m")
    first = []
    c2 = pika_conns()
    cch = c2.channel()
    cch.basic_consume(name, lambda c, m, p, b: first.append((m.redelivered, p.headers)))
    deadline = time.monotonic() + 10
    while not first and time.monotonic() < deadline:
        c2.process_data_events(0.05)
    assert first == [(False, None)]
    c2.close()
    deadline = time.monotonic() + 10
    while (got := ch.basic_get(name))[0] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    method, props, _ = got
    assert method.redelivered and props.headers["x-delivery-count"] == 1
    ch.basic_ack(method.delivery_tag)
    ch.queue_delete(name)


def test_reject_publish_overflow(ch):
    name = qname()
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-max-length": 2,
                                                    "x-overflow": "reject-publish"})
    ch.basic_publish("", name, b"1")
    ch.basic_publish("", name, b"2")
    with pytest.raises(NackError):
        ch.basic_publish("", name, b"3")
    assert ch.queue_declare(name, passive=True).method.message_count == 2
    ch.queue_delete(name)


def test_drop_head_overflow(ch):
    name = qname()
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-max-length": 2})
    for i in range(5):
        ch.basic_publish("", name, str(i).encode())
    bodies = [ch.basic_get(name, auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"3", b"4"]
    ch.queue_delete(name)


def test_message_ttl(ch):
    name = qname()
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-message-ttl": 50})
    ch.basic_publish("", name, b"gone")
    time.sleep(0.2)
    assert ch.basic_get(name)[0] is None
    ch.queue_delete(name)


def test_max_length_bytes_drops_from_the_head(ch):
    """x-max-length-bytes counts body bytes; past it the oldest go (drop-head, the default)."""
    name = qname()
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-max-length-bytes": 10})
    for i in range(5):
        ch.basic_publish("", name, b"m%03d" % i)  # 4 bytes each: two fit
    assert ch.queue_declare(name, passive=True).method.message_count == 2
    bodies = [ch.basic_get(name, auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"m003", b"m004"]
    ch.queue_delete(name)


def test_max_length_bytes_with_reject_publish(ch):
    name = qname()
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-max-length-bytes": 10,
                                                    "x-overflow": "reject-publish"})
    ch.basic_publish("", name, b"abcd")
    ch.basic_publish("", name, b"efgh")
    with pytest.raises(NackError):
        ch.basic_publish("", name, b"ijkl")
    assert ch.queue_declare(name, passive=True).method.message_count == 2
    ch.queue_delete(name)


def test_per_message_expiration(ch):
    """A message's own expiration property: it goes once expired, the others stay."""
    name = qname()
    ch.queue_declare(name, durable=True, arguments=QUORUM)
    ch.basic_publish("", name, b"gone", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", name, b"kept")
    time.sleep(0.2)
    assert ch.basic_get(name, auto_ack=True)[2] == b"kept"
    assert ch.basic_get(name)[0] is None
    ch.queue_delete(name)


def test_expires_deletes_an_unused_queue(pika_conns):
    """x-expires (CLUSTER.md lists it among what a quorum queue takes): unused, it goes."""
    ch = pika_conns().channel()
    name = qname()
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-expires": 300})
    deadline = time.monotonic() + 30
    while True:
        probe = pika_conns().channel()
        try:
            probe.queue_declare(name, passive=True)
        except ChannelClosedByBroker as err:
            assert err.reply_code == 404
            break
        assert time.monotonic() < deadline, "the queue did not expire"
        time.sleep(1.0)  # past x-expires: a passive declare might count as a use


def test_consumer_priorities(pika_conns):
    """x-priority on basic.consume: the higher consumer gets the messages while it has room
    (CLUSTER.md: consumer priorities, as RabbitMQ's quorum queues)."""
    conn = pika_conns()
    ch = conn.channel()
    name = qname()
    ch.queue_declare(name, durable=True, arguments=QUORUM)
    got: dict[str, list[bytes]] = {"low": [], "high": []}
    ch.basic_consume(name, lambda c, m, p, b: got["low"].append(b), auto_ack=True,
                     consumer_tag="low", arguments={"x-priority": 0})
    ch.basic_consume(name, lambda c, m, p, b: got["high"].append(b), auto_ack=True,
                     consumer_tag="high", arguments={"x-priority": 10})
    for i in range(6):
        ch.basic_publish("", name, str(i).encode())
    deadline = time.monotonic() + 10
    while len(got["high"]) + len(got["low"]) < 6 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert got == {"low": [], "high": [str(i).encode() for i in range(6)]}
    ch.queue_delete(name)


def test_redeclare_compares_quorum_arguments(ch, pika_conns):
    name = qname()
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-delivery-limit": 2})
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-delivery-limit": 2})
    other = pika_conns().channel()
    with pytest.raises(ChannelClosedByBroker) as err:
        other.queue_declare(name, durable=True, arguments={**QUORUM, "x-delivery-limit": 3})
    assert err.value.reply_code == 406 and "x-delivery-limit" in err.value.reply_text
    ch.queue_delete(name)


def test_single_active_consumer(pika_conns):
    conn = pika_conns()
    ch = conn.channel()
    name = qname()
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-single-active-consumer": True})
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    ch.basic_consume(name, lambda c, m, p, b: got["a"].append(b), auto_ack=True,
                     consumer_tag="a")
    ch.basic_consume(name, lambda c, m, p, b: got["b"].append(b), auto_ack=True,
                     consumer_tag="b")
    for i in range(6):
        ch.basic_publish("", name, str(i).encode())
    deadline = time.monotonic() + 10
    while len(got["a"]) < 6 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert got == {"a": [str(i).encode() for i in range(6)], "b": []}
    ch.queue_delete(name)


def test_management_and_policies(tmp_path):
    """/api/queues shows type, leader, members and online members; a policy's
    delivery-limit applies to a quorum queue (the smaller of policy and argument, as
    RabbitMQ's) and a classic queue's queue-mode does not."""
    b = MgmtBroker(tmp_path / "data").start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.queue_declare("mq", durable=True, arguments={**QUORUM, "x-delivery-limit": 5})
        q = b.get("/api/queues/%2F/mq")
        assert q["type"] == "quorum"
        assert q["leader"] == q["node"] and q["members"] == [q["node"]]
        assert q["online"] == [q["node"]]
        assert q["messages_uncommitted"] == 0 and q["messages_dlx"] == 0
        status, _ = b.api("PUT", "/api/policies/%2F/limit", {
            "pattern": "^mq$", "apply-to": "queues",
            "definition": {"delivery-limit": 1, "queue-mode": "lazy"}})
        assert status in (201, 204)
        q = b.get("/api/queues/%2F/mq")
        assert q["policy"] == "limit"
        ch.basic_publish("", "mq", b"m")
        counts = []
        while (got := ch.basic_get("mq"))[0] is not None:
            counts.append(got[1].headers["x-delivery-count"])
            ch.basic_nack(got[0].delivery_tag, requeue=True)
        assert counts == [0, 1]  # the policy's 1, not the argument's 5
        conn.close()
    finally:
        b.stop()


def test_a_policys_overflow_wins_over_the_argument(tmp_path):
    """For a quorum queue a policy's overflow wins over x-overflow (rabbit_quorum_queue's
    rule; for a classic queue the argument wins), so reject-publish from a policy nacks."""
    b = MgmtBroker(tmp_path / "data").start()
    try:
        status, _ = b.api("PUT", "/api/policies/%2F/reject", {
            "pattern": "^capped$", "apply-to": "queues",
            "definition": {"overflow": "reject-publish"}})
        assert status in (201, 204)
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("capped", durable=True, arguments={
            **QUORUM, "x-max-length": 1, "x-overflow": "drop-head"})
        ch.basic_publish("", "capped", b"1")
        with pytest.raises(NackError):
            ch.basic_publish("", "capped", b"2")
        assert ch.basic_get("capped", auto_ack=True)[2] == b"1"
        conn.close()
    finally:
        b.stop()


@pytest.mark.parametrize("clean", [True, False])
def test_restart_keeps_confirmed_messages_and_counts(fresh_broker, clean):
    """Every confirmed message survives a clean stop and kill -9; a message a consumer held
    comes back returned once more (x-delivery-count 1), as RabbitMQ's."""
    b = fresh_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.confirm_delivery()
    name = "durable-qq"
    ch.queue_declare(name, durable=True, arguments=QUORUM)
    big = b"x" * 10000  # in the message store, not embedded in the index
    for i in range(200):
        ch.basic_publish("", name, str(i).encode() + (big if i % 10 == 0 else b""))
    _, _, body = ch.basic_get(name)  # held unacked across the restart
    assert body == b"0" + big
    # that it was handed out is written with the queue's next batch: a later confirmed
    # publish says it is on disk
    ch.basic_publish("", name, b"200")
    b.restart(clean=clean)
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    assert ch.queue_declare(name, passive=True).method.message_count == 201
    first, props, body = ch.basic_get(name, auto_ack=True)
    assert body == b"0" + big and first.redelivered
    assert props.headers["x-delivery-count"] == 1
    bodies = [ch.basic_get(name, auto_ack=True)[2] for _ in range(200)]
    assert bodies == [str(i).encode() + (big if i % 10 == 0 else b"") for i in range(1, 200)
                      ] + [b"200"]
    conn.close()


def test_dead_letter_at_least_once_waits_for_the_target(fresh_broker):
    """x-dead-letter-strategy at-least-once (with reject-publish): a rejected message with no
    queue to go to stays in the source's log (at-most-once would drop it), arrives once a
    queue is bound, and comes back to the source after a kill -9 while it waited."""
    b = fresh_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("dlx", "fanout", durable=True)
    args = {**QUORUM, "x-overflow": "reject-publish", "x-dead-letter-strategy": "at-least-once",
            "x-dead-letter-exchange": "dlx"}
    ch.queue_declare("src", durable=True, arguments=args)
    ch.basic_publish("", "src", b"a")
    ch.basic_publish("", "src", b"b")
    method, _, body = ch.basic_get("src")
    assert body == b"a"
    ch.basic_reject(method.delivery_tag, requeue=False)  # nowhere to go yet
    method, _, body = ch.basic_get("src")
    assert body == b"b"
    ch.basic_reject(method.delivery_tag, requeue=False)
    ch.queue_declare("target", durable=True)
    ch.queue_bind("target", "dlx")
    deadline = time.monotonic() + 15
    while (got := ch.basic_get("target", auto_ack=True))[0] is None:
        assert time.monotonic() < deadline, "dead-lettered message never arrived"
        time.sleep(0.1)
    assert {got[2], ch.basic_get("target", auto_ack=True)[2]} <= {b"a", b"b"}
    ch.queue_unbind("target", "dlx")
    ch.basic_publish("", "src", b"c")
    method, _, _ = ch.basic_get("src")
    ch.basic_reject(method.delivery_tag, requeue=False)  # waits again
    ch.basic_publish("", "src", b"d")  # confirmed: the reject before it is on disk too
    b.restart(clean=False)
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    bodies = [ch.basic_get("src", auto_ack=True)[2] for _ in range(2)]
    assert sorted(bodies) == [b"c", b"d"]
    conn.close()
