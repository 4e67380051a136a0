"""AMQPS and the management's HTTPS: real clients (pika, aio-pika, urllib) over TLS against a
broker whose CA and certificates are made at test time; client certificates checked or refused,
the minimum TLS version, and EXTERNAL logins named by the certificate."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aiormq.exceptions
import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.amqp_raw import PROTOCOL_HEADER, RawClient
from tests.conftest import BrokerProc
from tests.tls_helpers import CertFiles, TestCA, TlsBroker

pytestmark = pytest.mark.timeout(60)


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca = TestCA(root / "ca")
        self.server = self.ca.issue("server", "localhost", server=True)
        self.alice = self.ca.issue("alice", "alice")
        self.mallory = self.ca.issue("mallory", "mallory")  # no such user in the broker
        self.dave = self.ca.issue("dave", "dave")
        self.rogue_ca = TestCA(root / "rogue", "Rogue CA")
        self.rogue = self.rogue_ca.issue("rogue", "alice")  # alice's name, untrusted issuer

    def client_context(self, cert: CertFiles | None = None,
                       max_version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca.cert_path))
        if cert is not None:
            ctx.load_cert_chain(cert.cert, cert.key)
        if max_version is not None:
            ctx.maximum_version = max_version
        return ctx


CONFIG = """
auth_mechanisms = ["PLAIN", "AMQPLAIN", "EXTERNAL"]
vhosts = []

[[users]]
name = "alice"
password = "not-used-by-external"

[[users]]
name = "CN=dave,O=Hare tests"
password = "not-used-by-external"

[[permissions]]
user = "alice"
vhost = "/"
configure = "^alice\\\\."
write = ".*"
read = "^alice\\\\."

[[permissions]]
user = "CN=dave,O=Hare tests"
vhost = "/"
configure = ".*"
write = ".*"
read = ".*"
"""


def _tls_args(pki: Pki, tmp: Path, *extra: str) -> list[str]:
    config = tmp / "hare.toml"
    config.write_text(CONFIG)
    return ["--config", str(config),
            "--ssl-port", "0", "--ssl-certfile", str(pki.server.cert),
            "--ssl-keyfile", str(pki.server.key), "--ssl-cacertfile", str(pki.ca.cert_path),
            "--ssl-verify", "verify_peer", *extra]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def strict(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    """Client certificates required, TLS 1.3 only, EXTERNAL on, management over HTTPS."""
    tmp = tmp_path_factory.mktemp("strict")
    b = TlsBroker(tmp / "data", _tls_args(
        pki, tmp, "--ssl-fail-if-no-peer-cert", "true", "--ssl-min-version", "tlsv1.3",
        "--management-ssl-port", "0", "--management-ssl-certfile", str(pki.server.cert),
        "--management-ssl-keyfile", str(pki.server.key), "--management-host", "127.0.0.1",
    )).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def lenient(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    """verify_peer without fail_if_no_peer_cert: certificates checked when sent; EXTERNAL
    names users by their distinguished name; half a second for the TLS handshake."""
    tmp = tmp_path_factory.mktemp("lenient")
    b = TlsBroker(tmp / "data", _tls_args(
        pki, tmp, "--ssl-cert-login-from", "distinguished_name",
        "--ssl-handshake-timeout-s", "0.5")).start()
    yield b
    b.stop()


def _pika_params(port: int, ctx: ssl.SSLContext, external: bool = False
                 ) -> pika.ConnectionParameters:
    credentials = (pika.credentials.ExternalCredentials() if external
                   else pika.PlainCredentials("guest", "guest"))
    return pika.ConnectionParameters(
        "127.0.0.1", port, credentials=credentials,
        ssl_options=pika.SSLOptions(ctx, "localhost"),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=5,
    )


def test_pika_publishes_and_consumes_over_tls(strict: TlsBroker, pki: Pki) -> None:
    conn = pika.BlockingConnection(_pika_params(strict.tls_port, pki.client_context(pki.alice)))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("tls-q")
        for i in range(20):
            ch.basic_publish("", "tls-q", b"m%d" % i)
        got = []
        for _, _, body in ch.consume("tls-q", auto_ack=True, inactivity_timeout=5):
            assert body is not None, "a message did not come back over TLS"
            got.append(body)
            if len(got) == 20:
                break
        assert got == [b"m%d" % i for i in range(20)]
    finally:
        conn.close()


async def test_external_login_is_the_certificate_common_name(strict: TlsBroker,
                                                             pki: Pki) -> None:
    conn = await aio_pika.connect(
        f"amqps://127.0.0.1:{strict.tls_port}/?auth=external",
        ssl_context=pki.client_context(pki.alice), timeout=10)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue("alice.inbox", auto_delete=True)  # alice may configure ^alice\.
        await ch.default_exchange.publish(aio_pika.Message(b"hi"), q.name)
        msg = await q.get(timeout=5)
        assert msg.body == b"hi"
        # guest could declare this; alice's permissions refuse it: the login really is alice
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await ch.declare_queue("not-alice")
    finally:
        await conn.close()


async def test_external_login_of_an_unknown_user_is_refused(strict: TlsBroker, pki: Pki) -> None:
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError) as info:
        await aio_pika.connect(f"amqps://127.0.0.1:{strict.tls_port}/?auth=external",
                               ssl_context=pki.client_context(pki.mallory), timeout=10)
    assert "ACCESS_REFUSED" in str(info.value) or "403" in str(info.value)
    assert "user 'mallory' - invalid credentials" in strict.log()


def _logged(broker: BrokerProc, text: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while text not in broker.log():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _tls_refused(broker: TlsBroker, ctx: ssl.SSLContext, reason: str) -> None:
    """The TLS session is refused (at the handshake, or at the first read: TLS 1.3 sends
    the client's certificate after the client's side of the handshake is done), and the
    broker logs why."""
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(_pika_params(broker.tls_port, ctx))
    assert _logged(broker, reason), broker.log()


def test_client_without_certificate_is_refused(strict: TlsBroker, pki: Pki) -> None:
    _tls_refused(strict, pki.client_context(), "PEER_DID_NOT_RETURN_A_CERTIFICATE")


def test_client_certificate_from_another_ca_is_refused(strict: TlsBroker, pki: Pki) -> None:
    _tls_refused(strict, pki.client_context(pki.rogue), "CERTIFICATE_VERIFY_FAILED")


def _tls_version(port: int, ctx: ssl.SSLContext) -> str | None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as sock:
        return sock.version()


def test_tls_older_than_the_minimum_is_refused(strict: TlsBroker, pki: Pki) -> None:
    assert _tls_version(strict.tls_port, pki.client_context(pki.alice)) == "TLSv1.3"
    ctx = pki.client_context(pki.alice, max_version=ssl.TLSVersion.TLSv1_2)
    with pytest.raises(ssl.SSLError):
        _tls_version(strict.tls_port, ctx)
    assert _logged(strict, "UNSUPPORTED_PROTOCOL"), strict.log()


def test_plain_port_does_not_offer_external(strict: TlsBroker) -> None:
    raw = RawClient(strict.port)
    raw.send(PROTOCOL_HEADER)
    _, start = raw.recv_frame()
    assert start.mechanisms.split() == ["PLAIN", "AMQPLAIN"]
    raw.send_method(0, commands.Connection.StartOk(
        client_properties={}, mechanism="EXTERNAL", response="", locale="en_US"))
    _, close = raw.recv_frame()
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 403
    assert "EXTERNAL" in close.reply_text


def test_tls_port_offers_external(strict: TlsBroker, pki: Pki) -> None:
    with socket.create_connection(("127.0.0.1", strict.tls_port), timeout=5) as raw, \
            pki.client_context(pki.alice).wrap_socket(raw, server_hostname="localhost") as sock:
        sock.sendall(PROTOCOL_HEADER)
        data = b""
        while b"EXTERNAL" not in data and len(data) < 4096:
            chunk = sock.recv(4096)
            assert chunk, "connection.start never came"
            data += chunk
        assert b"PLAIN AMQPLAIN EXTERNAL" in data


def test_management_over_https(strict: TlsBroker, pki: Pki) -> None:
    overview = _https_get(strict, pki, "/api/overview")
    listeners = {x["protocol"]: x["port"] for x in overview["listeners"]}
    https = strict.ports["hare-management https"]
    assert listeners == {"amqp": strict.port, "amqp/ssl": strict.tls_port, "https": https}
    for port in (strict.port, strict.tls_port, https):  # RabbitMQ's port-listener check
        assert _https_get(strict, pki, f"/api/health/checks/port-listener/{port}") == {
            "status": "ok", "port": port}
    # plain HTTP on the HTTPS port gets no API
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{https}/api/overview", timeout=5)


def _https_get(broker: TlsBroker, pki: Pki, path: str) -> Any:
    port = broker.ports["hare-management https"]
    req = urllib.request.Request(f"https://localhost:{port}{path}")
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        return json.loads(resp.read())


def test_connections_show_their_tls_session(strict: TlsBroker, pki: Pki) -> None:
    tls_conn = pika.BlockingConnection(
        _pika_params(strict.tls_port, pki.client_context(pki.alice)))
    plain = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", strict.port))
    try:
        conns = _https_get(strict, pki, "/api/connections")
        by_port = {c["port"]: c for c in conns}
        tls_view, plain_view = by_port[strict.tls_port], by_port[strict.port]
        assert tls_view["ssl"] is True and tls_view["ssl_protocol"] == "tlsv1.3"
        assert tls_view["peer_cert_subject"] == "CN=alice,O=Hare tests"
        assert tls_view["peer_cert_issuer"] == "CN=Hare test CA,O=Hare tests"
        assert tls_view["ssl_cipher"]
        assert plain_view["ssl"] is False and plain_view["peer_cert_subject"] is None
    finally:
        tls_conn.close()
        plain.close()


async def test_without_fail_if_no_peer_cert_a_client_without_certificate_may_use_plain(
        lenient: TlsBroker, pki: Pki) -> None:
    url = f"amqps://guest:guest@127.0.0.1:{lenient.tls_port}/"
    conn = await aio_pika.connect(url, ssl_context=pki.client_context(), timeout=10)
    await conn.close()
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(url + "?auth=external", ssl_context=pki.client_context(),
                               timeout=10)
    assert "presented no TLS (x.509) certificate" in lenient.log()


async def test_external_by_distinguished_name(lenient: TlsBroker, pki: Pki) -> None:
    conn = await aio_pika.connect(
        f"amqps://127.0.0.1:{lenient.tls_port}/?auth=external",
        ssl_context=pki.client_context(pki.dave), timeout=10)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue("", exclusive=True)
        await ch.default_exchange.publish(aio_pika.Message(b"dn"), q.name)
        assert (await q.get(timeout=5)).body == b"dn"
    finally:
        await conn.close()
    # alice's certificate names "CN=alice,O=Hare tests" here, a user that does not exist
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(f"amqps://127.0.0.1:{lenient.tls_port}/?auth=external",
                               ssl_context=pki.client_context(pki.alice), timeout=10)
    assert "user 'CN=alice,O=Hare tests' - invalid credentials" in lenient.log()


def test_a_client_that_never_starts_tls_is_dropped(lenient: TlsBroker) -> None:
    with socket.create_connection(("127.0.0.1", lenient.tls_port), timeout=10) as raw:
        assert raw.recv(1) == b""  # closed by the broker, well before the socket's timeout
    assert _logged(lenient, "SSL handshake is taking longer than 0.5 seconds"), lenient.log()


async def test_sigterm_closes_tls_clients_with_320(pki: Pki, tmp_path: Path) -> None:
    b = TlsBroker(tmp_path / "data", _tls_args(pki, tmp_path)).start()
    try:
        conn = await aio_pika.connect(f"amqps://guest:guest@127.0.0.1:{b.tls_port}/",
                                      ssl_context=pki.client_context(pki.alice), timeout=10)
        closed: asyncio.Future[BaseException | None] = \
            asyncio.get_running_loop().create_future()
        conn.close_callbacks.add(lambda _c, exc: closed.done() or closed.set_result(exc))
        assert await asyncio.to_thread(b.stop) == 0
        assert "CONNECTION_FORCED" in str(await asyncio.wait_for(closed, 10))
    finally:
        b.kill()
