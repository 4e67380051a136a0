"""The conformance rows: frames a client sends, grouped by what they probe. The answers are not
here: they are recorded from RabbitMQ into rabbitmq-3.10.8.json by record.py, and
test_conformance.py checks that Hare gives the same ones.

A row that Hare answers differently on purpose says so in `differs` (one line: why) and gives
Hare's own answer in `hare`; docs/CONFORMANCE.md lists them. A row that Hare is known to fail
and that someone is fixing carries `xfail` with the issue it belongs to.

Names starting "cf." are made unique per row by the runner (wire.localize)."""

from __future__ import annotations

from pamqp import commands as c

from tests.conformance.wire import (
    Outcome,
    Row,
    body,
    frame,
    header,
    heartbeat,
    m,
    publish,
)

__all__ = ["ROWS"]

Ch, Cn, Ex, Qu, Ba, Tx, Cf = (c.Channel, c.Connection, c.Exchange, c.Queue, c.Basic, c.Tx,
                              c.Confirm)

ROWS: list[Row] = []

# Chosen differences shared by several rows (docs/CONFORMANCE.md lists every row).
SILENT_HANDSHAKE = ("RabbitMQ says nothing about a refused handshake and resets the socket 3 s "
                    "later; Hare answers connection.close with the reason first")
SILENT_TUNE = ("RabbitMQ resets the socket 3 s after an unacceptable tune-ok without a close; "
               "Hare answers 530 NOT_ALLOWED first")
CRASH = ("RabbitMQ's reader crashes on an unknown class or method and resets the socket; Hare "
         "answers 540 NOT_IMPLEMENTED")


def closed_with(code_and_ids: str) -> Outcome:
    """Hare's answer to a refused handshake: the close and the end of the socket."""
    return Outcome([[f"0 connection.close {code_and_ids}", "EOF"]], False)


def row(name: str, *steps: list, **options) -> None:  # type: ignore[type-arg]
    ROWS.append(Row(name, [list(s) for s in steps], **options))


def close(ch: int, code: int = 200) -> c.Channel.Close:
    return Ch.Close(reply_code=code, reply_text="bye", class_id=0, method_id=0)


def cclose() -> c.Connection.Close:
    return Cn.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)


def declare_q(name: str = "cf.q", **kw) -> c.Queue.Declare:  # type: ignore[no-untyped-def]
    return Qu.Declare(queue=name, **kw)


def args_q(arguments: dict, name: str = "cf.q", **kw) -> c.Queue.Declare:  # type: ignore[type-arg]
    return Qu.Declare(queue=name, arguments=arguments, **kw)


FAIL_404 = m(1, Qu.Declare(queue="cf.missing", passive=True))  # puts channel 1 in closing
REOPEN = [m(1, Ch.CloseOk()), m(1, Ch.Open()), m(1, Ba.Qos(prefetch_count=1))]
QOS = m(1, Ba.Qos(prefetch_count=1))
ALIVE = [m(1, Ex.Declare(exchange="amq.direct", passive=True))]


# -- every client method, in states where it is wrong ---------------------------------------
def samples(ch: int) -> dict[str, list]:  # type: ignore[type-arg]
    """One well-formed instance of each method a client may send on a channel."""
    return {
        "channel.flow": [m(ch, Ch.Flow(active=True))],
        "exchange.declare": [m(ch, Ex.Declare(exchange="cf.x", exchange_type="direct"))],
        "exchange.delete": [m(ch, Ex.Delete(exchange="cf.x"))],
        "exchange.bind": [m(ch, Ex.Bind(destination="cf.x", source="amq.direct"))],
        "exchange.unbind": [m(ch, Ex.Unbind(destination="cf.x", source="amq.direct"))],
        "queue.declare": [m(ch, declare_q())],
        "queue.bind": [m(ch, Qu.Bind(queue="cf.q", exchange="amq.direct"))],
        "queue.purge": [m(ch, Qu.Purge(queue="cf.q"))],
        "queue.delete": [m(ch, Qu.Delete(queue="cf.q"))],
        "queue.unbind": [m(ch, Qu.Unbind(queue="cf.q", exchange="amq.direct"))],
        "basic.qos": [m(ch, Ba.Qos(prefetch_count=1))],
        "basic.consume": [m(ch, Ba.Consume(queue="cf.q", consumer_tag="t"))],
        "basic.cancel": [m(ch, Ba.Cancel(consumer_tag="t"))],
        "basic.publish": publish(ch, "", "cf.q"),
        "basic.get": [m(ch, Ba.Get(queue="cf.q"))],
        "basic.ack": [m(ch, Ba.Ack(delivery_tag=1))],
        "basic.reject": [m(ch, Ba.Reject(delivery_tag=1))],
        "basic.recover-async": [m(ch, Ba.RecoverAsync(requeue=True))],
        "basic.recover": [m(ch, Ba.Recover(requeue=True))],
        "basic.nack": [m(ch, Ba.Nack(delivery_tag=1))],
        "tx.select": [m(ch, Tx.Select())],
        "tx.commit": [m(ch, Tx.Commit())],
        "tx.rollback": [m(ch, Tx.Rollback())],
        "confirm.select": [m(ch, Cf.Select())],
    }


for _name, _frames in samples(5).items():
    row(f"state/unopened-channel/{_name}", _frames, channels=())
for _name, _frames in samples(0).items():
    row(f"state/channel-0/{_name}", _frames)
for _name, _frames in samples(1).items():
    # channel 1 has sent channel.close (404): everything but close/close-ok is dropped
    row(f"state/closing-channel/{_name}", [FAIL_404], [*_frames], REOPEN)
for _name in ("channel.open", "queue.declare", "basic.publish"):
    _frames = [m(1, Ch.Open())] if _name == "channel.open" else samples(1)[_name]
    row(f"state/before-connection-open/{_name}", _frames, stage="tuned", quiet=4.0)

row("state/closing-channel/channel.close", [FAIL_404], [m(1, close(1))], REOPEN)
row("state/closing-channel/channel.open", [FAIL_404], [m(1, Ch.Open())])
row("state/closing-channel/content-body-alone", [FAIL_404], [body(1, b"abc")])
row("state/closing-channel/publish-then-close-ok", [FAIL_404],
    [*publish(1, "", "cf.q"), *REOPEN])
row("state/open-channel/channel.close-ok", [m(1, Ch.CloseOk())])
row("state/open-channel/channel.open", [m(1, Ch.Open())])
row("state/unopened-channel/channel.close", [m(5, close(5))], channels=())
row("state/unopened-channel/channel.close-ok", [m(5, Ch.CloseOk())], channels=())
row("state/unopened-channel/content-header", [header(5, 3)], channels=())
row("state/closed-channel/method-after-close-ok", [m(1, close(1))], [QOS])

# server-to-client methods sent by a client
row("state/client-sends/basic.deliver",
    [m(1, Ba.Deliver(consumer_tag="t", delivery_tag=1, exchange="", routing_key="q"))],
    differs="a client's basic.deliver is 503 like any method only a server sends; RabbitMQ "
            "takes it for a content-bearing method and waits for its content header",
    hare=Outcome([["0 connection.close 503 60.60"], ["EOF"]], False))
row("state/client-sends/queue.declare-ok",
    [m(1, Qu.DeclareOk(queue="q", message_count=0, consumer_count=0))])
row("state/client-sends/channel.open-ok", [m(1, Ch.OpenOk())])
row("state/client-sends/connection.tune", [m(0, Cn.Tune(channel_max=1, frame_max=4096))])
row("state/client-sends/basic.get-empty", [m(1, Ba.GetEmpty())])

# twice
row("twice/channel.open", [m(1, Ch.Open())])
row("twice/connection.open", [m(0, Cn.Open(virtual_host="/"))])
row("twice/connection.start-ok", [m(0, Cn.StartOk(mechanism="PLAIN",
                                                  response="\0guest\0guest"))])
row("twice/connection.tune-ok", [m(0, Cn.TuneOk(channel_max=10, frame_max=131072))])
row("twice/confirm.select", [m(1, Cf.Select()), m(1, Cf.Select())])
row("twice/tx.select", [m(1, Tx.Select()), m(1, Tx.Select())])
row("twice/basic.qos", [m(1, Ba.Qos(prefetch_count=5)), m(1, Ba.Qos(prefetch_count=0))])
row("twice/channel.close", [m(1, close(1)), m(1, close(1))])
row("twice/connection.close", [m(0, cclose()), m(0, cclose())], [m(0, cclose())], probe=0)

# handshake out of order
row("handshake/open-before-start-ok", [m(0, Cn.Open(virtual_host="/"))], stage="started",
    quiet=4.0, differs=SILENT_HANDSHAKE, hare=closed_with("504 10.40"))
row("handshake/tune-ok-before-start-ok", [m(0, Cn.TuneOk(channel_max=0, frame_max=131072))],
    stage="started", quiet=4.0, differs=SILENT_HANDSHAKE, hare=closed_with("504 10.31"))
row("handshake/channel-open-before-start-ok", [m(1, Ch.Open())], stage="started", quiet=4.0,
    differs=SILENT_HANDSHAKE, hare=closed_with("505 0.0"))
row("handshake/close-before-open", [m(0, cclose())], stage="tuned", quiet=4.0, probe=0)
row("handshake/vhost-missing", [m(0, Cn.Open(virtual_host="cf-no-such-vhost"))],
    stage="tuned", quiet=4.0)
CAPS = {"capabilities": {"authentication_failure_close": True}}
row("handshake/unknown-mechanism",
    [m(0, Cn.StartOk(client_properties=CAPS, mechanism="CF-MADE-UP", response="",
                     locale="en_US"))],
    stage="started", quiet=4.0, differs=SILENT_HANDSHAKE, hare=closed_with("403 0.0"))
row("handshake/bad-password",
    [m(0, Cn.StartOk(client_properties=CAPS, mechanism="PLAIN", response="\0guest\0wrong",
                     locale="en_US"))],
    stage="started", quiet=4.0)
row("handshake/bad-password-without-capability",
    [m(0, Cn.StartOk(mechanism="PLAIN", response="\0guest\0wrong", locale="en_US"))],
    stage="started", quiet=4.0,
    differs="a refused login gets 403 ACCESS_REFUSED whether or not the client announced "
            "authentication_failure_close; RabbitMQ resets the socket of a client that did not",
    hare=closed_with("403 0.0"))

# -- crossing closes ------------------------------------------------------------------------
row("crossing/publish-404-and-close-in-one-write",
    [*publish(1, "cf.no-such-exchange"), m(1, close(1))], REOPEN)
row("crossing/publish-404-then-close",
    publish(1, "cf.no-such-exchange"), [m(1, close(1))], REOPEN)
row("crossing/error-then-close-then-close-ok",
    [FAIL_404], [m(1, close(1))], REOPEN)
row("crossing/error-and-close-and-close-ok-in-one-write",
    [FAIL_404, m(1, close(1)), m(1, Ch.CloseOk())], [m(1, Ch.Open()), QOS])
row("crossing/frames-between-error-and-close",
    [*publish(1, "cf.no-such-exchange"), QOS, *publish(1, "", "cf.q"), QOS, m(1, close(1)), QOS],
    REOPEN)
row("crossing/other-channel-lives-on",
    [*publish(1, "cf.no-such-exchange"), m(1, close(1))],
    [m(1, Ch.CloseOk()), m(2, Ba.Qos(prefetch_count=3))], channels=(1, 2))
row("crossing/close-ok-twice",
    [FAIL_404], [m(1, Ch.CloseOk()), m(1, Ch.CloseOk())])
row("crossing/connection-close-after-server-close",
    [frame(3, 7, b"x")], [m(0, cclose())])
row("crossing/connection-close-in-same-write",
    [frame(3, 7, b"x"), m(0, cclose())])
row("crossing/connection-close-then-frames",
    [frame(3, 7, b"x")], [QOS, m(1, close(1)), m(0, cclose())])
row("crossing/client-close-then-frames-then-close-ok",
    [m(0, cclose())], [QOS, *publish(1, "", "cf.q"), m(0, Cn.CloseOk())], probe=0)
row("crossing/client-close-with-channel-error-pending",
    [FAIL_404, m(0, cclose())], probe=0)
row("crossing/channel-close-while-connection-closes",
    [m(0, cclose()), m(1, close(1))], probe=0)
row("crossing/channel-close-then-connection-close-in-one-write",
    [m(1, close(1)), m(0, cclose())], probe=0,
    differs="a channel.close sent just before connection.close gets its close-ok first; "
            "RabbitMQ's reader, closing already, drops it",
    hare=Outcome([["1 channel.close-ok", "0 connection.close-ok"]], None))

# -- content framing ------------------------------------------------------------------------
row("content/header-without-publish", [header(1, 3)])
row("content/body-without-header", [body(1, b"abc")])
row("content/body-after-publish-without-header",
    [m(1, Ba.Publish(exchange="", routing_key="cf.q")), body(1, b"abc")])
row("content/method-while-expecting-header",
    [m(1, Ba.Publish(exchange="", routing_key="cf.q")), QOS])
row("content/method-while-expecting-body",
    [m(1, Ba.Publish(exchange="", routing_key="cf.q")), header(1, 10), body(1, b"12345"), QOS])
row("content/body-longer-than-header",
    [m(1, declare_q(exclusive=True)), m(1, Ba.Publish(exchange="", routing_key="cf.q")),
     header(1, 3), body(1, b"12345")],
    differs="a body frame that goes past the size its header announced is 505 at once; "
            "RabbitMQ keeps waiting for more body, and the channel is stuck until its next "
            "method frame (505 then)",
    hare=Outcome([["1 queue.declare-ok cf.content.body-longer-than-header.q messages=0 "
                   "consumers=0", "0 connection.close 505 60.40"], ["EOF"]], False))
row("content/body-longer-than-header-then-method",
    [m(1, declare_q(exclusive=True)), m(1, Ba.Publish(exchange="", routing_key="cf.q")),
     header(1, 3), body(1, b"12345")], [QOS])
row("content/header-class-not-basic",
    [m(1, Ba.Publish(exchange="", routing_key="cf.q")), header(1, 3, class_id=50)])
row("content/header-too-short",
    [m(1, Ba.Publish(exchange="", routing_key="cf.q")), frame(2, 1, b"\x00\x3c\x00\x00")])
row("content/header-on-other-channel",
    [m(1, Ba.Publish(exchange="", routing_key="cf.q")), header(2, 3), body(2, b"abc")],
    channels=(1, 2))
row("content/zero-size-then-body-frame",
    [m(1, Ba.Publish(exchange="", routing_key="cf.q")), header(1, 0), body(1, b"x")])
row("content/zero-size-no-body",
    [m(1, declare_q(exclusive=True)), m(1, Ba.Publish(exchange="", routing_key="cf.q")),
     header(1, 0)], [m(1, Ba.Get(queue="cf.q", no_ack=True))])
row("content/many-small-body-frames",
    [m(1, declare_q(exclusive=True)), m(1, Ba.Publish(exchange="", routing_key="cf.q")),
     header(1, 100), *[body(1, b"%02d" % i) for i in range(50)]],
    [m(1, Ba.Get(queue="cf.q", no_ack=True))])
row("content/interleaved-channels",  # confirms: both messages are in the queue before the count
    [m(1, declare_q(exclusive=True)), m(1, Cf.Select()), m(2, Cf.Select())],
    [m(1, Ba.Publish(exchange="", routing_key="cf.q")), header(1, 6), body(1, b"one-"),
     m(2, Ba.Publish(exchange="", routing_key="cf.q")), header(2, 3), body(2, b"two"),
     body(1, b"ch")],
    [m(1, Qu.Declare(queue="cf.q", passive=True))], channels=(1, 2))
row("content/empty-body-frame",
    [m(1, declare_q(exclusive=True)), m(1, Ba.Publish(exchange="", routing_key="cf.q")),
     header(1, 2), body(1, b""), body(1, b"hi")], [m(1, Ba.Get(queue="cf.q", no_ack=True))])
row("content/publish-truncated-args",
    [frame(1, 1, b"\x00\x3c\x00\x28\x00\x00\x09ab"), header(1, 0)])

# -- frames ----------------------------------------------------------------------------------
row("frame/unknown-type", [frame(7, 1, b"zz")])
# RabbitMQ waits 3 s after a fatal frame error before it closes: quiet=4
row("frame/bad-frame-end", [frame(1, 1, b"\x00\x3c\x00\x0a\x00\x00\x00\x00\x00", end=b"\x00")],
    quiet=4.0)
row("frame/unknown-method", [frame(1, 1, b"\x00\x3c\x00\x63")], differs=CRASH,
    hare=Outcome([["0 connection.close 540 60.99"], ["EOF"]], False))
row("frame/unknown-class-on-channel-0", [frame(1, 0, b"\x00\x63\x00\x01")], differs=CRASH,
    hare=Outcome([["0 connection.close 540 99.1"], ["EOF"]], False))
row("frame/method-too-short", [frame(1, 1, b"\x00\x3c")])
row("frame/malformed-queue-declare", [frame(1, 1, b"\x00\x32\x00\x0a\x00\x00\x05ab")])
row("frame/malformed-connection-close", [frame(1, 0, b"\x00\x0a\x00\x32\x01")],
    differs="a connection.close that cannot be decoded is 501 FRAME_ERROR like any other "
            "method; RabbitMQ answers 541 INTERNAL_ERROR (its own crash)",
    hare=Outcome([["0 connection.close 501 10.50"], ["EOF"]], False))
row("frame/header-on-channel-0", [header(0, 3)])
row("frame/body-on-channel-0", [body(0, b"abc")])
row("frame/exactly-frame-max",
    [m(1, declare_q(exclusive=True)), m(1, Ba.Publish(exchange="", routing_key="cf.q")),
     header(1, 4088), body(1, b"x" * 4088)], [m(1, Qu.Declare(queue="cf.q", passive=True))],
    tune={"frame_max": 4096})
row("frame/payload-of-frame-max",  # RabbitMQ does not count the 8 bytes of frame overhead
    [m(1, declare_q(exclusive=True)), m(1, Ba.Publish(exchange="", routing_key="cf.q")),
     header(1, 4096), body(1, b"x" * 4096)], [m(1, Qu.Declare(queue="cf.q", passive=True))],
    tune={"frame_max": 4096})
row("frame/payload-past-frame-max",
    [m(1, Ba.Publish(exchange="", routing_key="cf.q")), header(1, 4097),
     body(1, b"x" * 4097)], tune={"frame_max": 4096}, quiet=4.0)
row("frame/header-announces-too-large", [frame(3, 1, b"")[:3] + b"\x00\x01\x00\x00"],
    tune={"frame_max": 4096}, quiet=4.0)
for _name, _tune in (("frame-max-below-minimum", {"frame_max": 4095}),
                     ("frame-max-above-server", {"frame_max": 131073}),
                     ("frame-max-zero", {"frame_max": 0}),
                     ("channel-max-above-server", {"channel_max": 2048}),
                     ("channel-max-zero", {"channel_max": 0})):
    row(f"tune/{_name}", [m(0, Cn.Open(virtual_host="/"))], stage="tuned", tune=_tune,
        quiet=4.0, differs=SILENT_TUNE, hare=closed_with("530 0.0"))
row("channel-max/open-up-to-limit", [m(1, Ch.Open()), m(2, Ch.Open())],
    [m(1, close(1))], tune={"channel_max": 2}, channels=())
row("channel-max/one-past-limit", [m(1, Ch.Open()), m(2, Ch.Open()), m(3, Ch.Open())],
    tune={"channel_max": 2}, channels=(), probe=0)
row("channel-max/number-above-limit", [m(5, Ch.Open())], [m(5, close(5))],
    tune={"channel_max": 2}, channels=())
row("channel-max/number-65535", [m(65535, Ch.Open())], [m(65535, close(65535))], channels=())
row("channel-max/reuse-after-close", [m(1, close(1))], [m(1, Ch.Open()), QOS])

# -- heartbeats ------------------------------------------------------------------------------
row("heartbeat/channel-0", [heartbeat(0), QOS])
row("heartbeat/open-channel", [heartbeat(1)])
row("heartbeat/unopened-channel", [heartbeat(3)], channels=())
row("heartbeat/with-payload", [frame(8, 0, b"xx"), QOS])
row("heartbeat/closing-channel", [FAIL_404], [heartbeat(1)])

# -- delivery tags ---------------------------------------------------------------------------
# a queue with three messages, and three unacked basic.get deliveries (tags 1, 2, 3)
THREE = [m(1, declare_q()), *publish(1, "", "cf.q", b"1"), *publish(1, "", "cf.q", b"2"),
         *publish(1, "", "cf.q", b"3")]
GET3 = [m(1, Ba.Get(queue="cf.q")) for _ in range(3)]


def tags(name: str, *methods: object) -> None:
    # the count in a later step: RabbitMQ applies acks and requeues asynchronously
    row(f"tags/{name}", GET3, [*methods], [m(1, Qu.Declare(queue="cf.q", passive=True))],
        setup=THREE)


tags("ack-unknown", m(1, Ba.Ack(delivery_tag=9)))
tags("ack-zero-single", m(1, Ba.Ack(delivery_tag=0)))
tags("ack-zero-multiple", m(1, Ba.Ack(delivery_tag=0, multiple=True)))
tags("ack-multiple-unknown", m(1, Ba.Ack(delivery_tag=9, multiple=True)))
tags("ack-multiple-middle", m(1, Ba.Ack(delivery_tag=2, multiple=True)))
tags("ack-twice", m(1, Ba.Ack(delivery_tag=2)), m(1, Ba.Ack(delivery_tag=2)))
tags("ack-multiple-after-single", m(1, Ba.Ack(delivery_tag=2)),
     m(1, Ba.Ack(delivery_tag=2, multiple=True)))
tags("nack-unknown", m(1, Ba.Nack(delivery_tag=9)))
tags("nack-zero-multiple-requeue", m(1, Ba.Nack(delivery_tag=0, multiple=True, requeue=True)))
tags("nack-multiple-drop", m(1, Ba.Nack(delivery_tag=3, multiple=True, requeue=False)))
tags("reject-unknown", m(1, Ba.Reject(delivery_tag=9)))
tags("reject-requeue", m(1, Ba.Reject(delivery_tag=1, requeue=True)))
tags("reject-zero", m(1, Ba.Reject(delivery_tag=0)))
tags("recover-requeue", m(1, Ba.Recover(requeue=True)))
tags("recover-no-requeue", m(1, Ba.Recover(requeue=False)))
tags("recover-async", m(1, Ba.RecoverAsync(requeue=True)))


def no_tags(name: str, *methods: object) -> None:
    # nothing outstanding: the empty case of each form, which a fast path may skip past
    row(f"tags/empty-{name}", [*methods], [m(1, Qu.Declare(queue="cf.q", passive=True))],
        setup=[m(1, declare_q())])


no_tags("ack-zero-multiple", m(1, Ba.Ack(delivery_tag=0, multiple=True)))
no_tags("ack-zero-single", m(1, Ba.Ack(delivery_tag=0)))
no_tags("ack-one", m(1, Ba.Ack(delivery_tag=1)))
no_tags("ack-one-multiple", m(1, Ba.Ack(delivery_tag=1, multiple=True)))
no_tags("nack-zero-multiple", m(1, Ba.Nack(delivery_tag=0, multiple=True)))
no_tags("nack-zero-single", m(1, Ba.Nack(delivery_tag=0)))
no_tags("nack-one-multiple", m(1, Ba.Nack(delivery_tag=1, multiple=True)))
no_tags("reject-zero", m(1, Ba.Reject(delivery_tag=0)))
no_tags("reject-one", m(1, Ba.Reject(delivery_tag=1)))
no_tags("recover", m(1, Ba.Recover(requeue=True)))
no_tags("tx-ack-zero-multiple", m(1, Tx.Select()), m(1, Ba.Ack(delivery_tag=0, multiple=True)),
        m(1, Tx.Commit()))
row("tags/get-no-ack-then-ack", [m(1, Ba.Get(queue="cf.q", no_ack=True)),
                                 m(1, Ba.Ack(delivery_tag=1))], setup=THREE)
row("tags/ack-on-other-channel", GET3, [m(2, Ba.Ack(delivery_tag=1))], setup=THREE,
    channels=(1, 2))
row("tags/close-requeues-unacked", GET3, [m(1, close(1))],
    [m(1, Ch.Open()), m(1, Qu.Declare(queue="cf.q", passive=True))], setup=THREE)
row("tags/get-empty", [m(1, declare_q(exclusive=True)), m(1, Ba.Get(queue="cf.q"))])
row("tags/get-missing-queue", [m(1, Ba.Get(queue="cf.missing"))])

# -- consumers -------------------------------------------------------------------------------
ONE = [m(1, declare_q()), *publish(1, "", "cf.q", b"1")]
row("consume/deliver-and-ack",
    [m(1, Ba.Consume(queue="cf.q", consumer_tag="c1"))], [m(1, Ba.Ack(delivery_tag=1))],
    setup=ONE)
row("consume/tag-reuse",
    [m(1, Ba.Consume(queue="cf.q", consumer_tag="c1"))],
    [m(1, Ba.Consume(queue="cf.q", consumer_tag="c1"))], setup=[m(1, declare_q())])
row("consume/tag-reuse-on-other-channel",
    [m(1, Ba.Consume(queue="cf.q", consumer_tag="c1"))],
    [m(2, Ba.Consume(queue="cf.q", consumer_tag="c1"))],
    setup=[m(1, declare_q())], channels=(1, 2))
row("consume/server-named-tag", [m(1, Ba.Consume(queue="cf.q"))], setup=[m(1, declare_q())])
row("consume/missing-queue", [m(1, Ba.Consume(queue="cf.missing", consumer_tag="c1"))])
row("consume/exclusive-when-others-consume",
    [m(1, Ba.Consume(queue="cf.q", consumer_tag="c1", exclusive=True))],
    setup=[m(1, declare_q()), m(1, Ba.Consume(queue="cf.q", consumer_tag="other"))])
row("consume/when-exclusive-consumer",
    [m(1, Ba.Consume(queue="cf.q", consumer_tag="c1"))],
    setup=[m(1, declare_q()),
           m(1, Ba.Consume(queue="cf.q", consumer_tag="other", exclusive=True))])
row("consume/exclusive-queue-of-other-connection",
    [m(1, Ba.Consume(queue="cf.q", consumer_tag="c1"))],
    setup=[m(1, declare_q(exclusive=True))])
row("consume/no-local-gets-own-messages",
    [m(1, declare_q(exclusive=True)),
     m(1, Ba.Consume(queue="cf.q", consumer_tag="c1", no_local=True, no_ack=True)),
     *publish(1, "", "cf.q", b"mine")])
row("consume/cancel-unknown-tag", [m(1, Ba.Cancel(consumer_tag="nobody"))])
# consume-ok in its own step: RabbitMQ 3.10 may answer what follows a consume before it
row("consume/cancel-twice",
    [m(1, declare_q(exclusive=True)), m(1, Ba.Consume(queue="cf.q", consumer_tag="c1"))],
    [m(1, Ba.Cancel(consumer_tag="c1")), m(1, Ba.Cancel(consumer_tag="c1"))])
row("consume/queue-deleted-under-consumer",
    [m(1, declare_q()), m(1, Ba.Consume(queue="cf.q", consumer_tag="c1"))],
    [m(1, Qu.Delete(queue="cf.q"))])
row("consume/prefetch-limits-deliveries",
    [m(1, Ba.Qos(prefetch_count=1)), m(1, Ba.Consume(queue="cf.q", consumer_tag="c1"))],
    [m(1, Ba.Ack(delivery_tag=1))], setup=THREE)
row("consume/qos-prefetch-size",
    [m(1, Ba.Qos(prefetch_size=1000, prefetch_count=1))])
row("consume/qos-global",
    [m(1, Ba.Qos(prefetch_count=2, global_=True))])
row("consume/x-priority-string",
    [m(1, Ba.Consume(queue="cf.q", consumer_tag="c1", arguments={"x-priority": "high"}))],
    setup=[m(1, declare_q())])
row("consume/x-priority-int",
    [m(1, Ba.Consume(queue="cf.q", consumer_tag="c1", arguments={"x-priority": 5}))],
    setup=[m(1, declare_q())])
row("consume/nowait",
    [m(1, declare_q(exclusive=True)),
     m(1, Ba.Consume(queue="cf.q", consumer_tag="c1", nowait=True)), QOS])

# -- tx and confirm --------------------------------------------------------------------------
row("tx/confirm-after-tx", [m(1, Tx.Select()), m(1, Cf.Select())])
row("tx/tx-after-confirm", [m(1, Cf.Select()), m(1, Tx.Select())])
row("tx/commit-without-select", [m(1, Tx.Commit())])
row("tx/rollback-without-select", [m(1, Tx.Rollback())])
row("tx/publish-rollback-publishes-nothing",
    [m(1, declare_q(exclusive=True)), m(1, Tx.Select()), *publish(1, "", "cf.q"),
     m(1, Tx.Rollback())], [m(1, Qu.Declare(queue="cf.q", passive=True))])
row("tx/publish-commit",
    [m(1, declare_q(exclusive=True)), m(1, Tx.Select()), *publish(1, "", "cf.q")],
    [m(1, Qu.Declare(queue="cf.q", passive=True)), m(1, Tx.Commit())],
    [m(1, Qu.Declare(queue="cf.q", passive=True))])
row("tx/mandatory-return-at-commit",
    [m(1, Tx.Select()), *publish(1, "amq.direct", "cf.nowhere", mandatory=True),
     m(1, Tx.Commit())])
row("tx/ack-unknown-tag-in-tx", [m(1, Tx.Select()), m(1, Ba.Ack(delivery_tag=5))])
row("tx/ack-then-rollback",
    [m(1, Tx.Select()), *GET3, m(1, Ba.Ack(delivery_tag=1)), m(1, Tx.Rollback()),
     m(1, Ba.Ack(delivery_tag=1)), m(1, Tx.Commit())], setup=THREE)
row("confirm/unroutable", [m(1, Cf.Select()), *publish(1, "amq.direct", "cf.nowhere")])
row("confirm/mandatory-unroutable",
    [m(1, Cf.Select()), *publish(1, "amq.direct", "cf.nowhere", mandatory=True)])
row("confirm/routed",  # one publish a step: whether two acks are one multiple ack is timing
    [m(1, declare_q(exclusive=True)), m(1, Cf.Select()), *publish(1, "", "cf.q")],
    publish(1, "", "cf.q"))
row("confirm/nowait", [m(1, Cf.Select(nowait=True)), *publish(1, "amq.direct", "cf.nowhere")])
row("confirm/publish-to-missing-exchange",
    [m(1, Cf.Select()), *publish(1, "cf.no-such-exchange")])
row("publish/immediate", publish(1, "amq.direct", "cf.k", immediate=True))
row("publish/mandatory-unroutable", publish(1, "amq.direct", "cf.nowhere", mandatory=True))
row("publish/internal-exchange",
    [m(1, Ex.Declare(exchange="cf.x", exchange_type="fanout", internal=True)),
     *publish(1, "cf.x")])
row("publish/expiration-not-a-number",
    publish(1, "amq.direct", "cf.k", props=Ba.Properties(expiration="soon")))
row("publish/expiration-negative",
    publish(1, "amq.direct", "cf.k", props=Ba.Properties(expiration="-5")))
row("publish/user-id-of-someone-else",
    publish(1, "amq.direct", "cf.k", props=Ba.Properties(user_id="mallory")))
row("publish/user-id-own", [*publish(1, "amq.direct", "cf.k", props=Ba.Properties(
    user_id="guest")), QOS])

# -- channel.flow ----------------------------------------------------------------------------
row("flow/client-flow-off", [m(1, Ch.Flow(active=False))],
    differs="Hare implements a client's channel.flow (flow-ok, deliveries pause); RabbitMQ "
            "refuses active=false with 540 NOT_IMPLEMENTED",
    hare=Outcome([["1 channel.flow-ok active=0"]], True))
row("flow/client-flow-on", [m(1, Ch.Flow(active=True))])
row("flow/flow-ok-from-client", [m(1, Ch.FlowOk(active=True))])

# -- x-arguments: types and ranges -------------------------------------------------------------
def qarg(name: str, arguments: dict, **kw) -> None:  # type: ignore[type-arg,no-untyped-def]
    row(f"x-args/{name}", [m(1, args_q(arguments, exclusive=True, **kw))])


qarg("message-ttl-ok", {"x-message-ttl": 1000})
qarg("message-ttl-zero", {"x-message-ttl": 0})
qarg("message-ttl-negative", {"x-message-ttl": -1})
qarg("message-ttl-string", {"x-message-ttl": "1000"})
qarg("message-ttl-float", {"x-message-ttl": 1.5})
qarg("message-ttl-huge", {"x-message-ttl": 2**40})
qarg("expires-ok", {"x-expires": 1000})
qarg("expires-zero", {"x-expires": 0})
qarg("expires-negative", {"x-expires": -10})
qarg("expires-string", {"x-expires": "soon"})
qarg("max-length-ok", {"x-max-length": 10})
qarg("max-length-zero", {"x-max-length": 0})
qarg("max-length-negative", {"x-max-length": -1})
qarg("max-length-string", {"x-max-length": "10"})
qarg("max-length-bytes-ok", {"x-max-length-bytes": 1024})
qarg("max-length-bytes-negative", {"x-max-length-bytes": -1})
qarg("max-length-bytes-bool", {"x-max-length-bytes": True})
qarg("overflow-drop-head", {"x-overflow": "drop-head"})
qarg("overflow-reject-publish", {"x-overflow": "reject-publish"})
qarg("overflow-reject-publish-dlx", {"x-overflow": "reject-publish-dlx"})
qarg("overflow-bogus", {"x-overflow": "bogus"})
qarg("overflow-int", {"x-overflow": 1})
qarg("dlx-ok", {"x-dead-letter-exchange": "cf.dlx"})
qarg("dlx-int", {"x-dead-letter-exchange": 5})
qarg("dlx-routing-key-without-dlx", {"x-dead-letter-routing-key": "k"})
qarg("dlx-with-routing-key", {"x-dead-letter-exchange": "cf.dlx",
                              "x-dead-letter-routing-key": "k"})
qarg("max-priority-ok", {"x-max-priority": 10})
qarg("max-priority-256", {"x-max-priority": 256})
qarg("max-priority-negative", {"x-max-priority": -1})
qarg("max-priority-string", {"x-max-priority": "10"})
qarg("queue-mode-lazy", {"x-queue-mode": "lazy"})
qarg("queue-mode-bogus", {"x-queue-mode": "bogus"})
qarg("queue-type-classic", {"x-queue-type": "classic"})
qarg("queue-type-bogus", {"x-queue-type": "bogus"})
qarg("queue-type-quorum-exclusive", {"x-queue-type": "quorum"})
qarg("single-active-consumer-bool", {"x-single-active-consumer": True})
qarg("single-active-consumer-string", {"x-single-active-consumer": "yes"})
qarg("unknown-argument", {"x-made-up": "whatever"})
qarg("queue-version-2", {"x-queue-version": 2})
qarg("queue-version-3", {"x-queue-version": 3})
# arguments of another queue type (RabbitMQ 3.10: "... of queue type rabbit_T_queue")
qarg("classic-delivery-limit", {"x-delivery-limit": 3})
qarg("classic-leader-locator", {"x-queue-leader-locator": "balanced"})
qarg("classic-dead-letter-strategy", {"x-dead-letter-strategy": "at-least-once"})


def quorum_arg(name: str, arguments: dict, **kw) -> None:  # type: ignore[type-arg,no-untyped-def]
    kw.setdefault("durable", True)
    row(f"x-args/quorum-{name}", [m(1, args_q({"x-queue-type": "quorum", **arguments}, **kw))])


quorum_arg("max-priority", {"x-max-priority": 5})
quorum_arg("queue-mode", {"x-queue-mode": "lazy"})
quorum_arg("master-locator", {"x-queue-master-locator": "min-masters"})
quorum_arg("initial-group-size-zero", {"x-quorum-initial-group-size": 0})
quorum_arg("initial-group-size-string", {"x-quorum-initial-group-size": "3"})
quorum_arg("leader-locator-bogus", {"x-queue-leader-locator": "nope"})
quorum_arg("dead-letter-strategy-bogus", {"x-dead-letter-strategy": "bogus"})
quorum_arg("non-durable", {}, durable=False)
quorum_arg("exclusive", {}, exclusive=True)
quorum_arg("auto-delete", {}, auto_delete=True)
quorum_arg("auto-delete-and-bad-arg", {"x-max-priority": 5}, auto_delete=True)
def stream_arg(name: str, arguments: dict, **kw) -> None:  # type: ignore[type-arg,no-untyped-def]
    kw.setdefault("durable", True)
    row(f"x-args/stream-{name}", [m(1, args_q({"x-queue-type": "stream", **arguments}, **kw))])


stream_arg("max-priority", {"x-max-priority": 5})
stream_arg("dead-letter-exchange", {"x-dead-letter-exchange": "cf.dlx"})
stream_arg("message-ttl", {"x-message-ttl": 1000})
stream_arg("max-length", {"x-max-length": 10})
stream_arg("single-active-consumer", {"x-single-active-consumer": True})
stream_arg("max-length-bytes-ok", {"x-max-length-bytes": 1000})
stream_arg("max-age-ok", {"x-max-age": "7D"})
stream_arg("max-age-zero", {"x-max-age": "0s"})
stream_arg("max-age-int", {"x-max-age": 5})
stream_arg("segment-size-ok", {"x-stream-max-segment-size-bytes": 3_000_000_000})
stream_arg("segment-size-over-max", {"x-stream-max-segment-size-bytes": 3_000_000_001})
stream_arg("segment-size-string", {"x-stream-max-segment-size-bytes": "a"})
stream_arg("non-durable", {}, durable=False)
stream_arg("exclusive", {}, exclusive=True)
stream_arg("auto-delete", {}, auto_delete=True)
row("x-args/alternate-exchange-ok",
    [m(1, Ex.Declare(exchange="cf.x", exchange_type="direct",
                     arguments={"alternate-exchange": "cf.ae"}))])
row("x-args/alternate-exchange-int",
    [m(1, Ex.Declare(exchange="cf.x", exchange_type="direct",
                     arguments={"alternate-exchange": 5}))])
row("x-args/exchange-unknown-type",
    [m(1, Ex.Declare(exchange="cf.x", exchange_type="made-up"))])
row("x-args/exchange-x-consistent-hash-missing-plugin",
    [m(1, Ex.Declare(exchange="cf.x", exchange_type="x-consistent-hash"))],
    differs="the consistent-hash exchange is built in (issue 25); the recording is of a RabbitMQ "
            "without the plugin, which answers 503 unknown exchange type",
    hare=Outcome([["1 exchange.declare-ok"]], True))

# -- redeclares --------------------------------------------------------------------------------
def redeclare(name: str, first: c.Queue.Declare, second: c.Queue.Declare) -> None:
    row(f"redeclare/queue-{name}", [m(1, first)], [m(1, second)],
        [m(1, Qu.Declare(queue="cf.q", passive=True))])


redeclare("same", declare_q(), declare_q())
redeclare("durable-differs", declare_q(), declare_q(durable=True))
redeclare("auto-delete-differs", declare_q(), declare_q(auto_delete=True))
redeclare("exclusive-differs", declare_q(exclusive=True), declare_q())
redeclare("exclusive-added", declare_q(), declare_q(exclusive=True))
redeclare("ttl-differs", args_q({"x-message-ttl": 1000}), args_q({"x-message-ttl": 2000}))
redeclare("ttl-added", declare_q(), args_q({"x-message-ttl": 1000}))
redeclare("ttl-removed", args_q({"x-message-ttl": 1000}), declare_q())
redeclare("ttl-int-types", args_q({"x-message-ttl": 100}), args_q({"x-message-ttl": 100000}))
redeclare("max-length-differs", args_q({"x-max-length": 1}), args_q({"x-max-length": 2}))
redeclare("dlx-differs", args_q({"x-dead-letter-exchange": "a"}),
          args_q({"x-dead-letter-exchange": "b"}))
redeclare("unknown-arg-differs", args_q({"x-made-up": "a"}), args_q({"x-made-up": "b"}))
redeclare("passive-with-other-flags", declare_q(),
          declare_q(passive=True, durable=True, arguments={"x-message-ttl": 5}))


def redeclare_x(name: str, first: c.Exchange.Declare, second: c.Exchange.Declare) -> None:
    row(f"redeclare/exchange-{name}", [m(1, first)], [m(1, second)], ALIVE)


def xd(**kw) -> c.Exchange.Declare:  # type: ignore[no-untyped-def]
    kw.setdefault("exchange_type", "direct")
    return Ex.Declare(exchange="cf.x", **kw)


redeclare_x("same", xd(), xd())
redeclare_x("type-differs", xd(), xd(exchange_type="fanout"))
redeclare_x("durable-differs", xd(), xd(durable=True))
redeclare_x("auto-delete-differs", xd(), xd(auto_delete=True))
redeclare_x("internal-differs", xd(), xd(internal=True))
redeclare_x("args-differ", xd(arguments={"alternate-exchange": "a"}),
            xd(arguments={"alternate-exchange": "b"}))
redeclare_x("passive-other-type", xd(), xd(exchange_type="topic", passive=True))

# -- passive declares ------------------------------------------------------------------------
row("passive/queue-missing", [m(1, Qu.Declare(queue="cf.missing", passive=True))])
row("passive/queue-counts", [m(1, Qu.Declare(queue="cf.q", passive=True))], setup=THREE)
row("passive/queue-exclusive-of-other-connection",
    [m(1, Qu.Declare(queue="cf.q", passive=True))], setup=[m(1, declare_q(exclusive=True))])
row("passive/queue-empty-name", [m(1, Qu.Declare(queue="", passive=True))])
row("passive/exchange-missing", [m(1, Ex.Declare(exchange="cf.missing", passive=True))])
row("passive/exchange-amq-direct", [m(1, Ex.Declare(exchange="amq.direct", passive=True))])
row("passive/exchange-default", [m(1, Ex.Declare(exchange="", passive=True))])
row("queue/server-named", [m(1, Qu.Declare(queue="", exclusive=True))])
row("queue/empty-name-means-last-declared",
    [m(1, declare_q(exclusive=True)), *publish(1, "", "cf.q")], [m(1, Qu.Purge(queue=""))])
row("queue/empty-name-with-nothing-declared", [m(1, Qu.Purge(queue=""))])
row("queue/exclusive-of-other-connection",
    [m(1, declare_q(exclusive=True))], setup=[m(1, declare_q(exclusive=True))])
row("queue/name-too-long-for-shortstr", [frame(1, 1, b"\x00\x32\x00\x0a\x00\x00\xff" + b"q" * 10)])

# -- deletes -----------------------------------------------------------------------------------
row("delete/queue-if-empty-with-messages", [m(1, Qu.Delete(queue="cf.q", if_empty=True))],
    setup=THREE)
row("delete/queue-if-unused-with-consumer", [m(1, Qu.Delete(queue="cf.q", if_unused=True))],
    setup=[m(1, declare_q()), m(1, Ba.Consume(queue="cf.q", consumer_tag="other"))])
row("delete/queue-if-empty-empty", [m(1, Qu.Delete(queue="cf.q", if_empty=True))],
    setup=[m(1, declare_q())])
row("delete/queue-missing", [m(1, Qu.Delete(queue="cf.missing"))])
row("delete/queue-exclusive-of-other-connection", [m(1, Qu.Delete(queue="cf.q"))],
    setup=[m(1, declare_q(exclusive=True))])
row("delete/queue-counts-messages", [m(1, Qu.Delete(queue="cf.q"))], setup=THREE)
row("delete/exchange-if-unused-with-binding",
    [m(1, Ex.Delete(exchange="cf.x", if_unused=True))],
    setup=[m(1, xd()), m(1, declare_q()), m(1, Qu.Bind(queue="cf.q", exchange="cf.x"))])
row("delete/exchange-if-unused-unused", [m(1, Ex.Delete(exchange="cf.x", if_unused=True))],
    setup=[m(1, xd())])
row("delete/exchange-missing", [m(1, Ex.Delete(exchange="cf.missing"))])
row("delete/exchange-amq-direct", [m(1, Ex.Delete(exchange="amq.direct"))])
row("delete/exchange-default", [m(1, Ex.Delete(exchange=""))])
row("delete/purge-missing-queue", [m(1, Qu.Purge(queue="cf.missing"))])

# -- the amq. prefix and the default exchange ----------------------------------------------------
row("amq/declare-exchange", [m(1, Ex.Declare(exchange="amq.cf-x", exchange_type="direct"))])
row("amq/declare-queue", [m(1, Qu.Declare(queue="amq.cf-q"))])
row("amq/passive-queue-missing", [m(1, Qu.Declare(queue="amq.cf-q", passive=True))])
row("amq/redeclare-amq-direct", [m(1, Ex.Declare(exchange="amq.direct",
                                                 exchange_type="direct", durable=True))])
row("amq/redeclare-amq-direct-other-type",
    [m(1, Ex.Declare(exchange="amq.direct", exchange_type="fanout", durable=True))])
row("default/declare", [m(1, Ex.Declare(exchange="", exchange_type="direct"))])
row("default/declare-passive", [m(1, Ex.Declare(exchange="", exchange_type="direct",
                                                passive=True))])
row("default/bind-queue", [m(1, Qu.Bind(queue="cf.q", exchange="", routing_key="k"))],
    setup=[m(1, declare_q())])
row("default/unbind-queue", [m(1, Qu.Unbind(queue="cf.q", exchange="", routing_key="cf.q"))],
    setup=[m(1, declare_q())])
row("default/publish-routes-by-queue-name",
    [m(1, declare_q(exclusive=True)), *publish(1, "", "cf.q")],
    [m(1, Qu.Declare(queue="cf.q", passive=True))])
row("default/exchange-bind-destination",
    [m(1, Ex.Bind(destination="", source="amq.direct", routing_key="k"))])

# -- bindings ------------------------------------------------------------------------------------
row("bind/queue-missing", [m(1, Qu.Bind(queue="cf.missing", exchange="amq.direct"))])
row("bind/exchange-missing", [m(1, Qu.Bind(queue="cf.q", exchange="cf.missing"))],
    setup=[m(1, declare_q())])
row("bind/twice", [m(1, Qu.Bind(queue="cf.q", exchange="amq.direct", routing_key="k")),
                   m(1, Qu.Bind(queue="cf.q", exchange="amq.direct", routing_key="k"))],
    setup=[m(1, declare_q())])
row("unbind/not-bound", [m(1, Qu.Unbind(queue="cf.q", exchange="amq.direct", routing_key="k"))],
    setup=[m(1, declare_q())])
row("unbind/queue-missing",
    [m(1, Qu.Unbind(queue="cf.missing", exchange="amq.direct", routing_key="k"))])
row("unbind/exchange-missing",
    [m(1, Qu.Unbind(queue="cf.q", exchange="cf.missing", routing_key="k"))],
    setup=[m(1, declare_q())])
row("bind/exchange-to-exchange-missing-source",
    [m(1, Ex.Bind(destination="cf.x", source="cf.missing"))], setup=[m(1, xd())])
row("unbind/exchange-to-exchange-not-bound",
    [m(1, Ex.Unbind(destination="cf.x", source="amq.direct", routing_key="k"))],
    setup=[m(1, xd())])
row("unbind/exchange-to-exchange-missing",
    [m(1, Ex.Unbind(destination="cf.missing", source="amq.direct", routing_key="k"))])
row("bind/exclusive-queue-of-other-connection",
    [m(1, Qu.Bind(queue="cf.q", exchange="amq.direct"))],
    setup=[m(1, declare_q(exclusive=True))])

# -- streams: what a consumer may do -------------------------------------------------------------
STREAM = {"x-queue-type": "stream"}
STREAM_CRASH = ("RabbitMQ 3.10.8 crashes on a value it does not know (541 INTERNAL_ERROR, the "
                "connection closed); Hare answers 406 on the channel, naming the argument")


def stream_row(name: str, *steps: list, **options) -> None:  # type: ignore[type-arg]
    row(f"stream/{name}", *steps, setup=[m(1, args_q(STREAM, name="cf.s", durable=True))],
        **options)


def consume_s(**kw) -> c.Basic.Consume:  # type: ignore[no-untyped-def]
    return Ba.Consume(queue="cf.s", consumer_tag="c", **kw)


stream_row("consume-without-prefetch", [m(1, consume_s())])
stream_row("consume-auto-ack", [QOS, m(1, consume_s(no_ack=True))])
stream_row("consume-auto-ack-without-prefetch", [m(1, consume_s(no_ack=True))])
stream_row("consume-global-qos", [QOS, m(1, Ba.Qos(prefetch_count=5, global_=True)),
                                  m(1, consume_s())])
stream_row("consume-x-priority", [QOS, m(1, consume_s(arguments={"x-priority": 1}))])
for offset in ("first", "last", "next", 0, 7, "1h"):
    stream_row(f"consume-offset-{offset}", [QOS, m(1, consume_s(arguments={
        "x-stream-offset": offset}))])
stream_row("consume-offset-bogus", [QOS], [m(1, consume_s(arguments={"x-stream-offset": "soon"}))],
           differs=STREAM_CRASH,
           hare=Outcome([["1 basic.qos-ok"], ["1 channel.close 406 60.20"]], True))
stream_row("basic-get", [m(1, Ba.Get(queue="cf.s"))])
stream_row("purge", [m(1, Qu.Purge(queue="cf.s"))])
stream_row("redeclare-without-type", [m(1, declare_q("cf.s", durable=True))])
row("x-args/stream-max-age-bogus",
    [m(1, args_q({"x-queue-type": "stream", "x-max-age": "bogus"}, durable=True))],
    differs=STREAM_CRASH, hare=Outcome([["1 channel.close 406 50.10"]], True))
