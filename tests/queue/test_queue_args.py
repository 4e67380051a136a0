"""Queue arguments end to end, as RabbitMQ: x-message-ttl and per-message expiration, x-expires,
x-max-length with drop-head and reject-publish, dead-lettering with x-death headers."""

from __future__ import annotations

import datetime
import itertools
import time

import pytest
from pamqp import commands
from pamqp import header as pheader
from pamqp.body import ContentBody

from tests.amqp_raw import RawClient

_n = itertools.count(1)


def uniq(prefix: str) -> str:
    return f"{prefix}-{next(_n)}-{time.monotonic_ns() % 1_000_000}"


def client(port: int) -> RawClient:
    c = RawClient(port)
    c.handshake()
    c.open_channel(1)
    return c


def call(c: RawClient, method: object, reply: type) -> object:
    c.send_method(1, method)
    return c.expect(reply, 1)


def declare(c: RawClient, name: str, **arguments) -> str:
    ok = call(c, commands.Queue.Declare(queue=name, exclusive=True, arguments=arguments),
              commands.Queue.DeclareOk)
    return ok.queue


def publish(c: RawClient, exchange: str, key: str, body: bytes, **props) -> None:
    c.send_method(1, commands.Basic.Publish(exchange=exchange, routing_key=key))
    c.send_content(1, body, commands.Basic.Properties(**props) if props else None)


def read_content(c: RawClient) -> tuple[commands.Basic.Properties, bytes]:
    hdr = c.expect(pheader.ContentHeader, 1)
    body = b""
    while len(body) < hdr.body_size:
        body += c.expect(ContentBody, 1).value
    return hdr.properties, body


def get(c: RawClient, queue: str, no_ack: bool = True):
    """(GetOk, properties, body), or None when the queue is empty."""
    c.send_method(1, commands.Basic.Get(queue=queue, no_ack=no_ack))
    m = c.recv_frame()[1]
    if isinstance(m, commands.Basic.GetEmpty):
        return None
    assert isinstance(m, commands.Basic.GetOk), m
    props, body = read_content(c)
    return m, props, body


def wait_get(c: RawClient, queue: str, timeout: float = 3.0):
    deadline = time.monotonic() + timeout
    while True:
        got = get(c, queue)
        if got is not None:
            return got
        assert time.monotonic() < deadline, f"nothing arrived in {queue}"
        time.sleep(0.02)


def count(c: RawClient, queue: str) -> int:
    ok = call(c, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    return ok.message_count


def dl_setup(c: RawClient, **queue_args) -> tuple[str, str, str]:
    """A direct dead-letter exchange with a queue bound by '#' semantics: returns (dlx, dlq,
    queue) where `queue` dead-letters to dlx with routing key 'dead'."""
    dlx = uniq("dlx")
    call(c, commands.Exchange.Declare(exchange=dlx, exchange_type="fanout", auto_delete=True),
         commands.Exchange.DeclareOk)
    dlq = declare(c, uniq("dlq"))
    call(c, commands.Queue.Bind(queue=dlq, exchange=dlx), commands.Queue.BindOk)
    q = declare(c, uniq("src"), **{"x-dead-letter-exchange": dlx, **queue_args})
    return dlx, dlq, q


def text(value: object) -> object:
    return value.decode() if isinstance(value, bytes) else value


# -- x-message-ttl ------------------------------------------------------------------------------
def test_message_ttl_expires_and_dead_letters_with_reason_expired(broker):
    c = client(broker.port)
    _, dlq, q = dl_setup(c, **{"x-message-ttl": 100})
    publish(c, "", q, b"old-1", headers={"app": "kept"})
    publish(c, "", q, b"old-2")
    first = wait_get(c, dlq)
    second = wait_get(c, dlq)
    assert [first[2], second[2]] == [b"old-1", b"old-2"]
    assert get(c, q) is None  # expired: never delivered
    headers = first[1].headers
    assert headers["app"] == "kept"
    (death,) = headers["x-death"]
    assert text(death["reason"]) == "expired"
    assert text(death["queue"]) == q
    assert text(death["exchange"]) == ""
    assert [text(k) for k in death["routing-keys"]] == [q]
    assert death["count"] == 1
    assert isinstance(death["time"], datetime.datetime)
    assert text(headers["x-first-death-reason"]) == "expired"
    assert text(headers["x-first-death-queue"]) == q
    assert text(headers["x-first-death-exchange"]) == ""
    # without a dead-letter routing key the original key is kept
    assert first[0].routing_key == q
    c.close()


def test_requeued_message_past_its_ttl_is_dead_lettered_not_redelivered(broker):
    c = client(broker.port)
    _, dlq, q = dl_setup(c, **{"x-message-ttl": 100})
    publish(c, "", q, b"held too long")
    ok, _, _ = get(c, q, no_ack=False)
    time.sleep(0.2)  # its TTL runs out while it is unacked
    c.send_method(1, commands.Basic.Nack(delivery_tag=ok.delivery_tag, requeue=True))
    got = wait_get(c, dlq)
    assert got[2] == b"held too long"
    assert text(got[1].headers["x-death"][0]["reason"]) == "expired"
    assert count(c, q) == 0
    c.close()


def test_message_ttl_expires_messages_waiting_behind_prefetch(broker):
    c = client(broker.port)
    _, dlq, q = dl_setup(c, **{"x-message-ttl": 100})
    call(c, commands.Basic.Qos(prefetch_count=1), commands.Basic.QosOk)
    call(c, commands.Basic.Consume(queue=q, consumer_tag="busy"), commands.Basic.ConsumeOk)
    for i in range(3):
        publish(c, "", q, b"w%d" % i)
    d = c.expect(commands.Basic.Deliver, 1)
    assert read_content(c)[1] == b"w0"
    # w1 and w2 wait behind the prefetch window and expire there
    expired = [wait_get(c, dlq)[2], wait_get(c, dlq)[2]]
    assert expired == [b"w1", b"w2"]
    c.send_method(1, commands.Basic.Ack(delivery_tag=d.delivery_tag))
    publish(c, "", q, b"w3")
    d = c.expect(commands.Basic.Deliver, 1)
    assert read_content(c)[1] == b"w3"
    c.close()


def test_message_ttl_not_delivered_to_late_consumer(broker):
    c = client(broker.port)
    q = declare(c, uniq("ttl-late"), **{"x-message-ttl": 50})
    publish(c, "", q, b"stale")
    deadline = time.monotonic() + 3
    while count(c, q):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    call(c, commands.Basic.Consume(queue=q, consumer_tag="late", no_ack=True),
         commands.Basic.ConsumeOk)
    publish(c, "", q, b"fresh")
    d = c.expect(commands.Basic.Deliver, 1)
    assert d.consumer_tag == "late"
    assert read_content(c)[1] == b"fresh"
    c.close()


def test_message_ttl_zero_goes_to_a_waiting_consumer(broker):
    c = client(broker.port)
    q = declare(c, uniq("ttl-0"), **{"x-message-ttl": 0})
    publish(c, "", q, b"nobody-waits")
    time.sleep(0.05)
    assert get(c, q) is None
    call(c, commands.Basic.Consume(queue=q, consumer_tag="w", no_ack=True),
         commands.Basic.ConsumeOk)
    publish(c, "", q, b"now")
    c.expect(commands.Basic.Deliver, 1)
    assert read_content(c)[1] == b"now"
    c.close()


def test_per_message_expiration(broker):
    c = client(broker.port)
    _, dlq, q = dl_setup(c)
    publish(c, "", q, b"short", expiration="50")
    publish(c, "", q, b"forever")
    got = wait_get(c, dlq)
    assert got[2] == b"short"
    props = got[1]
    assert props.expiration is None  # removed when dead-lettered, as RabbitMQ
    (death,) = props.headers["x-death"]
    assert text(death["reason"]) == "expired"
    assert text(death["original-expiration"]) == "50"
    remaining = get(c, q)
    assert remaining[2] == b"forever"
    assert get(c, q) is None
    c.close()


def test_per_message_expiration_lower_than_queue_ttl_wins(broker):
    c = client(broker.port)
    _, dlq, q = dl_setup(c, **{"x-message-ttl": 60_000})
    publish(c, "", q, b"quick", expiration="30")
    publish(c, "", q, b"slow")
    assert wait_get(c, dlq)[2] == b"quick"
    assert get(c, q)[2] == b"slow"
    c.close()


# -- x-expires ----------------------------------------------------------------------------------
def test_x_expires_deletes_unused_queue(broker):
    c = client(broker.port)
    c.open_channel(2)
    idle = uniq("expires-idle")
    busy = uniq("expires-busy")
    call(c, commands.Queue.Declare(queue=idle, arguments={"x-expires": 150}),
         commands.Queue.DeclareOk)
    call(c, commands.Queue.Declare(queue=busy, arguments={"x-expires": 150}),
         commands.Queue.DeclareOk)
    c.send_method(2, commands.Basic.Consume(queue=busy, consumer_tag="keep"))
    c.expect(commands.Basic.ConsumeOk, 2)
    # poll with queue.bind: unlike a (passive) declare, basic.get or consume, a binding does
    # not renew the queue's lease
    deadline = time.monotonic() + 3
    while True:
        c.send_method(1, commands.Queue.Bind(queue=idle, exchange="amq.direct",
                                             routing_key=idle))
        m = c.recv_frame()[1]
        if isinstance(m, commands.Channel.Close):
            assert m.reply_code == 404 and idle in m.reply_text
            c.send_method(1, commands.Channel.CloseOk())
            c.open_channel(1)
            break
        assert isinstance(m, commands.Queue.BindOk)
        assert time.monotonic() < deadline, "x-expires did not delete the idle queue"
        time.sleep(0.05)
    # the queue with a consumer is in use: still there after its x-expires
    c.send_method(1, commands.Queue.Bind(queue=busy, exchange="amq.direct", routing_key=busy))
    c.expect(commands.Queue.BindOk, 1)
    c.send_method(2, commands.Basic.Cancel(consumer_tag="keep"))
    c.expect(commands.Basic.CancelOk, 2)
    call(c, commands.Queue.Delete(queue=busy), commands.Queue.DeleteOk)
    c.close()


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-message-ttl": -1},
        {"x-message-ttl": "60000"},
        {"x-max-length": -1},
        {"x-max-length-bytes": -5},
        {"x-overflow": "drop-tail"},
        {"x-dead-letter-routing-key": "k"},  # without x-dead-letter-exchange
    ],
)
def test_invalid_queue_arguments_are_406(broker, arguments):
    c = client(broker.port)
    c.send_method(1, commands.Queue.Declare(queue=uniq("bad-args"), arguments=arguments))
    close = c.expect(commands.Channel.Close, 1)
    assert close.reply_code == 406
    assert next(iter(arguments)) in close.reply_text
    c.close()


def test_invalid_x_expires_is_406(broker):
    c = client(broker.port)
    c.send_method(1, commands.Queue.Declare(queue=uniq("bad-expires"),
                                            arguments={"x-expires": 0}))
    close = c.expect(commands.Channel.Close, 1)
    assert close.reply_code == 406 and "x-expires" in close.reply_text
    c.close()


# -- x-max-length -------------------------------------------------------------------------------
def test_max_length_drop_head_dead_letters_oldest(broker):
    c = client(broker.port)
    _, dlq, q = dl_setup(c, **{"x-max-length": 2})
    for i in range(1, 5):
        publish(c, "", q, b"m%d" % i)
    assert count(c, q) == 2
    dropped = [wait_get(c, dlq), wait_get(c, dlq)]
    assert [d[2] for d in dropped] == [b"m1", b"m2"]
    for d in dropped:
        (death,) = d[1].headers["x-death"]
        assert text(death["reason"]) == "maxlen"
        assert text(death["queue"]) == q
    assert [get(c, q)[2] for _ in range(2)] == [b"m3", b"m4"]
    c.close()


def test_max_length_bytes_drop_head(broker):
    c = client(broker.port)
    q = declare(c, uniq("maxbytes"), **{"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):
        publish(c, "", q, body)
    assert [get(c, q)[2] for _ in range(2)] == [b"bbbb", b"cccc"]
    assert get(c, q) is None
    c.close()


def test_overflow_reject_publish_nacks(broker):
    c = client(broker.port)
    _, dlq, q = dl_setup(c, **{"x-max-length": 2, "x-overflow": "reject-publish"})
    call(c, commands.Confirm.Select(), commands.Confirm.SelectOk)
    for i in range(1, 5):
        publish(c, "", q, b"r%d" % i)
    acked: set[int] = set()
    nacked: set[int] = set()
    while len(acked) + len(nacked) < 4:
        m = c.recv_frame()[1]
        assert isinstance(m, commands.Basic.Ack | commands.Basic.Nack), m
        covered = ({s for s in range(1, m.delivery_tag + 1) if s not in acked | nacked}
                   if m.multiple else {m.delivery_tag})
        (acked if isinstance(m, commands.Basic.Ack) else nacked).update(covered)
    assert acked == {1, 2} and nacked == {3, 4}
    assert [get(c, q)[2] for _ in range(2)] == [b"r1", b"r2"]
    assert get(c, q) is None
    assert get(c, dlq) is None  # reject-publish does not dead-letter
    # room again: the next publish is accepted
    publish(c, "", q, b"r5")
    assert c.expect(commands.Basic.Ack, 1).delivery_tag == 5
    c.close()


def test_overflow_reject_publish_dlx_dead_letters_refused(broker):
    c = client(broker.port)
    _, dlq, q = dl_setup(c, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    publish(c, "", q, b"in")
    publish(c, "", q, b"refused")
    got = wait_get(c, dlq)
    assert got[2] == b"refused"
    assert text(got[1].headers["x-death"][0]["reason"]) == "maxlen"
    assert get(c, q)[2] == b"in"
    c.close()


# -- dead-lettering on reject -------------------------------------------------------------------
def test_reject_dead_letters_with_routing_key_and_x_death(broker):
    c = client(broker.port)
    dlx = uniq("dlx-direct")
    call(c, commands.Exchange.Declare(exchange=dlx, exchange_type="direct", auto_delete=True),
         commands.Exchange.DeclareOk)
    dlq = declare(c, uniq("dlq-direct"))
    call(c, commands.Queue.Bind(queue=dlq, exchange=dlx, routing_key="dead"),
         commands.Queue.BindOk)
    x = uniq("src-x")
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="topic", auto_delete=True),
         commands.Exchange.DeclareOk)
    q = declare(c, uniq("rejecting"), **{"x-dead-letter-exchange": dlx,
                                         "x-dead-letter-routing-key": "dead"})
    call(c, commands.Queue.Bind(queue=q, exchange=x, routing_key="orders.#"),
         commands.Queue.BindOk)
    publish(c, x, "orders.new", b"bad order", message_id="o-1", headers={"k": 1})
    publish(c, x, "orders.old", b"nacked order")
    ok, _, body = get(c, q, no_ack=False)
    assert body == b"bad order"
    c.send_method(1, commands.Basic.Reject(delivery_tag=ok.delivery_tag, requeue=False))
    ok2, _, _ = get(c, q, no_ack=False)
    c.send_method(1, commands.Basic.Nack(delivery_tag=ok2.delivery_tag, requeue=False))
    got_ok, props, body = wait_get(c, dlq)
    assert body == b"bad order"
    assert (got_ok.exchange, got_ok.routing_key) == (dlx, "dead")
    assert props.message_id == "o-1" and props.headers["k"] == 1
    (death,) = props.headers["x-death"]
    assert death["count"] == 1
    assert text(death["reason"]) == "rejected"
    assert text(death["queue"]) == q
    assert text(death["exchange"]) == x
    assert [text(k) for k in death["routing-keys"]] == ["orders.new"]
    when = death["time"]
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    assert abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) < 60
    assert text(props.headers["x-first-death-reason"]) == "rejected"
    assert text(props.headers["x-first-death-queue"]) == q
    assert text(props.headers["x-first-death-exchange"]) == x
    nacked = wait_get(c, dlq)
    assert nacked[2] == b"nacked order"
    assert text(nacked[1].headers["x-death"][0]["reason"]) == "rejected"
    assert [text(k) for k in nacked[1].headers["x-death"][0]["routing-keys"]] == ["orders.old"]
    # requeue=true does not dead-letter
    publish(c, x, "orders.again", b"requeued")
    ok3, _, _ = get(c, q, no_ack=False)
    c.send_method(1, commands.Basic.Reject(delivery_tag=ok3.delivery_tag, requeue=True))
    again = get(c, q)
    assert again[2] == b"requeued" and again[0].redelivered
    assert get(c, dlq) is None
    c.close()


def test_x_death_counts_repeated_rejections(broker):
    """q dead-letters to dlq, dlq back to q (through the default exchange): each rejection
    adds to the entry for its (queue, reason); the latest entry comes first."""
    c = client(broker.port)
    q, dlq = uniq("cyc-q"), uniq("cyc-dlq")
    declare(c, q, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    declare(c, dlq, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q})
    publish(c, "", q, b"ping-pong")

    def reject_from(queue: str) -> commands.Basic.Properties:
        deadline = time.monotonic() + 3
        while True:
            got = get(c, queue, no_ack=False)
            if got is not None:
                break
            assert time.monotonic() < deadline
            time.sleep(0.02)
        c.send_method(1, commands.Basic.Reject(delivery_tag=got[0].delivery_tag, requeue=False))
        return got[1]

    reject_from(q)
    reject_from(dlq)
    reject_from(q)
    props = wait_get(c, dlq)[1]
    deaths = props.headers["x-death"]
    assert [(text(d["queue"]), text(d["reason"]), d["count"]) for d in deaths] == [
        (q, "rejected", 2),
        (dlq, "rejected", 1),
    ]
    assert text(props.headers["x-first-death-queue"]) == q
    c.close()


# -- dead-letter cycles -------------------------------------------------------------------------
def _stays_empty(c: RawClient, queues: list[str], timeout: float = 3.0) -> None:
    """All queues empty, and still empty after a few more TTLs (a cycle would refill them)."""
    deadline = time.monotonic() + timeout
    while any(count(c, q) for q in queues):
        assert time.monotonic() < deadline, "the message never went"
        time.sleep(0.02)
    for _ in range(5):
        time.sleep(0.05)
        assert not any(count(c, q) for q in queues), "the message came back: a cycle"


def test_expired_message_dead_lettered_to_its_own_queue_is_dropped(broker):
    """A queue dead-lettering to the default exchange with no routing key sends a message
    back to itself: without a rejection in the cycle RabbitMQ drops it."""
    c = client(broker.port)
    q = declare(c, uniq("self-cycle"), **{"x-message-ttl": 30, "x-dead-letter-exchange": ""})
    publish(c, "", q, b"round and round")
    _stays_empty(c, [q])
    c.close()


def test_expiry_cycle_between_two_queues_is_dropped_after_one_lap(broker):
    c = client(broker.port)
    a, b = uniq("cycle-a"), uniq("cycle-b")
    declare(c, a, **{"x-message-ttl": 30, "x-dead-letter-exchange": "",
                     "x-dead-letter-routing-key": b})
    declare(c, b, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": a})
    publish(c, "", a, b"one lap")
    _, props, body = wait_get(c, b)  # b has no TTL: the message waits there after a's expiry
    assert body == b"one lap"
    assert [(text(d["queue"]), text(d["reason"])) for d in props.headers["x-death"]] == [
        (a, "expired")]
    c.close()


def test_expiry_cycle_of_two_ttl_queues_ends(broker):
    c = client(broker.port)
    a, b = uniq("ttl-cycle-a"), uniq("ttl-cycle-b")
    declare(c, a, **{"x-message-ttl": 30, "x-dead-letter-exchange": "",
                     "x-dead-letter-routing-key": b})
    declare(c, b, **{"x-message-ttl": 30, "x-dead-letter-exchange": "",
                     "x-dead-letter-routing-key": a})
    publish(c, "", a, b"a to b, then dropped")
    _stays_empty(c, [a, b])
    c.close()
