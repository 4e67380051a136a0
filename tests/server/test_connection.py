"""The connection handshake and life cycle: authentication, vhosts, tune limits, capabilities,
timeouts, heartbeats, closing, loopback-only users (as RabbitMQ's rabbit_reader)."""

from __future__ import annotations

import subprocess
import time

import aio_pika
import pytest
from pamqp import commands, encode

from tests.amqp_raw import PROTOCOL_HEADER, RawClient, raw_frame, roundtrip_ok


def start_ok(c: RawClient, user: str = "guest", password: str = "guest",
             mechanism: str = "PLAIN") -> None:
    if mechanism == "AMQPLAIN":
        table = encode.field_table({"LOGIN": user, "PASSWORD": password})
        response = table[4:].decode("latin-1")  # the table without its length prefix
    else:
        response = f"\0{user}\0{password}"
    c.send_method(0, commands.Connection.StartOk(
        client_properties={"product": "raw"}, mechanism=mechanism, response=response,
        locale="en_US"))


def until_tune(port: int, host: str = "127.0.0.1", **kw) -> tuple[RawClient, object]:
    c = RawClient(port, host)
    c.send(PROTOCOL_HEADER)
    start = c.expect(commands.Connection.Start, 0)
    start_ok(c, **kw)
    return c, start


def expect_close(c: RawClient, code: int) -> commands.Connection.Close:
    close = c.expect(commands.Connection.Close, 0)
    assert close.reply_code == code, (close.reply_code, close.reply_text)
    try:
        c.send_method(0, commands.Connection.CloseOk())
    except OSError:
        pass
    assert c.closed(3.0)
    c.close()
    return close


def non_loopback_ipv4() -> str | None:
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = parts[parts.index("inet") + 1].split("/")[0]
            if not addr.startswith("127."):
                return addr
    return None


# -- start: server properties, mechanisms -------------------------------------------------------
def test_server_properties_and_capabilities(broker):
    c = RawClient(broker.port)
    c.send(PROTOCOL_HEADER)
    start = c.expect(commands.Connection.Start, 0)
    assert (start.version_major, start.version_minor) == (0, 9)
    props = start.server_properties
    assert props["product"] == "Hare"
    caps = props["capabilities"]
    for cap in ("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                "consumer_cancel_notify", "connection.blocked", "authentication_failure_close",
                "per_consumer_qos"):
        assert caps.get(cap) is True, cap
    assert set(start.mechanisms.split()) >= {"PLAIN", "AMQPLAIN"}
    assert "en_US" in start.locales.split()
    c.close()


def test_tune_offers_rabbitmq_defaults(broker):
    c, _ = until_tune(broker.port)
    tune = c.expect(commands.Connection.Tune, 0)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    c.close()


# -- authentication -----------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_wrong_password_is_403(broker, mechanism):
    c, _ = until_tune(broker.port, password="wrong", mechanism=mechanism)
    close = expect_close(c, 403)
    assert "ACCESS_REFUSED" in close.reply_text
    assert mechanism in close.reply_text
    assert (close.class_id, close.method_id) == (0, 0)  # as RabbitMQ's
    roundtrip_ok(broker.port)


def test_unknown_user_is_403(broker):
    c, _ = until_tune(broker.port, user="nobody", password="x")
    expect_close(c, 403)


def test_unknown_mechanism_is_403(broker):
    c, _ = until_tune(broker.port, mechanism="EXTERNAL")
    close = expect_close(c, 403)
    assert "EXTERNAL" in close.reply_text


def test_amqplain_login_works(broker):
    c, _ = until_tune(broker.port, mechanism="AMQPLAIN")
    tune = c.expect(commands.Connection.Tune, 0)
    c.send_method(0, commands.Connection.TuneOk(channel_max=tune.channel_max,
                                                frame_max=tune.frame_max, heartbeat=0))
    c.send_method(0, commands.Connection.Open(virtual_host="/"))
    c.expect(commands.Connection.OpenOk, 0)
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    assert c.expect(commands.Queue.DeclareOk, 1).queue.startswith("amq.gen-")
    c.close()


async def test_wrong_password_aio_pika(broker):
    url = broker.url.replace("guest:guest", "guest:nope")
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(url)


# -- tune-ok and open ---------------------------------------------------------------------------
@pytest.mark.parametrize("frame_max", [512, 4095, 131073, 1 << 20])
def test_tune_ok_frame_max_out_of_range_is_530(broker, frame_max):
    c, _ = until_tune(broker.port)
    tune = c.expect(commands.Connection.Tune, 0)
    c.send_method(0, commands.Connection.TuneOk(channel_max=tune.channel_max,
                                                frame_max=frame_max, heartbeat=0))
    close = expect_close(c, 530)
    assert "frame_max" in close.reply_text
    roundtrip_ok(broker.port)


def test_tune_ok_channel_max_above_servers_is_530(broker):
    c, _ = until_tune(broker.port)
    c.expect(commands.Connection.Tune, 0)
    c.send_method(0, commands.Connection.TuneOk(channel_max=4000, frame_max=131072,
                                                heartbeat=0))
    close = expect_close(c, 530)
    assert "channel_max" in close.reply_text


def test_tune_ok_smallest_frame_max_works(broker):
    c = RawClient(broker.port)
    c.handshake(frame_max=4096)
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    name = c.expect(commands.Queue.DeclareOk, 1).queue
    body = bytes(range(256)) * 40  # 10 KB: three body frames of at most 4088 bytes each way
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key=name))
    c.send_content(1, body, frame_max=4096)
    c.send_method(1, commands.Basic.Get(queue=name, no_ack=True))
    c.expect(commands.Basic.GetOk, 1)
    from pamqp import header as pheader
    from pamqp.body import ContentBody

    c.expect(pheader.ContentHeader, 1)
    got = b""
    pieces = 0
    while len(got) < len(body):
        piece = c.expect(ContentBody, 1)
        assert len(piece.value) <= 4096 - 8
        got += piece.value
        pieces += 1
    assert got == body and pieces == 3
    c.close()


def test_unknown_vhost_is_530(broker):
    c = RawClient(broker.port)
    c.send(PROTOCOL_HEADER)
    c.expect(commands.Connection.Start, 0)
    start_ok(c)
    c.expect(commands.Connection.Tune, 0)
    c.send_method(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    c.send_method(0, commands.Connection.Open(virtual_host="no-such-vhost"))
    close = expect_close(c, 530)
    assert "no-such-vhost" in close.reply_text
    assert (close.class_id, close.method_id) == (10, 40)
    roundtrip_ok(broker.port)


# -- closing ------------------------------------------------------------------------------------
def test_client_close_gets_close_ok_and_socket_closes(broker):
    c = RawClient(broker.port)
    c.handshake()
    c.open_channel(1)
    c.open_channel(2)
    c.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0,
                                               method_id=0))
    c.expect(commands.Connection.CloseOk, 0)
    assert c.closed(3.0)
    c.close()


def test_client_close_requeues_unacked(broker):
    c = RawClient(broker.port)
    c.handshake()
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue="conn-close-requeue"))
    c.expect(commands.Queue.DeclareOk, 1)
    c.send_method(1, commands.Queue.Purge(queue="conn-close-requeue"))
    c.expect(commands.Queue.PurgeOk, 1)
    c.send_method(1, commands.Basic.Publish(exchange="", routing_key="conn-close-requeue"))
    c.send_content(1, b"held")
    c.send_method(1, commands.Basic.Get(queue="conn-close-requeue", no_ack=False))
    c.expect(commands.Basic.GetOk, 1)
    c.recv_frame()  # header
    c.recv_frame()  # body
    c.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0,
                                               method_id=0))
    c.expect(commands.Connection.CloseOk, 0)
    c.close()
    d = RawClient(broker.port)
    d.handshake()
    d.open_channel(1)
    deadline = time.monotonic() + 3
    while True:
        d.send_method(1, commands.Basic.Get(queue="conn-close-requeue", no_ack=True))
        got = d.recv_frame()[1]
        if isinstance(got, commands.Basic.GetOk):
            assert d.recv_frame()[1].__class__.__name__ == "ContentHeader"
            assert d.recv_frame()[1].value == b"held"
            break
        assert time.monotonic() < deadline, "unacked message not requeued"
        time.sleep(0.02)
    assert got.redelivered
    d.send_method(1, commands.Queue.Delete(queue="conn-close-requeue"))
    d.close()


def test_abrupt_disconnect_mid_handshake(broker):
    for stop_after in range(3):
        c = RawClient(broker.port)
        c.send(PROTOCOL_HEADER)
        c.expect(commands.Connection.Start, 0)
        if stop_after >= 1:
            start_ok(c)
            c.expect(commands.Connection.Tune, 0)
        if stop_after >= 2:
            c.send_method(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072,
                                                        heartbeat=0))
        c.close()
    roundtrip_ok(broker.port)


# -- timeouts and heartbeats --------------------------------------------------------------------
def test_handshake_timeout(broker_factory):
    b = broker_factory(args=["--handshake-timeout-s", "1"]).start()
    silent = RawClient(b.port)  # not even a protocol header
    halfway = RawClient(b.port)
    halfway.send(PROTOCOL_HEADER)
    halfway.expect(commands.Connection.Start, 0)
    opened = RawClient(b.port)
    opened.handshake()
    assert silent.closed(5.0)
    assert halfway.closed(5.0)
    # a connection that finished its handshake is not touched by the timer
    opened.open_channel(1)
    for c in (silent, halfway, opened):
        c.close()


def test_heartbeats_sent_and_silent_client_dropped(broker):
    silent = RawClient(broker.port)
    silent.handshake(heartbeat=1)
    lively = RawClient(broker.port)
    lively.handshake(heartbeat=1)
    lively.open_channel(1)
    seen = 0
    deadline = time.monotonic() + 8
    silent_closed = False
    last_beat = 0.0
    while time.monotonic() < deadline and not silent_closed:
        now = time.monotonic()
        if now - last_beat >= 0.4:
            lively.send(raw_frame(8, 0, b""))
            last_beat = now
        # count what the server sends the lively client
        lively.sock.settimeout(0.05)
        try:
            data = lively.sock.recv(65536)
            seen += data.count(raw_frame(8, 0, b""))
        except TimeoutError:
            pass
        silent.sock.settimeout(0.05)
        try:
            data = silent.sock.recv(65536)
            if data == b"":
                silent_closed = True
        except TimeoutError:
            pass
        except OSError:
            silent_closed = True
    assert silent_closed, "a client that sent nothing for two intervals was not dropped"
    assert seen >= 1, "the server sent no heartbeat frame on an idle connection"
    # the client that sent heartbeats is still there
    lively.send_method(1, commands.Basic.Qos(prefetch_count=5))
    lively.expect(commands.Basic.QosOk, 1)
    lively.close()
    silent.close()


def test_heartbeat_zero_means_no_heartbeats(broker):
    c = RawClient(broker.port)
    c.handshake(heartbeat=0)
    c.sock.settimeout(1.5)
    try:
        data = c.sock.recv(100)
    except TimeoutError:
        data = None
    assert data is None
    c.close()


# -- loopback users and configured users --------------------------------------------------------
def test_guest_refused_from_non_loopback_address(broker):
    addr = non_loopback_ipv4()
    if addr is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    c, _ = until_tune(broker.port, host=addr)
    close = expect_close(c, 403)
    assert "localhost" in close.reply_text


def test_config_user_logs_in_from_anywhere(broker_factory, tmp_path):
    addr = non_loopback_ipv4()
    if addr is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    config = tmp_path / "hare.toml"
    config.write_text(
        '[[users]]\nname = "app"\npassword = "s3cret"\n\n'
        '[[permissions]]\nuser = "app"\nvhost = "/"\nconfigure = ".*"\nwrite = ".*"\n'
        'read = ".*"\n'
    )
    b = broker_factory(args=["--config", str(config)]).start()
    c = RawClient(b.port, addr)
    c.handshake(user="app", password="s3cret")
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
    c.expect(commands.Queue.DeclareOk, 1)
    c.close()
    # guest is still loopback-only on that broker
    g, _ = until_tune(b.port, host=addr)
    expect_close(g, 403)
    roundtrip_ok(b.port)


def test_user_without_permissions_on_vhost_is_refused(broker_factory, tmp_path):
    config = tmp_path / "hare.toml"
    config.write_text('vhosts = ["other"]\n\n[[users]]\nname = "app"\npassword = "pw"\n\n'
                      '[[permissions]]\nuser = "app"\nvhost = "other"\nconfigure = ".*"\n'
                      'write = ".*"\nread = ".*"\n')
    b = broker_factory(args=["--config", str(config)]).start()
    c = RawClient(b.port)
    c.send(PROTOCOL_HEADER)
    c.expect(commands.Connection.Start, 0)
    start_ok(c, user="app", password="pw")
    c.expect(commands.Connection.Tune, 0)
    c.send_method(0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    c.send_method(0, commands.Connection.Open(virtual_host="/"))
    close = expect_close(c, 530)
    assert "refused for user 'app'" in close.reply_text
    ok = RawClient(b.port)
    ok.handshake(user="app", password="pw", vhost="other")
    ok.close()
