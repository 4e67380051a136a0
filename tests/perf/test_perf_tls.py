"""hare-perf over TLS: amqps:// URLs with RabbitMQ's URI query keys, and a tiny publish and
pubsub run through an AMQPS listener (the client certificate included)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from hare_perf.scenarios import run_scenario
from hare_perf.wire import parse_url
from tests.tls_helpers import CertFiles, TestCA, TlsBroker

pytestmark = pytest.mark.slow


def test_amqps_url() -> None:
    url = parse_url("amqps://u:p@example.com/v?cacertfile=/ca.pem&certfile=/c.pem&keyfile=/k.pem")
    assert (url.tls, url.port, url.vhost) == (True, 5671, "v")
    assert (url.cacertfile, url.certfile, url.keyfile) == ("/ca.pem", "/c.pem", "/k.pem")
    assert url.redacted() == "amqps://u@example.com:5671/v"
    assert parse_url("amqp://h/").ssl_context() is None
    with pytest.raises(ValueError, match="amqps"):
        parse_url("amqp://h/?cacertfile=/ca.pem")
    with pytest.raises(ValueError, match="verify"):
        parse_url("amqps://h/?verify=verify_none")


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[TlsBroker, TestCA, CertFiles]]:
    tmp = tmp_path_factory.mktemp("perf-tls")
    ca = TestCA(tmp / "pki")
    server = ca.issue("server", "localhost", server=True)
    client = ca.issue("client", "perf")
    b = TlsBroker(tmp / "data", [
        "--ssl-port", "0", "--ssl-certfile", str(server.cert), "--ssl-keyfile", str(server.key),
        "--ssl-cacertfile", str(ca.cert_path), "--ssl-verify", "verify_peer",
        "--ssl-fail-if-no-peer-cert", "true"]).start()
    yield b, ca, client
    b.stop()


def _q(path: Path) -> str:
    return quote(str(path), safe="/")


@pytest.mark.parametrize("scenario", ["publish-only", "pubsub"])
async def test_scenario_over_amqps(tls_broker: tuple[TlsBroker, TestCA, CertFiles],
                                   scenario: str) -> None:
    b, ca, client = tls_broker
    url = (f"amqps://guest:guest@localhost:{b.tls_port}/?cacertfile={_q(ca.cert_path)}"
           f"&certfile={_q(client.cert)}&keyfile={_q(client.key)}")
    report = await run_scenario(scenario, url, count=2_000)
    assert report.url.startswith("amqps://guest@localhost:")
    assert report.median["published"] == 2_000
    if scenario == "pubsub":
        assert report.median["delivered"] == 2_000
