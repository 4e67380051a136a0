"""Channel-level rules as RabbitMQ applies them: exchange and queue declare/bind/delete,
consumers, acks, qos, flow, tx, confirms and permissions. Reply codes checked on the wire."""

from __future__ import annotations

import asyncio
import itertools
import time

import aio_pika
import pytest
from aio_pika import ExchangeType, Message
from pamqp import commands
from pamqp import header as pheader
from pamqp.body import ContentBody

from tests.amqp_raw import RawClient, roundtrip_ok

_names = itertools.count(1)


def uniq(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{time.monotonic_ns() % 1_000_000}"


# -- raw helpers --------------------------------------------------------------------------------
def client(port: int, channels: tuple[int, ...] = (1,), **kw) -> RawClient:
    c = RawClient(port)
    c.handshake(**kw)
    for n in channels:
        c.open_channel(n)
    return c


def call(c: RawClient, method: object, reply: type, ch: int = 1) -> object:
    c.send_method(ch, method)
    return c.expect(reply, ch)


def channel_error(c: RawClient, method: object, code: int, fragment: str = "",
                  ch: int = 1) -> commands.Channel.Close:
    """`method` closes the channel with `code`; the channel is closed (close-ok) and reopened."""
    c.send_method(ch, method)
    close = c.expect(commands.Channel.Close, ch)
    assert close.reply_code == code, (close.reply_code, close.reply_text)
    if fragment:
        assert fragment in close.reply_text, close.reply_text
    c.send_method(ch, commands.Channel.CloseOk())
    c.open_channel(ch)
    return close


def connection_error(c: RawClient, method: object, code: int, fragment: str = "",
                     ch: int = 1) -> commands.Connection.Close:
    c.send_method(ch, method)
    close = c.expect(commands.Connection.Close, 0)
    assert close.reply_code == code, (close.reply_code, close.reply_text)
    if fragment:
        assert fragment in close.reply_text, close.reply_text
    try:
        c.send_method(0, commands.Connection.CloseOk())
    except OSError:
        pass
    assert c.closed(3.0)
    c.close()
    return close


def publish(c: RawClient, exchange: str, key: str, body: bytes, ch: int = 1,
            mandatory: bool = False, props: commands.Basic.Properties | None = None) -> None:
    c.send_method(ch, commands.Basic.Publish(exchange=exchange, routing_key=key,
                                             mandatory=mandatory))
    c.send_content(ch, body, props)


def read_content(c: RawClient, ch: int = 1) -> tuple[pheader.ContentHeader, bytes]:
    hdr = c.expect(pheader.ContentHeader, ch)
    body = b""
    while len(body) < hdr.body_size:
        body += c.expect(ContentBody, ch).value
    return hdr, body


def get(c: RawClient, queue: str, no_ack: bool = True, ch: int = 1):
    """basic.get: (GetOk, body) or None when empty."""
    c.send_method(ch, commands.Basic.Get(queue=queue, no_ack=no_ack))
    while True:
        got = c.recv_frame()
        assert got is not None, "socket closed"
        if got[1].__class__.__name__ != "Heartbeat":
            break
    m = got[1]
    if isinstance(m, commands.Basic.GetEmpty):
        return None
    assert isinstance(m, commands.Basic.GetOk), m
    return m, read_content(c, ch)[1]


def deliveries(c: RawClient, n: int, ch: int = 1, timeout: float = 5.0):
    out = []
    for _ in range(n):
        d = c.expect(commands.Basic.Deliver, ch, timeout)
        out.append((d, read_content(c, ch)[1]))
    return out


def no_frame(c: RawClient, wait: float = 0.3) -> bool:
    try:
        got = c.recv_frame(wait)
    except TimeoutError:
        return True
    raise AssertionError(f"unexpected frame {got!r}")


def declare_queue(c: RawClient, name: str = "", ch: int = 1, **kw) -> str:
    ok = call(c, commands.Queue.Declare(queue=name, **kw), commands.Queue.DeclareOk, ch)
    return ok.queue


def count(c: RawClient, name: str, ch: int = 1) -> int:
    ok = call(c, commands.Queue.Declare(queue=name, passive=True), commands.Queue.DeclareOk, ch)
    return ok.message_count


# -- exchanges ----------------------------------------------------------------------------------
def test_exchange_declare_passive_missing_is_404(broker):
    c = client(broker.port)
    close = channel_error(c, commands.Exchange.Declare(exchange="no-such-x", passive=True), 404,
                          "no exchange 'no-such-x' in vhost '/'")
    assert (close.class_id, close.method_id) == (40, 10)
    c.close()


def test_exchange_redeclare_inequivalent_is_406(broker):
    c = client(broker.port)
    x = uniq("x-ineq")
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="direct", auto_delete=True),
         commands.Exchange.DeclareOk)
    # same arguments again: fine
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="direct", auto_delete=True),
         commands.Exchange.DeclareOk)
    channel_error(c, commands.Exchange.Declare(exchange=x, exchange_type="fanout",
                                               auto_delete=True),
                  406, "inequivalent arg 'type'")
    channel_error(c, commands.Exchange.Declare(exchange=x, exchange_type="direct",
                                               durable=True, auto_delete=True),
                  406, "inequivalent arg 'durable'")
    # passive ignores the other fields
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="topic", passive=True),
         commands.Exchange.DeclareOk)
    # of the arguments, RabbitMQ compares the alternate exchange only
    channel_error(c, commands.Exchange.Declare(exchange=x, exchange_type="direct",
                                               auto_delete=True,
                                               arguments={"alternate-exchange": "ae"}),
                  406, "inequivalent arg 'alternate-exchange'")
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="direct", auto_delete=True,
                                      arguments={"x-other": 1}), commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Delete(exchange=x), commands.Exchange.DeleteOk)
    c.close()


def test_exchange_reserved_prefix_is_403(broker):
    c = client(broker.port)
    channel_error(c, commands.Exchange.Declare(exchange="amq.mine", exchange_type="direct"),
                  403, "amq.")
    channel_error(c, commands.Exchange.Delete(exchange="amq.direct"), 403)
    # redeclaring a predeclared exchange as it is, passive or not, is allowed
    call(c, commands.Exchange.Declare(exchange="amq.direct", exchange_type="direct",
                                      durable=True), commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Declare(exchange="amq.topic", passive=True),
         commands.Exchange.DeclareOk)
    # the default exchange cannot be declared, deleted or bound, as RabbitMQ
    channel_error(c, commands.Exchange.Declare(exchange="", exchange_type="direct",
                                               durable=True),
                  403, "default exchange")
    channel_error(c, commands.Exchange.Delete(exchange=""), 403)
    channel_error(c, commands.Exchange.Bind(destination="amq.fanout", source=""), 403,
                  "default exchange")
    c.close()


def test_exchange_unknown_type_is_503_connection_error(broker):
    c = client(broker.port)
    connection_error(c, commands.Exchange.Declare(exchange=uniq("x-type"),
                                                  exchange_type="no-such-type"),
                     503, "unknown exchange type 'no-such-type'")
    # checked before anything else, even for an existing exchange
    c = client(broker.port)
    connection_error(c, commands.Exchange.Declare(exchange="amq.direct", exchange_type="nope"),
                     503, "unknown exchange type 'nope'")
    roundtrip_ok(broker.port)


def test_publish_to_internal_exchange_is_403(broker):
    c = client(broker.port)
    x = uniq("x-internal")
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="fanout", internal=True,
                                      auto_delete=True), commands.Exchange.DeclareOk)
    c.send_method(1, commands.Basic.Publish(exchange=x, routing_key=""))
    c.send_content(1, b"nope")
    close = c.expect(commands.Channel.Close, 1)
    assert close.reply_code == 403 and "internal" in close.reply_text
    assert (close.class_id, close.method_id) == (60, 40)
    c.close()


def test_internal_exchange_reached_through_exchange_binding(broker):
    c = client(broker.port)
    front, inner = uniq("x-front"), uniq("x-inner")
    call(c, commands.Exchange.Declare(exchange=front, exchange_type="fanout"),
         commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Declare(exchange=inner, exchange_type="fanout", internal=True),
         commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Bind(destination=inner, source=front), commands.Exchange.BindOk)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Queue.Bind(queue=q, exchange=inner), commands.Queue.BindOk)
    publish(c, front, "", b"via front")
    assert get(c, q)[1] == b"via front"
    for x in (front, inner):
        call(c, commands.Exchange.Delete(exchange=x), commands.Exchange.DeleteOk)
    c.close()


def test_alternate_exchange_takes_unroutable(broker):
    c = client(broker.port)
    x, ae = uniq("x-with-ae"), uniq("ae")
    call(c, commands.Exchange.Declare(exchange=ae, exchange_type="fanout"),
         commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="direct",
                                      arguments={"alternate-exchange": ae}),
         commands.Exchange.DeclareOk)
    routed = declare_queue(c, exclusive=True)
    stray = declare_queue(c, exclusive=True)
    call(c, commands.Queue.Bind(queue=routed, exchange=x, routing_key="k"), commands.Queue.BindOk)
    call(c, commands.Queue.Bind(queue=stray, exchange=ae), commands.Queue.BindOk)
    publish(c, x, "k", b"routed")
    publish(c, x, "other", b"unroutable", mandatory=True)  # the AE routes it: no basic.return
    assert get(c, routed)[1] == b"routed"
    got = get(c, stray)
    assert got[1] == b"unroutable"
    assert got[0].exchange == x and got[0].routing_key == "other"
    assert get(c, routed) is None and get(c, stray) is None
    for name in (x, ae):
        call(c, commands.Exchange.Delete(exchange=name), commands.Exchange.DeleteOk)
    c.close()


def test_alternate_exchange_that_routes_nowhere_returns_mandatory(broker):
    c = client(broker.port)
    empty_ae, x, x_missing = uniq("ae-empty"), uniq("x-ae-empty"), uniq("x-ae-missing")
    call(c, commands.Exchange.Declare(exchange=empty_ae, exchange_type="fanout"),
         commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="direct",
                                      arguments={"alternate-exchange": empty_ae}),
         commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Declare(exchange=x_missing, exchange_type="direct",
                                      arguments={"alternate-exchange": "no-such-ae"}),
         commands.Exchange.DeclareOk)
    for name in (x, x_missing):
        publish(c, name, "k", b"lost " + name.encode(), mandatory=True)
        ret = c.expect(commands.Basic.Return, 1)
        assert (ret.reply_code, ret.exchange, ret.routing_key) == (312, name, "k")
        assert read_content(c)[1] == b"lost " + name.encode()
    for name in (x, x_missing, empty_ae):
        call(c, commands.Exchange.Delete(exchange=name), commands.Exchange.DeleteOk)
    c.close()


@pytest.mark.parametrize("exchange", ["", "amq.direct"])
def test_cc_and_bcc_headers_add_routing_keys(broker, exchange):
    """Sender-selected distribution, as RabbitMQ: CC and BCC keys route like the routing key
    (through the default exchange too); BCC is removed from what is delivered."""
    c = client(broker.port)
    main, cc, bcc, other = (declare_queue(c, exclusive=True) for _ in range(4))
    if exchange:
        for q in (main, cc, bcc, other):
            call(c, commands.Queue.Bind(queue=q, exchange=exchange, routing_key=q),
                 commands.Queue.BindOk)
    publish(c, exchange, main, b"sent",
            props=commands.Basic.Properties(headers={"CC": [cc], "BCC": [bcc], "x": 1}))
    for q in (main, cc, bcc):
        c.send_method(1, commands.Basic.Get(queue=q, no_ack=True))
        ok = c.expect(commands.Basic.GetOk, 1)
        assert ok.routing_key == main
        hdr, body = read_content(c)
        assert body == b"sent"
        assert hdr.properties.headers == {"CC": [cc], "x": 1}
    assert get(c, other) is None
    c.close()


@pytest.mark.parametrize(
    ("expiration", "reason"),
    [("abc", "no_integer"), ("12s", "leftover_string"),
     ("-5", "value_negative")],
)
def test_publish_with_invalid_expiration_is_406(broker, expiration, reason):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key=q))
    c.send_content(1, b"x", commands.Basic.Properties(expiration=expiration))
    close = c.expect(commands.Channel.Close, 1)
    assert close.reply_code == 406
    assert f"invalid expiration '{expiration}'" in close.reply_text and reason in close.reply_text
    assert (close.class_id, close.method_id) == (60, 40)
    c.send_method(1, commands.Channel.CloseOk())
    c.open_channel(1)
    publish(c, "", q, b"ok", props=commands.Basic.Properties(expiration="60000"))
    assert get(c, q)[1] == b"ok"
    c.close()


def test_publish_with_someone_elses_user_id_is_406(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    publish(c, "", q, b"mine", props=commands.Basic.Properties(user_id="guest"))
    got = get(c, q)
    assert got[1] == b"mine"
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key=q))
    c.send_content(1, b"forged", commands.Basic.Properties(user_id="admin"))
    close = c.expect(commands.Channel.Close, 1)
    assert close.reply_code == 406
    assert "user_id property set to 'admin' but authenticated user was 'guest'" in (
        close.reply_text)
    c.close()


def test_exchange_delete_if_unused(broker):
    c = client(broker.port)
    x = uniq("x-del")
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="direct"),
         commands.Exchange.DeclareOk)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Queue.Bind(queue=q, exchange=x, routing_key="k"), commands.Queue.BindOk)
    channel_error(c, commands.Exchange.Delete(exchange=x, if_unused=True), 406, "in use")
    call(c, commands.Queue.Unbind(queue=q, exchange=x, routing_key="k"), commands.Queue.UnbindOk)
    call(c, commands.Exchange.Delete(exchange=x, if_unused=True), commands.Exchange.DeleteOk)
    channel_error(c, commands.Exchange.Declare(exchange=x, passive=True), 404)
    # deleting a missing exchange is fine, as RabbitMQ
    call(c, commands.Exchange.Delete(exchange=x), commands.Exchange.DeleteOk)
    c.close()


def test_exchange_to_exchange_bind_unbind(broker):
    c = client(broker.port)
    src, dst = uniq("e2e-src"), uniq("e2e-dst")
    call(c, commands.Exchange.Declare(exchange=src, exchange_type="topic"),
         commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Declare(exchange=dst, exchange_type="fanout"),
         commands.Exchange.DeclareOk)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Queue.Bind(queue=q, exchange=dst), commands.Queue.BindOk)
    call(c, commands.Exchange.Bind(destination=dst, source=src, routing_key="a.*"),
         commands.Exchange.BindOk)
    publish(c, src, "a.b", b"1")
    publish(c, src, "b.b", b"2")
    assert get(c, q)[1] == b"1"
    assert get(c, q) is None
    call(c, commands.Exchange.Unbind(destination=dst, source=src, routing_key="a.*"),
         commands.Exchange.UnbindOk)
    publish(c, src, "a.b", b"3")
    assert get(c, q) is None
    channel_error(c, commands.Exchange.Bind(destination=dst, source="no-such-src"), 404)
    for x in (src, dst):
        call(c, commands.Exchange.Delete(exchange=x), commands.Exchange.DeleteOk)
    c.close()


def test_auto_delete_exchange_goes_with_last_binding(broker):
    c = client(broker.port)
    x = uniq("x-ad")
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="direct", auto_delete=True),
         commands.Exchange.DeclareOk)
    q1 = declare_queue(c, exclusive=True)
    q2 = declare_queue(c, exclusive=True)
    call(c, commands.Queue.Bind(queue=q1, exchange=x, routing_key="a"), commands.Queue.BindOk)
    call(c, commands.Queue.Bind(queue=q2, exchange=x, routing_key="b"), commands.Queue.BindOk)
    call(c, commands.Queue.Unbind(queue=q1, exchange=x, routing_key="a"), commands.Queue.UnbindOk)
    call(c, commands.Exchange.Declare(exchange=x, passive=True), commands.Exchange.DeclareOk)
    # the last binding goes with its queue
    call(c, commands.Queue.Delete(queue=q2), commands.Queue.DeleteOk)
    channel_error(c, commands.Exchange.Declare(exchange=x, passive=True), 404)
    c.close()


def test_auto_delete_exchange_source_of_exchange_binding(broker):
    c = client(broker.port)
    src, dst = uniq("x-ad-src"), uniq("x-ad-dst")
    call(c, commands.Exchange.Declare(exchange=src, exchange_type="fanout", auto_delete=True),
         commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Declare(exchange=dst, exchange_type="fanout"),
         commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Bind(destination=dst, source=src), commands.Exchange.BindOk)
    call(c, commands.Exchange.Unbind(destination=dst, source=src), commands.Exchange.UnbindOk)
    channel_error(c, commands.Exchange.Declare(exchange=src, passive=True), 404)
    call(c, commands.Exchange.Declare(exchange=dst, passive=True), commands.Exchange.DeclareOk)
    call(c, commands.Exchange.Delete(exchange=dst), commands.Exchange.DeleteOk)
    c.close()


def test_auto_delete_cascades_when_destinations_go(broker):
    """As RabbitMQ: deleting a destination (exchange or queue) removes its bindings, and an
    auto-delete source left without bindings goes, all the way up a chain."""
    c = client(broker.port)
    top, mid, solo, dst = uniq("ad-top"), uniq("ad-mid"), uniq("ad-solo"), uniq("ad-dst")
    for name, auto in ((top, True), (mid, True), (solo, True), (dst, False)):
        call(c, commands.Exchange.Declare(exchange=name, exchange_type="fanout",
                                          auto_delete=auto), commands.Exchange.DeclareOk)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Exchange.Bind(destination=mid, source=top), commands.Exchange.BindOk)
    call(c, commands.Queue.Bind(queue=q, exchange=mid), commands.Queue.BindOk)
    call(c, commands.Exchange.Bind(destination=dst, source=solo), commands.Exchange.BindOk)
    # an exchange destination deleted
    call(c, commands.Exchange.Delete(exchange=dst), commands.Exchange.DeleteOk)
    channel_error(c, commands.Exchange.Declare(exchange=solo, passive=True), 404)
    # a queue at the end of a chain deleted: mid loses its last binding, then top its own
    call(c, commands.Exchange.Declare(exchange=top, passive=True), commands.Exchange.DeclareOk)
    call(c, commands.Queue.Delete(queue=q), commands.Queue.DeleteOk)
    channel_error(c, commands.Exchange.Declare(exchange=mid, passive=True), 404)
    channel_error(c, commands.Exchange.Declare(exchange=top, passive=True), 404)
    c.close()


# -- queues -------------------------------------------------------------------------------------
def test_queue_server_named_and_passive(broker):
    c = client(broker.port)
    name = declare_queue(c, exclusive=True)
    assert name.startswith("amq.gen-") and len(name) > len("amq.gen-")
    assert declare_queue(c, exclusive=True) != name
    ok = call(c, commands.Queue.Declare(queue=name, passive=True), commands.Queue.DeclareOk)
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    close = channel_error(c, commands.Queue.Declare(queue="no-such-q", passive=True), 404,
                          "no queue 'no-such-q' in vhost '/'")
    assert (close.class_id, close.method_id) == (50, 10)
    channel_error(c, commands.Queue.Declare(queue="amq.mine"), 403, "amq.")
    # an existing server-named queue may be redeclared by name (RabbitMQ checks the prefix
    # only when it creates a queue)
    ok = call(c, commands.Queue.Declare(queue=name, exclusive=True), commands.Queue.DeclareOk)
    assert ok.queue == name
    c.close()


def test_queue_redeclare_inequivalent_is_406(broker):
    c = client(broker.port)
    q = uniq("q-ineq")
    declare_queue(c, q, arguments={"x-message-ttl": 1000})
    declare_queue(c, q, arguments={"x-message-ttl": 1000})  # equivalent: fine
    channel_error(c, commands.Queue.Declare(queue=q, durable=True,
                                            arguments={"x-message-ttl": 1000}),
                  406, "inequivalent arg 'durable'")
    channel_error(c, commands.Queue.Declare(queue=q, arguments={"x-message-ttl": 2000}),
                  406, "inequivalent arg 'x-message-ttl'")
    channel_error(c, commands.Queue.Declare(queue=q), 406, "x-message-ttl")
    call(c, commands.Queue.Declare(queue=q, passive=True), commands.Queue.DeclareOk)
    call(c, commands.Queue.Delete(queue=q), commands.Queue.DeleteOk)
    c.close()


def test_exclusive_queue_is_locked_405(broker):
    owner = client(broker.port)
    other = client(broker.port)
    q = uniq("q-excl")
    declare_queue(owner, q, exclusive=True)
    for method in (
        commands.Queue.Declare(queue=q, passive=True),
        commands.Queue.Declare(queue=q, exclusive=True),
        commands.Basic.Consume(queue=q),
        commands.Basic.Get(queue=q),
        commands.Queue.Purge(queue=q),
        commands.Queue.Delete(queue=q),
        commands.Queue.Bind(queue=q, exchange="amq.direct", routing_key="k"),
    ):
        channel_error(other, method, 405, "exclusive")
    owner.close()
    # the owner's connection is gone: so is the queue
    deadline = time.monotonic() + 3
    while True:
        other.send_method(1, commands.Queue.Declare(queue=q, passive=True))
        got = other.expect(commands.Channel.Close, 1)
        other.send_method(1, commands.Channel.CloseOk())
        other.open_channel(1)
        if got.reply_code == 404:
            break
        assert got.reply_code == 405
        assert time.monotonic() < deadline, "exclusive queue outlived its connection"
        time.sleep(0.05)
    other.close()


def test_redeclare_with_other_exclusive_flag_is_405(broker):
    """RabbitMQ's strict check_exclusive_access on redeclare: 405 RESOURCE_LOCKED, even for
    the owner."""
    c = client(broker.port)
    excl, shared = uniq("q-was-excl"), uniq("q-was-shared")
    declare_queue(c, excl, exclusive=True)
    declare_queue(c, shared)
    channel_error(c, commands.Queue.Declare(queue=excl), 405,
                  "exclusive property value does not match")
    channel_error(c, commands.Queue.Declare(queue=shared, exclusive=True), 405,
                  "exclusive property value does not match")
    declare_queue(c, excl, exclusive=True)  # the same flags: fine
    call(c, commands.Queue.Delete(queue=shared), commands.Queue.DeleteOk)
    c.close()


def test_auto_delete_queue_goes_after_last_consumer_cancels(broker):
    c = client(broker.port)
    q = uniq("q-ad")
    declare_queue(c, q, auto_delete=True)
    # no consumer ever: it stays
    call(c, commands.Queue.Declare(queue=q, passive=True), commands.Queue.DeclareOk)
    call(c, commands.Basic.Consume(queue=q, consumer_tag="a"), commands.Basic.ConsumeOk)
    call(c, commands.Basic.Consume(queue=q, consumer_tag="b"), commands.Basic.ConsumeOk)
    call(c, commands.Basic.Cancel(consumer_tag="a"), commands.Basic.CancelOk)
    ok = call(c, commands.Queue.Declare(queue=q, passive=True), commands.Queue.DeclareOk)
    assert ok.consumer_count == 1
    call(c, commands.Basic.Cancel(consumer_tag="b"), commands.Basic.CancelOk)
    channel_error(c, commands.Queue.Declare(queue=q, passive=True), 404)
    c.close()


def test_empty_queue_name_means_last_declared(broker):
    """The spec's shortcut, as RabbitMQ: '' is the queue most recently declared on the channel
    (bind, unbind, purge, delete, consume, get); bind with '' and no key binds by its name."""
    c = client(broker.port, channels=(1, 2))
    channel_error(c, commands.Basic.Get(queue=""), 404, "no previously declared queue", ch=2)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Queue.Bind(queue="", exchange="amq.direct"), commands.Queue.BindOk)
    publish(c, "amq.direct", q, b"by its own name")
    assert get(c, "")[1] == b"by its own name"
    publish(c, "", q, b"purged")
    assert call(c, commands.Queue.Purge(queue=""), commands.Queue.PurgeOk).message_count == 1
    call(c, commands.Queue.Unbind(queue="", exchange="amq.direct"), commands.Queue.UnbindOk)
    publish(c, "amq.direct", q, b"unbound")
    assert get(c, q) is None
    call(c, commands.Basic.Consume(queue="", consumer_tag="last"), commands.Basic.ConsumeOk)
    call(c, commands.Basic.Cancel(consumer_tag="last"), commands.Basic.CancelOk)
    call(c, commands.Queue.Delete(queue=""), commands.Queue.DeleteOk)
    channel_error(c, commands.Queue.Declare(queue=q, passive=True), 404)
    c.close()


def test_consumers_go_with_their_connection(broker):
    """An abrupt disconnect cancels the connection's consumers: an auto-delete queue goes, an
    exclusive consumer's queue is free again, unacked deliveries come back redelivered."""
    owner = client(broker.port)
    other = client(broker.port)
    ad, shared = uniq("q-ad-conn"), uniq("q-excl-consumer")
    declare_queue(owner, ad, auto_delete=True)
    declare_queue(owner, shared)
    publish(owner, "", shared, b"held")
    call(owner, commands.Basic.Consume(queue=ad, consumer_tag="a"), commands.Basic.ConsumeOk)
    call(owner, commands.Basic.Consume(queue=shared, consumer_tag="x", exclusive=True),
         commands.Basic.ConsumeOk)
    deliveries(owner, 1)
    channel_error(other, commands.Basic.Consume(queue=shared), 403, "exclusive use")
    owner.close()
    deadline = time.monotonic() + 3
    while True:
        other.send_method(1, commands.Queue.Declare(queue=ad, passive=True))
        got = other.recv_frame()[1]
        if isinstance(got, commands.Channel.Close):
            assert got.reply_code == 404
            other.send_method(1, commands.Channel.CloseOk())
            other.open_channel(1)
            break
        assert time.monotonic() < deadline, "auto-delete queue outlived its consumer"
        time.sleep(0.02)
    call(other, commands.Basic.Consume(queue=shared, consumer_tag="y"), commands.Basic.ConsumeOk)
    ((d, body),) = deliveries(other, 1)
    assert body == b"held" and d.redelivered
    call(other, commands.Basic.Cancel(consumer_tag="y"), commands.Basic.CancelOk)
    call(other, commands.Queue.Delete(queue=shared), commands.Queue.DeleteOk)
    other.close()


def test_bind_unbind_purge(broker):
    c = client(broker.port)
    x = uniq("x-bind")
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="direct"),
         commands.Exchange.DeclareOk)
    q = declare_queue(c, exclusive=True)
    channel_error(c, commands.Queue.Bind(queue=q, exchange="no-such-x"), 404, "no-such-x")
    channel_error(c, commands.Queue.Bind(queue="no-such-q", exchange=x), 404, "no-such-q")
    channel_error(c, commands.Queue.Bind(queue=q, exchange="", routing_key=q), 403)
    call(c, commands.Queue.Bind(queue=q, exchange=x, routing_key="k1"), commands.Queue.BindOk)
    call(c, commands.Queue.Bind(queue=q, exchange=x, routing_key="k2"), commands.Queue.BindOk)
    call(c, commands.Queue.Bind(queue=q, exchange=x, routing_key="k2"), commands.Queue.BindOk)
    for key in ("k1", "k2", "k3"):
        publish(c, x, key, key.encode())
    assert count(c, q) == 2  # a duplicate binding does not double a message
    ok = call(c, commands.Queue.Purge(queue=q), commands.Queue.PurgeOk)
    assert ok.message_count == 2
    assert count(c, q) == 0
    call(c, commands.Queue.Unbind(queue=q, exchange=x, routing_key="k1"), commands.Queue.UnbindOk)
    # unbinding what is not bound is fine, as RabbitMQ
    call(c, commands.Queue.Unbind(queue=q, exchange=x, routing_key="nope"),
         commands.Queue.UnbindOk)
    publish(c, x, "k1", b"gone")
    publish(c, x, "k2", b"kept")
    assert get(c, q)[1] == b"kept"
    assert get(c, q) is None
    call(c, commands.Exchange.Delete(exchange=x), commands.Exchange.DeleteOk)
    c.close()


def test_queue_delete_if_unused_if_empty(broker):
    c = client(broker.port, channels=(1, 2))
    q = uniq("q-del")
    declare_queue(c, q)
    publish(c, "", q, b"one")
    call(c, commands.Basic.Consume(queue=q, consumer_tag="t", no_ack=False),
         commands.Basic.ConsumeOk, ch=2)
    deliveries(c, 1, ch=2)  # the message is now unacked: the queue has no ready message
    channel_error(c, commands.Queue.Delete(queue=q, if_unused=True), 406, "in use")
    call(c, commands.Basic.Cancel(consumer_tag="t"), commands.Basic.CancelOk, ch=2)
    c.send_method(2, commands.Basic.Recover(requeue=True))
    c.expect(commands.Basic.RecoverOk, 2)
    assert count(c, q) == 1
    channel_error(c, commands.Queue.Delete(queue=q, if_empty=True), 406, "not empty")
    ok = call(c, commands.Queue.Delete(queue=q, if_unused=True), commands.Queue.DeleteOk)
    assert ok.message_count == 1
    channel_error(c, commands.Queue.Declare(queue=q, passive=True), 404)
    c.close()


def test_nowait_methods_get_no_reply(broker):
    c = client(broker.port)
    x, q = uniq("x-nowait"), uniq("q-nowait")
    for method in (
        commands.Exchange.Declare(exchange=x, exchange_type="direct", nowait=True),
        commands.Queue.Declare(queue=q, exclusive=True, nowait=True),
        commands.Queue.Bind(queue=q, exchange=x, routing_key="k", nowait=True),
        commands.Basic.Consume(queue=q, consumer_tag="nw", no_ack=True, nowait=True),
        commands.Confirm.Select(nowait=True),
    ):
        c.send_method(1, method)
    publish(c, x, "k", b"via nowait bindings")
    seen = []  # nothing but the delivery and its confirm, in either order
    while len(seen) < 2:
        m = c.recv_frame()[1]
        if isinstance(m, commands.Basic.Deliver):
            assert m.consumer_tag == "nw" and read_content(c)[1] == b"via nowait bindings"
            seen.append("deliver")
        else:
            assert isinstance(m, commands.Basic.Ack) and m.delivery_tag == 1, m
            seen.append("ack")
    assert sorted(seen) == ["ack", "deliver"]
    for method in (
        commands.Basic.Cancel(consumer_tag="nw", nowait=True),
        commands.Queue.Purge(queue=q, nowait=True),
        commands.Queue.Delete(queue=q, nowait=True),
        commands.Exchange.Delete(exchange=x, nowait=True),
    ):
        c.send_method(1, method)
    call(c, commands.Basic.Qos(prefetch_count=1), commands.Basic.QosOk)  # the very next frame
    channel_error(c, commands.Exchange.Declare(exchange=x, passive=True), 404)
    c.close()


# -- consumers ----------------------------------------------------------------------------------
def test_consume_exclusive_when_others_consume_is_403(broker):
    c = client(broker.port, channels=(1, 2))
    q = declare_queue(c, uniq("q-xc"), auto_delete=False)
    call(c, commands.Basic.Consume(queue=q, consumer_tag="plain"), commands.Basic.ConsumeOk, 2)
    channel_error(c, commands.Basic.Consume(queue=q, exclusive=True), 403, "exclusive use")
    call(c, commands.Basic.Cancel(consumer_tag="plain"), commands.Basic.CancelOk, 2)
    call(c, commands.Basic.Consume(queue=q, consumer_tag="mine", exclusive=True),
         commands.Basic.ConsumeOk)
    channel_error(c, commands.Basic.Consume(queue=q), 403, "exclusive use", ch=2)
    c.send_method(2, commands.Queue.Delete(queue=q))
    # delete-ok, then the deleted queue's consumer is cancelled (consumer_cancel_notify)
    c.expect(commands.Queue.DeleteOk, 2)
    cancel = c.expect(commands.Basic.Cancel, 1)
    assert cancel.consumer_tag == "mine"
    c.close()


def test_duplicate_consumer_tag_is_530(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Basic.Consume(queue=q, consumer_tag="dup"), commands.Basic.ConsumeOk)
    connection_error(c, commands.Basic.Consume(queue=q, consumer_tag="dup"), 530,
                     "reuse consumer tag 'dup'")
    roundtrip_ok(broker.port)


def test_ack_unknown_and_double_ack_are_406(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    close = channel_error(c, commands.Basic.Ack(delivery_tag=42), 406, "unknown delivery tag 42")
    assert (close.class_id, close.method_id) == (60, 80)
    publish(c, "", q, b"x")
    ok, _ = get(c, q, no_ack=False)
    c.send_method(1, commands.Basic.Ack(delivery_tag=ok.delivery_tag))
    channel_error(c, commands.Basic.Ack(delivery_tag=ok.delivery_tag), 406,
                  f"unknown delivery tag {ok.delivery_tag}")
    # reject / nack of an unknown tag too
    channel_error(c, commands.Basic.Reject(delivery_tag=7), 406, "unknown delivery tag 7")
    channel_error(c, commands.Basic.Nack(delivery_tag=7), 406, "unknown delivery tag 7")
    # a no-ack get leaves nothing to ack
    publish(c, "", q, b"y")
    ok, _ = get(c, q, no_ack=True)
    channel_error(c, commands.Basic.Ack(delivery_tag=ok.delivery_tag), 406)
    c.close()


def test_ack_multiple(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    for i in range(5):
        publish(c, "", q, b"m%d" % i)
    tags = [get(c, q, no_ack=False)[0].delivery_tag for _ in range(5)]
    assert tags == sorted(tags)
    c.send_method(1, commands.Basic.Ack(delivery_tag=tags[2], multiple=True))
    # closing the channel requeues only the two left unacked
    call(c, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0),
         commands.Channel.CloseOk)
    c.open_channel(1)
    got = [get(c, q) for _ in range(3)]
    assert [g[1] for g in got[:2]] == [b"m3", b"m4"]
    assert all(g[0].redelivered for g in got[:2])
    assert got[2] is None
    c.close()


def test_ack_multiple_of_an_unknown_tag_is_406(broker):
    """RabbitMQ's collect_acks: multiple=true still needs the tag itself to be unacked."""
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    for i in range(3):
        publish(c, "", q, b"%d" % i)
    tags = [get(c, q, no_ack=False)[0].delivery_tag for _ in range(3)]
    c.send_method(1, commands.Basic.Ack(delivery_tag=tags[2]))
    channel_error(c, commands.Basic.Ack(delivery_tag=tags[2], multiple=True), 406,
                  f"unknown delivery tag {tags[2]}")
    channel_error(c, commands.Basic.Nack(delivery_tag=99, multiple=True), 406,
                  "unknown delivery tag 99")
    # the channel closed by the error requeued the two never acked
    assert count(c, q) == 2
    c.close()


def test_ack_multiple_zero_acks_everything(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    for i in range(3):
        publish(c, "", q, b"%d" % i)
    for _ in range(3):
        get(c, q, no_ack=False)
    c.send_method(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
    call(c, commands.Basic.Recover(requeue=True), commands.Basic.RecoverOk)
    assert get(c, q) is None
    c.close()


def test_nack_multiple_requeue(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    for i in range(4):
        publish(c, "", q, b"n%d" % i)
    call(c, commands.Basic.Qos(prefetch_count=10), commands.Basic.QosOk)
    call(c, commands.Basic.Consume(queue=q, consumer_tag="c"), commands.Basic.ConsumeOk)
    first = deliveries(c, 4)
    assert [b for _, b in first] == [b"n0", b"n1", b"n2", b"n3"]
    # nack the first three at once, requeued: they come back, in order, redelivered
    c.send_method(1, commands.Basic.Nack(delivery_tag=first[2][0].delivery_tag, multiple=True,
                                         requeue=True))
    again = deliveries(c, 3)
    assert [b for _, b in again] == [b"n0", b"n1", b"n2"]
    assert all(d.redelivered for d, _ in again)
    # nack without requeue drops (no DLX here)
    c.send_method(1, commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=False))
    call(c, commands.Basic.Cancel(consumer_tag="c"), commands.Basic.CancelOk)
    assert count(c, q) == 0
    c.close()


def test_basic_recover_requeues(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    publish(c, "", q, b"r0")
    publish(c, "", q, b"r1")
    call(c, commands.Basic.Consume(queue=q, consumer_tag="c"), commands.Basic.ConsumeOk)
    first = deliveries(c, 2)
    assert not any(d.redelivered for d, _ in first)
    c.send_method(1, commands.Basic.Ack(delivery_tag=first[0][0].delivery_tag))
    c.send_method(1, commands.Basic.Recover(requeue=True))
    # recover-ok and the redelivery may come in either order; collect both
    seen_ok = False
    redelivered = []
    while not (seen_ok and redelivered):
        got = c.recv_frame()[1]
        if isinstance(got, commands.Basic.RecoverOk):
            seen_ok = True
        elif isinstance(got, commands.Basic.Deliver):
            redelivered.append((got, read_content(c)[1]))
    assert [b for _, b in redelivered] == [b"r1"]
    assert redelivered[0][0].redelivered
    assert redelivered[0][0].delivery_tag > first[1][0].delivery_tag
    c.close()


def consume_both(c: RawClient, qa: str, qb: str, n: int) -> list:
    """Consumers A on qa and B on qb; the n deliveries that come (and nothing more)."""
    c.send_method(1, commands.Basic.Consume(queue=qa, consumer_tag="A"))
    c.send_method(1, commands.Basic.Consume(queue=qb, consumer_tag="B"))
    oks, got = [], []
    while len(oks) < 2 or len(got) < n:
        m = c.recv_frame()[1]
        if isinstance(m, commands.Basic.ConsumeOk):
            oks.append(m.consumer_tag)
        else:
            assert isinstance(m, commands.Basic.Deliver), m
            got.append((m, read_content(c)[1]))
    assert oks == ["A", "B"]
    no_frame(c)
    return got


def test_basic_recover_without_requeue_is_540(broker):
    """RabbitMQ does not implement redelivery to the original consumer."""
    c = client(broker.port)
    connection_error(c, commands.Basic.Recover(requeue=False), 540, "requeue=false")
    c = client(broker.port)
    connection_error(c, commands.Basic.RecoverAsync(requeue=False), 540, "requeue=false")


def test_qos_per_consumer_and_global(broker):
    c = client(broker.port)
    qa = declare_queue(c, exclusive=True)
    qb = declare_queue(c, exclusive=True)
    for i in range(10):
        publish(c, "", qa, b"a%d" % i)
        publish(c, "", qb, b"b%d" % i)
    call(c, commands.Basic.Qos(prefetch_count=3, global_=True), commands.Basic.QosOk)
    call(c, commands.Basic.Qos(prefetch_count=2, global_=False), commands.Basic.QosOk)
    got = consume_both(c, qa, qb, 3)
    per = {"A": 0, "B": 0}
    for d, _ in got:
        per[d.consumer_tag] += 1
    # each consumer holds at most 2 (per consumer), the channel at most 3 (global)
    assert sorted(per.values()) == [1, 2]
    # one ack frees one slot of the channel
    c.send_method(1, commands.Basic.Ack(delivery_tag=got[0][0].delivery_tag))
    more = deliveries(c, 1)
    no_frame(c)
    assert more[0][0].consumer_tag == got[0][0].consumer_tag
    c.close()


def test_qos_per_consumer_only(broker):
    c = client(broker.port)
    qa = declare_queue(c, exclusive=True)
    qb = declare_queue(c, exclusive=True)
    for i in range(5):
        publish(c, "", qa, b"a%d" % i)
        publish(c, "", qb, b"b%d" % i)
    call(c, commands.Basic.Qos(prefetch_count=2), commands.Basic.QosOk)
    got = consume_both(c, qa, qb, 4)
    assert sorted(d.consumer_tag for d, _ in got) == ["A", "A", "B", "B"]
    c.close()


def test_channel_flow_stops_and_resumes_deliveries(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Basic.Consume(queue=q, consumer_tag="c", no_ack=True),
         commands.Basic.ConsumeOk)
    ok = call(c, commands.Channel.Flow(active=False), commands.Channel.FlowOk)
    assert ok.active is False
    for i in range(3):
        publish(c, "", q, b"f%d" % i)
    no_frame(c, 0.4)
    ok = call(c, commands.Channel.Flow(active=True), commands.Channel.FlowOk)
    assert ok.active is True
    assert [b for _, b in deliveries(c, 3)] == [b"f0", b"f1", b"f2"]
    c.close()


# -- tx and confirms ----------------------------------------------------------------------------
def test_confirm_and_tx_exclude_each_other(broker):
    c = client(broker.port, channels=(1, 2))
    call(c, commands.Confirm.Select(), commands.Confirm.SelectOk)
    channel_error(c, commands.Tx.Select(), 406, "confirm")
    call(c, commands.Tx.Select(), commands.Tx.SelectOk, 2)
    channel_error(c, commands.Confirm.Select(), 406, "tx", ch=2)
    c.close()


def test_tx_commit_and_rollback_without_select_are_406(broker):
    c = client(broker.port)
    channel_error(c, commands.Tx.Commit(), 406, "not transactional")
    channel_error(c, commands.Tx.Rollback(), 406, "not transactional")
    c.close()


def test_tx_acks_take_effect_at_commit(broker):
    c = client(broker.port, channels=(1, 2))
    q = declare_queue(c, uniq("q-txack"))
    for i in range(3):
        publish(c, "", q, b"t%d" % i)  # same channel as the gets: ordered
    tags = [get(c, q, no_ack=False)[0].delivery_tag for _ in range(3)]
    call(c, commands.Tx.Select(), commands.Tx.SelectOk)
    c.send_method(1, commands.Basic.Ack(delivery_tag=tags[0]))
    c.send_method(1, commands.Basic.Reject(delivery_tag=tags[1], requeue=True))
    # nothing happened yet: the reject did not requeue
    assert count(c, q, ch=2) == 0
    call(c, commands.Tx.Rollback(), commands.Tx.RollbackOk)
    assert count(c, q, ch=2) == 0
    # after the rollback the three are still unacked: ack the first for real this time
    c.send_method(1, commands.Basic.Ack(delivery_tag=tags[0]))
    c.send_method(1, commands.Basic.Reject(delivery_tag=tags[1], requeue=True))
    assert count(c, q, ch=2) == 0
    call(c, commands.Tx.Commit(), commands.Tx.CommitOk)
    assert count(c, q, ch=2) == 1  # t1 requeued by the committed reject
    # closing the channel requeues t2, never t0
    call(c, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0),
         commands.Channel.CloseOk)
    bodies = sorted(get(c, q, ch=2)[1] for _ in range(2))
    assert bodies == [b"t1", b"t2"]
    assert get(c, q, ch=2) is None
    call(c, commands.Queue.Delete(queue=q), commands.Queue.DeleteOk, 2)
    c.close()


def test_tx_mandatory_return_comes_at_commit_before_commit_ok(broker):
    c = client(broker.port)
    call(c, commands.Tx.Select(), commands.Tx.SelectOk)
    publish(c, "", "no-such-queue-tx", b"unroutable in tx", mandatory=True)
    no_frame(c, 0.2)  # nothing before the commit
    c.send_method(1, commands.Tx.Commit())
    ret = c.expect(commands.Basic.Return, 1)
    assert ret.reply_code == 312 and read_content(c)[1] == b"unroutable in tx"
    c.expect(commands.Tx.CommitOk, 1)
    c.close()


def test_tx_publishes_only_at_commit(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Tx.Select(), commands.Tx.SelectOk)
    publish(c, "", q, b"p1")
    publish(c, "", q, b"p2")
    assert count(c, q) == 0
    call(c, commands.Tx.Commit(), commands.Tx.CommitOk)
    assert count(c, q) == 2
    publish(c, "", q, b"p3")
    call(c, commands.Tx.Rollback(), commands.Tx.RollbackOk)
    call(c, commands.Tx.Commit(), commands.Tx.CommitOk)
    assert [get(c, q)[1] for _ in range(2)] == [b"p1", b"p2"]
    assert get(c, q) is None
    c.close()


class Confirms:
    """The client's view of publisher confirms: `multiple` covers every still-outstanding seq
    up to its tag (RabbitMQ sends a multiple ack below its cut-off and single acks above it)."""

    def __init__(self, n: int) -> None:
        self.outstanding = set(range(1, n + 1))
        self.acked: list[int] = []
        self.nacked: list[int] = []

    def take(self, m: commands.Basic.Ack | commands.Basic.Nack) -> list[int]:
        if m.multiple:
            seqs = sorted(s for s in self.outstanding if s <= m.delivery_tag)
            assert seqs, f"multiple {m!r} confirms nothing new"
        else:
            assert m.delivery_tag in self.outstanding, f"seq {m.delivery_tag} confirmed twice"
            seqs = [m.delivery_tag]
        self.outstanding.difference_update(seqs)
        (self.acked if isinstance(m, commands.Basic.Ack) else self.nacked).extend(seqs)
        return seqs


def test_confirms_cover_every_seq_exactly_once(broker):
    c = client(broker.port)
    q1 = declare_queue(c, exclusive=True)
    q2 = declare_queue(c, exclusive=True)
    x = uniq("x-conf")
    call(c, commands.Exchange.Declare(exchange=x, exchange_type="fanout"),
         commands.Exchange.DeclareOk)
    call(c, commands.Queue.Bind(queue=q1, exchange=x), commands.Queue.BindOk)
    call(c, commands.Queue.Bind(queue=q2, exchange=x), commands.Queue.BindOk)
    call(c, commands.Confirm.Select(), commands.Confirm.SelectOk)
    n = 500
    for i in range(n):
        # routed to one queue, to two queues (both must take it) and to none
        if i % 3 == 0:
            publish(c, "", q1, b"%d" % i)
        elif i % 3 == 1:
            publish(c, x, "", b"%d" % i)
        else:
            publish(c, "", "no-such-queue", b"%d" % i)
    confirms = Confirms(n)
    frames = 0
    while confirms.outstanding:
        confirms.take(c.expect(commands.Basic.Ack, 1))
        frames += 1
    no_frame(c)
    assert sorted(confirms.acked) == list(range(1, n + 1)) and not confirms.nacked
    assert count(c, q1) == 167 + 167 and count(c, q2) == 167  # n = 500
    call(c, commands.Exchange.Delete(exchange=x), commands.Exchange.DeleteOk)
    c.close()


def test_mandatory_return_comes_before_ack(broker):
    c = client(broker.port)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Confirm.Select(), commands.Confirm.SelectOk)
    publish(c, "", q, b"routed-1")
    publish(c, "", "nowhere", b"lost", mandatory=True)
    publish(c, "", q, b"routed-3")
    publish(c, "amq.direct", "nowhere", b"lost-too", mandatory=True)
    events: list[tuple[str, object]] = []
    confirms = Confirms(4)
    while confirms.outstanding:
        got = c.recv_frame()
        assert got is not None
        m = got[1]
        if isinstance(m, commands.Basic.Return):
            _, body = read_content(c)
            assert m.reply_code == 312 and m.reply_text == "NO_ROUTE"
            events.append(("return", body))
        elif isinstance(m, commands.Basic.Ack):
            events.extend(("ack", s) for s in confirms.take(m))
        else:
            raise AssertionError(f"unexpected {m!r}")
    no_frame(c)
    assert sorted(confirms.acked) == [1, 2, 3, 4]
    assert events.index(("return", b"lost")) < events.index(("ack", 2))
    assert events.index(("return", b"lost-too")) < events.index(("ack", 4))
    c.close()


# -- permissions --------------------------------------------------------------------------------
@pytest.fixture
def perms_broker(broker_factory, tmp_path):
    config = tmp_path / "hare.toml"
    config.write_text(
        '[[users]]\nname = "app"\npassword = "pw"\n\n'
        '[[permissions]]\nuser = "app"\nvhost = "/"\nconfigure = "^(app|amq\\\\.gen).*"\n'
        'write = "^(app|amq\\\\.gen).*"\nread = "^(app|amq\\\\.gen).*"\n\n'
        '[[users]]\nname = "narrow"\npassword = "pw"\n\n'
        '[[permissions]]\nuser = "narrow"\nvhost = "/"\nconfigure = "^app"\nwrite = ".*"\n'
        'read = ".*"\n'
    )
    return broker_factory(args=["--config", str(config)]).start()


def test_publish_with_write_denied_is_403(perms_broker):
    admin = client(perms_broker.port)
    call(admin, commands.Exchange.Declare(exchange="locked-x", exchange_type="fanout"),
         commands.Exchange.DeclareOk)
    c = client(perms_broker.port, user="app", password="pw")
    call(c, commands.Exchange.Declare(exchange="app-x", exchange_type="fanout"),
         commands.Exchange.DeclareOk)
    q = declare_queue(c, exclusive=True)
    call(c, commands.Queue.Bind(queue=q, exchange="app-x"), commands.Queue.BindOk)
    publish(c, "app-x", "", b"allowed")
    assert get(c, q)[1] == b"allowed"
    c.send_method(1, commands.Basic.Publish(exchange="locked-x", routing_key=""))
    c.send_content(1, b"denied")
    close = c.expect(commands.Channel.Close, 1)
    assert close.reply_code == 403
    assert "access to exchange 'locked-x' in vhost '/' refused for user 'app'" in close.reply_text
    assert (close.class_id, close.method_id) == (60, 40)
    c.send_method(1, commands.Channel.CloseOk())
    c.open_channel(1)
    # the default exchange is 'amq.default' for permissions: not writable for app
    channel_error(c, commands.Exchange.Declare(exchange="other-x", exchange_type="direct"), 403,
                  "access to exchange 'other-x'")
    channel_error(c, commands.Queue.Declare(queue="other-q"), 403, "access to queue 'other-q'")
    # binding needs read on the exchange; getting needs read on the queue
    channel_error(c, commands.Queue.Bind(queue=q, exchange="locked-x"), 403,
                  "access to exchange 'locked-x'")
    declare_queue(admin, "locked-q")
    channel_error(c, commands.Basic.Get(queue="locked-q"), 403, "access to queue 'locked-q'")
    channel_error(c, commands.Basic.Consume(queue="locked-q"), 403, "access to queue 'locked-q'")
    channel_error(c, commands.Queue.Delete(queue="locked-q"), 403, "access to queue 'locked-q'")
    c.close()
    admin.close()


def test_server_named_queue_needs_configure_permission_on_its_name(perms_broker):
    """RabbitMQ checks the generated amq.gen-* name against the configure pattern."""
    narrow = client(perms_broker.port, user="narrow", password="pw")
    channel_error(narrow, commands.Queue.Declare(queue="", exclusive=True), 403,
                  "access to queue 'amq.gen-")
    # the pattern is searched, not matched whole, as RabbitMQ: "^app" allows "app-q"
    assert declare_queue(narrow, "app-q", exclusive=True) == "app-q"
    channel_error(narrow, commands.Queue.Declare(queue="my-app-q"), 403,
                  "access to queue 'my-app-q'")
    narrow.close()
    app = client(perms_broker.port, user="app", password="pw")
    assert declare_queue(app, exclusive=True).startswith("amq.gen-")
    app.close()


# -- aio-pika ----------------------------------------------------------------------------------
async def test_aio_pika_alternate_exchange_and_e2e(broker):
    conn = await aio_pika.connect(broker.url)
    try:
        ch = await conn.channel()
        ae = await ch.declare_exchange(uniq("ae-pika"), ExchangeType.FANOUT, auto_delete=True)
        main = await ch.declare_exchange(uniq("main-pika"), ExchangeType.DIRECT,
                                         auto_delete=True,
                                         arguments={"alternate-exchange": ae.name})
        leaf = await ch.declare_exchange(uniq("leaf-pika"), ExchangeType.FANOUT,
                                         auto_delete=True)
        q_main = await ch.declare_queue("", exclusive=True)
        q_ae = await ch.declare_queue("", exclusive=True)
        q_leaf = await ch.declare_queue("", exclusive=True)
        await q_main.bind(main, "k")
        await q_ae.bind(ae)
        await q_leaf.bind(leaf)
        await leaf.bind(main, "e2e")
        await main.publish(Message(b"k"), routing_key="k")
        await main.publish(Message(b"e2e"), routing_key="e2e")
        await main.publish(Message(b"else"), routing_key="else")

        async def one(q):
            for _ in range(100):
                m = await q.get(no_ack=True, fail=False)
                if m is not None:
                    return m.body
                await asyncio.sleep(0.02)
            return None

        assert await one(q_main) == b"k"
        assert await one(q_leaf) == b"e2e"
        assert await one(q_ae) == b"else"
        assert await q_main.get(no_ack=True, fail=False) is None
        assert await q_ae.get(no_ack=True, fail=False) is None
        await leaf.unbind(main, "e2e")
        await main.publish(Message(b"e2e-2"), routing_key="e2e")
        assert await one(q_ae) == b"e2e-2"  # no binding left for it: the AE takes it
    finally:
        await conn.close()
