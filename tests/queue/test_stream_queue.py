"""Stream queues over AMQP 0-9-1, as RabbitMQ 3.10.8 serves them (each answer checked against
it): an append-only log that any number of consumers read from their own offset, with
x-stream-offset on basic.consume and on every delivery, prefetch and manual acks required,
basic.get, purge, nack and reject refused; routing, confirms, mandatory and permissions as for
any queue; confirmed messages survive a restart and kill -9 with their offsets."""

from __future__ import annotations

import datetime
import time
import urllib.parse
from pathlib import Path

import pika
import pika.exceptions
import pytest
from mgmt.helpers import MgmtBroker

from broker.store.layout import STREAMS
from tests.conftest import BrokerProc

STREAM = {"x-queue-type": "stream"}


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def declare(ch, name: str, **args: object) -> None:
    ch.queue_declare(name, durable=True, arguments={**STREAM, **args})


def publish(url: str, queue: str, bodies: list[bytes], exchange: str = "",
            props: pika.BasicProperties | None = None) -> None:
    """Publish with confirms, one chunk per publish... as a client sending one at a time."""
    conn = connect(url)
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish(exchange, queue, body, props)
    conn.close()


def publish_batch(url: str, queue: str, bodies: list[bytes], wait: bool = True) -> None:
    """All in one transaction: routed together at the commit, so the stream appends them as
    one chunk (a stream's "last"). Commit-ok does not wait for the disk: this waits until
    the stream counts them (it counts what is committed)."""
    conn = connect(url)
    ch = conn.channel()
    before = ch.queue_declare(queue, passive=True).method.message_count
    ch.tx_select()
    for body in bodies:
        ch.basic_publish("", queue, body)
    ch.tx_commit()
    deadline = time.monotonic() + 30
    while wait and ch.queue_declare(queue, passive=True).method.message_count < (
            before + len(bodies)):
        assert time.monotonic() < deadline, "the stream did not commit the batch"
        time.sleep(0.01)
    conn.close()


def consume(url: str, queue: str, offset: object = None, n: int = 1000, prefetch: int = 100,
            wait: float = 1.0, first: float = 15.0) -> list[tuple[int, bytes, dict]]:
    """(offset header, body, headers) of what a consumer from `offset` gets: until `n` came,
    or nothing came for `wait` seconds once the first did (which may take `first`: give a
    short one where nothing is expected)."""
    conn = connect(url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=min(prefetch, n))  # none left unseen: pika rejects those
    got: list[tuple[int, bytes, dict]] = []
    tags: list[int] = []

    def on(chan, method, props, body):
        got.append((props.headers["x-stream-offset"], body, props.headers))
        tags.append(method.delivery_tag)

    args = {} if offset is None else {"x-stream-offset": offset}
    ch.basic_consume(queue, on, arguments=args)
    deadline = time.monotonic() + first
    while not got and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    seen = -1
    while got and len(got) < n and len(got) != seen:
        seen = len(got)
        if tags:  # outside the callback: pika's blocking client can stall when a callback
            ch.basic_ack(tags[-1], multiple=True)  # acks (with RabbitMQ's streams too)
            tags.clear()
        conn.process_data_events(time_limit=wait)
    conn.close()
    return got


def refused(url: str, action) -> tuple[int, str, bool]:
    """(reply code, text, connection-level) of what the broker answered."""
    conn = connect(url)
    ch = conn.channel()
    try:
        action(ch)
        deadline = time.monotonic() + 10  # an asynchronous refusal (a nack's) comes later
        while ch.is_open and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        if ch.is_closed:
            ch.basic_qos(prefetch_count=1)  # raises the reason the broker gave
    except pika.exceptions.ChannelClosedByBroker as e:
        conn.close()
        return e.reply_code, e.reply_text, False
    except pika.exceptions.ConnectionClosedByBroker as e:
        return e.reply_code, e.reply_text, True
    conn.close()
    raise AssertionError("not refused")


def test_consumers_read_from_their_own_offset(broker: BrokerProc) -> None:
    url = broker.url
    conn = connect(url)
    declare(conn.channel(), "st.offsets")
    conn.close()
    publish(url, "st.offsets", [b"a%d" % i for i in range(10)])
    assert [o for o, _, _ in consume(url, "st.offsets", "last")] == [9]
    # an AMQP timestamp has whole seconds: the next second starts between the two publishes
    before = datetime.datetime.fromtimestamp(int(time.time()) + 1, datetime.UTC)
    time.sleep(max(0.0, before.timestamp() - time.time()) + 0.01)
    publish_batch(url, "st.offsets", [b"b%d" % i for i in range(5)])  # one chunk: 10..15
    everything = consume(url, "st.offsets", "first")
    assert [(o, b) for o, b, _ in everything] == [
        *((i, b"a%d" % i) for i in range(10)), *((10 + i, b"b%d" % i) for i in range(5))]
    # reads take nothing away: the same again, and a second consumer too
    assert consume(url, "st.offsets", "first") == everything
    assert [o for o, _, _ in consume(url, "st.offsets", 12)] == [12, 13, 14]
    assert [o for o, _, _ in consume(url, "st.offsets", -3)] == list(range(15))
    # last: the last chunk, what one turn of the queue appended (here one transaction)
    assert [o for o, _, _ in consume(url, "st.offsets", "last")] == list(range(10, 15))
    assert consume(url, "st.offsets", "next", first=0.5) == []
    assert consume(url, "st.offsets", first=0.5) == []  # next is the default
    assert [o for o, _, _ in consume(url, "st.offsets", before)] == list(range(10, 15))
    assert [o for o, _, _ in consume(url, "st.offsets", "1h")] == list(range(15))
    assert consume(url, "st.offsets", datetime.datetime(2100, 1, 1), first=0.5) == []
    conn = connect(url)
    ok = conn.channel().queue_declare("st.offsets", passive=True).method
    assert ok.message_count == 15
    conn.close()


def test_next_gets_what_arrives_after_the_consume_with_its_offset_header(
        broker: BrokerProc) -> None:
    url = broker.url
    conn = connect(url)
    ch = conn.channel()
    declare(ch, "st.next")
    ch.confirm_delivery()
    ch.basic_publish("", "st.next", b"old")
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume("st.next", lambda c, m, p, b: got.append((b, p.headers, m.redelivered)))
    conn.process_data_events(time_limit=0.2)
    ch.basic_publish("", "st.next", b"new", pika.BasicProperties(headers={"h": 1},
                                                                  content_type="text/plain"))
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert got == [(b"new", {"h": 1, "x-stream-offset": 1}, False)]
    conn.close()


def test_prefetch_is_credit_and_acks_give_it_back(broker: BrokerProc) -> None:
    url = broker.url
    conn = connect(url)
    declare(conn.channel(), "st.credit")
    conn.close()
    publish_batch(url, "st.credit", [b"%d" % i for i in range(20)])
    conn = connect(url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    tags: list[int] = []
    ch.basic_consume("st.credit", lambda c, m, p, b: tags.append(m.delivery_tag),
                     arguments={"x-stream-offset": "first"})

    def settle_at(n: int) -> None:
        """Wait for the n-th delivery, then make sure no more come: the credit is spent."""
        deadline = time.monotonic() + 30
        while len(tags) < n:
            assert time.monotonic() < deadline, f"{len(tags)} of {n} deliveries"
            conn.process_data_events(time_limit=0.05)
        conn.process_data_events(time_limit=0.3)
        assert len(tags) == n

    settle_at(3)  # its prefetch
    ch.basic_ack(tags[-1], multiple=True)
    settle_at(6)
    ch.basic_ack(tags[3])
    settle_at(7)
    conn.close()
    conn = connect(url)
    assert conn.channel().queue_declare("st.credit", passive=True).method.message_count == 20
    conn.close()


def test_what_a_stream_refuses(broker: BrokerProc) -> None:
    url = broker.url
    conn = connect(url)
    declare(conn.channel(), "st.refuse")
    conn.close()
    publish(url, "st.refuse", [b"x"])
    where = "queue 'st.refuse' in vhost '/'"

    def consume_with(prefetch: int = 10, global_: int = 0, **kw):
        def action(ch):
            if prefetch:
                ch.basic_qos(prefetch_count=prefetch)
            if global_:
                ch.basic_qos(prefetch_count=global_, global_qos=True)
            ch.basic_consume("st.refuse", lambda *a: None, **kw)
        return action

    assert refused(url, consume_with(prefetch=0)) == (
        406, f"PRECONDITION_FAILED - consumer prefetch count is not set for '{where}'", False)
    assert refused(url, consume_with(prefetch=0, auto_ack=True))[0] == 406
    assert refused(url, consume_with(auto_ack=True)) == (
        540, f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues "
        f"{where}", True)
    assert refused(url, consume_with(global_=10)) == (
        540, f"NOT_IMPLEMENTED - {where} does not support global qos", True)
    assert refused(url, consume_with(arguments={"x-priority": 2})) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-priority' for {where} of queue type "
        "rabbit_stream_queue", False)
    for bad in ("bogus", "", True, "0h"):
        code, text, hard = refused(url, consume_with(arguments={"x-stream-offset": bad}))
        # RabbitMQ 3.10.8 crashes here (541 on the connection); Hare names the argument
        assert (code, hard) == (406, False) and "invalid arg 'x-stream-offset'" in text
    assert refused(url, lambda ch: ch.basic_get("st.refuse")) == (
        540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues {where}", True)
    assert refused(url, lambda ch: ch.queue_purge("st.refuse")) == (
        540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues {where}", True)

    def settle(how: str):
        def action(ch):
            ch.basic_qos(prefetch_count=5)
            tags = []
            ch.basic_consume("st.refuse", lambda c, m, p, b: tags.append(m.delivery_tag),
                             arguments={"x-stream-offset": "first"})
            while not tags:
                ch.connection.process_data_events(time_limit=0.05)
            if how == "nack":
                ch.basic_nack(tags[0], requeue=True)
            else:
                ch.basic_reject(tags[0], requeue=False)
        return action

    for how in ("nack", "reject"):
        assert refused(url, settle(how)) == (
            540, f"NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream "
            f"queues {where}", True)
    # still there, whole
    assert [b for _, b, _ in consume(url, "st.refuse", "first")] == [b"x"]


def test_routing_confirms_and_mandatory_as_any_queue(broker: BrokerProc) -> None:
    url = broker.url
    conn = connect(url)
    ch = conn.channel()
    declare(ch, "st.routed")
    ch.exchange_declare("st.topic", "topic")
    ch.queue_bind("st.routed", "st.topic", "order.*")
    classic = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(classic, "st.topic", "order.*")
    ch.confirm_delivery()
    ch.basic_publish("st.topic", "order.paid", b"both", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("st.topic", "nobody", b"returned", mandatory=True)
    assert ch.basic_get(classic, auto_ack=True)[2] == b"both"
    conn.close()
    got = consume(url, "st.routed", "first")
    assert [(o, b) for o, b, _ in got] == [(0, b"both")]


def test_publish_and_consume_need_their_permissions(tmp_path: Path) -> None:
    b = MgmtBroker(tmp_path / "data").start()
    try:
        assert b.api("PUT", "/api/users/reader", {"password": "pw", "tags": ""})[0] in (201, 204)
        assert b.api("PUT", "/api/permissions/%2F/reader",
                     {"configure": "", "write": "", "read": ".*"})[0] in (201, 204)
        conn = connect(b.url)
        declare(conn.channel(), "st.perm")
        conn.close()
        publish(b.url, "st.perm", [b"one"])
        url = f"amqp://reader:pw@127.0.0.1:{b.port}/"
        code, text, _ = refused(url, lambda ch: (ch.confirm_delivery(),
                                                 ch.basic_publish("", "st.perm", b"no")))
        assert code == 403 and "access to exchange 'amq.default' in vhost '/' refused" in text
        assert [b for _, b, _ in consume(url, "st.perm", "first")] == [b"one"]
        assert b.api("PUT", "/api/permissions/%2F/reader",
                     {"configure": "", "write": "", "read": "^nothing$"})[0] in (201, 204)
        code, text, _ = refused(url, lambda ch: (ch.basic_qos(prefetch_count=1),
                                                 ch.basic_consume("st.perm", print)))
        assert code == 403 and "access to queue 'st.perm' in vhost '/' refused" in text
    finally:
        b.stop()


@pytest.mark.parametrize("crash", [False, True])
def test_confirmed_messages_survive_a_restart_with_their_offsets(tmp_path: Path,
                                                                 crash: bool) -> None:
    b = BrokerProc(tmp_path / "data").start()
    try:
        conn = connect(b.url)
        declare(conn.channel(), "st.durable", **{"x-stream-max-segment-size-bytes": 4000})
        conn.close()
        for k in range(0, 300, 30):  # ten chunks of about 1,800 bytes: segments roll
            publish_batch(b.url, "st.durable", [b"m%d" % i for i in range(k, k + 30)])
        # a transaction's commit-ok does not wait for the disk; a confirm does, and chunks
        # are committed in order: once this one is confirmed, every one before is on disk
        publish(b.url, "st.durable", [b"m300"])
        b.restart(clean=not crash)
        got = consume(b.url, "st.durable", "first")
        assert [(o, body) for o, body, _ in got] == [(i, b"m%d" % i) for i in range(301)]
        publish(b.url, "st.durable", [b"after"])
        assert [(o, body) for o, body, _ in consume(b.url, "st.durable", 300)] == [
            (300, b"m300"), (301, b"after")]
        segments = list(b.queue_dir("st.durable", STREAMS).glob("*.hstr"))
        assert len(segments) > 2  # rolled at 4000 bytes
    finally:
        b.stop()


def test_retention_drops_whole_segments_from_the_head(broker: BrokerProc) -> None:
    url = broker.url
    conn = connect(url)
    declare(conn.channel(), "st.retention", **{"x-max-length-bytes": 20_000,
                                               "x-stream-max-segment-size-bytes": 5000})
    conn.close()
    for round_ in range(10):
        publish_batch(url, "st.retention", [b"%04d" % (round_ * 40 + i) + b"." * 96
                                            for i in range(40)], wait=False)
    publish(url, "st.retention", [b"0400" + b"." * 96])  # confirmed: every chunk is in
    got = consume(url, "st.retention", "first", n=10_000)
    first = got[0][0]
    assert first > 0 and [o for o, _, _ in got] == list(range(first, 401))
    assert got[0][1].startswith(b"%04d" % first)  # the offset is the message's own
    # a consumer asking for an offset that went starts at the first one left
    assert consume(url, "st.retention", 0, n=1)[0][0] == first


def test_max_age_drops_old_segments_even_while_nobody_writes(broker: BrokerProc) -> None:
    """x-max-age on the queue: whole segments whose newest message is older go from the
    head, on the log's timer as well as on a roll; the segment being written stays."""
    url = broker.url
    conn = connect(url)
    declare(conn.channel(), "st.age", **{"x-max-age": "2s",
                                         "x-stream-max-segment-size-bytes": 2000})
    conn.close()
    for k in range(5):  # chunks of about 1,000 bytes: a segment every two
        publish_batch(url, "st.age", [b"%03d" % (k * 10 + i) + b"." * 97 for i in range(10)])
    publish(url, "st.age", [b"050"])  # confirmed: every chunk is in
    deadline = time.monotonic() + 60
    while consume(url, "st.age", "first", n=1)[0][0] == 0:
        assert time.monotonic() < deadline, "no segment aged out"
        time.sleep(0.5)
    got = consume(url, "st.age", "first")
    first = got[0][0]
    assert first > 0 and [o for o, _, _ in got] == list(range(first, 51))
    assert got[0][1].startswith(b"%03d" % first)


def test_management_api_and_list_queues_show_offsets_and_size(tmp_path: Path) -> None:
    b = MgmtBroker(tmp_path / "data").start()
    try:
        conn = connect(b.url)
        declare(conn.channel(), "st.mgmt")
        conn.close()
        publish_batch(b.url, "st.mgmt", [b"x" * 100 for _ in range(50)])
        publish(b.url, "st.mgmt", [b"last"])  # its confirm: every chunk before is committed
        status, info = b.api("GET", f"/api/queues/%2F/{urllib.parse.quote('st.mgmt')}")
        assert status == 200
        assert info["type"] == "stream" and info["messages"] == 51
        assert (info["first_offset"], info["last_offset"], info["committed_offset"]) == (0, 50,
                                                                                         51)
        assert info["segments"] == 1 and info["stream_bytes"] > 50 * 100
        from test_ctl import run_ctl  # the same helper the hare-ctl tests use

        done = run_ctl("list_queues", "name", "type", "first_offset", "last_offset",
                       "stream_bytes", url=b.http)
        assert done.returncode == 0, done.stderr
        row = next(line.split() for line in done.stdout.splitlines() if "st.mgmt" in line)
        assert row[:4] == ["st.mgmt", "stream", "0", "50"] and int(row[4]) > 5000
    finally:
        b.stop()


def test_a_policy_sets_retention_and_segment_size(tmp_path: Path) -> None:
    """max-length-bytes, max-age and stream-max-segment-size-bytes from a policy apply to a
    stream (the smaller of argument and policy), as RabbitMQ's streams take them."""
    b = MgmtBroker(tmp_path / "data").start()
    try:
        status, reply = b.api("PUT", "/api/policies/%2F/bad", {
            "pattern": "^st\\.", "definition": {"max-age": "soon"}})
        assert status == 400 and '<<"soon">> is not a valid max age' in reply["reason"]
        status, reply = b.api("PUT", "/api/policies/%2F/bad", {
            "pattern": "^st\\.", "definition": {"stream-max-segment-size-bytes": -1}})
        assert status == 400 and "-1 is not a valid segment size" in reply["reason"]
        assert b.api("PUT", "/api/policies/%2F/small", {
            "pattern": "^st\\.pol$", "apply-to": "queues",
            "definition": {"max-length-bytes": 8000, "stream-max-segment-size-bytes": 3000,
                           "max-age": "7D"}})[0] in (201, 204)
        conn = connect(b.url)
        declare(conn.channel(), "st.pol", **{"x-max-length-bytes": 1_000_000})
        conn.close()
        for k in range(10):
            publish_batch(b.url, "st.pol", [b"%03d" % (k * 20 + i) + b"." * 97
                                            for i in range(20)], wait=False)
        publish(b.url, "st.pol", [b"200"])
        info = b.get("/api/queues/%2F/st.pol")
        assert info["effective_policy_definition"]["max-age"] == "7D"
        assert info["segments"] > 1 and info["first_offset"] > 0  # 3000-byte segments, 8000
        assert info["stream_bytes"] <= 8000 + 3000 + 3000  # bytes kept: the policy's limits
    finally:
        b.stop()
