"""Start-up of the listeners: every one is bound before any serves, a taken port names its
listener, and a certificate that cannot be used is one line and exit 1 before anything runs."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.tls_helpers import CertFiles, TestCA


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestCA, CertFiles]:
    ca = TestCA(tmp_path_factory.mktemp("pki"))
    return ca, ca.issue("server", "localhost", server=True)


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something else listens on (on all interfaces, as a broker would)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        yield s.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    log = tmp_path / "hare.log"
    with log.open("w") as err:
        r = subprocess.run(
            [sys.executable, "-m", "broker", "--data-dir", str(tmp_path / "data"),
             "--log-format", "json", *args],
            stdout=subprocess.PIPE, stderr=err, text=True, timeout=30, cwd=ROOT)
    r.stderr = log.read_text()
    return r


def _refused_before_serving(r: subprocess.CompletedProcess[str], line: str) -> None:
    assert r.returncode == 1, r.stderr
    problems = [x for x in r.stderr.splitlines() if x.startswith("hare-server: ")]
    assert problems == [f"hare-server: {line}"], r.stderr
    assert "Traceback" not in r.stderr
    # nothing listened: no banner, and the broker stopped before recovering or serving
    assert "listening" not in r.stdout
    assert "definitions restored" not in r.stderr and "broker started" not in r.stderr


def test_taken_management_port_is_named_and_nothing_serves(tmp_path: Path, taken: int) -> None:
    amqp = _free_port()
    r = _run(tmp_path, "--port", str(amqp), "--management-port", str(taken))
    _refused_before_serving(r, f"management port {taken} is already in use")
    assert str(amqp) not in r.stderr.splitlines()[-1]


def test_taken_https_port_is_named_with_four_listeners(
        tmp_path: Path, taken: int, certs: tuple[TestCA, CertFiles]) -> None:
    _, server = certs
    tls = ["--ssl-keyfile", str(server.key), "--ssl-certfile", str(server.cert)]
    r = _run(tmp_path, "--port", "0", "--management-port", str(_free_port()),
             "--ssl-port", "0", *tls,
             "--management-ssl-port", str(taken),
             "--management-ssl-certfile", str(server.cert),
             "--management-ssl-keyfile", str(server.key))
    _refused_before_serving(r, f"management HTTPS port {taken} is already in use")


def test_taken_amqps_port_is_named(tmp_path: Path, taken: int,
                                   certs: tuple[TestCA, CertFiles]) -> None:
    _, server = certs
    r = _run(tmp_path, "--port", "0", "--management-port", "0", "--ssl-port", str(taken),
             "--ssl-certfile", str(server.cert), "--ssl-keyfile", str(server.key))
    _refused_before_serving(r, f"AMQPS port {taken} is already in use")


def test_missing_certificate_is_one_line_and_exit_1(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    r = _run(tmp_path, "--port", "0", "--management-port", "0", "--ssl-certfile", str(missing))
    _refused_before_serving(r, f"ssl_certfile {missing}: cannot read (No such file or directory)")


def test_unreadable_ca_file_is_one_line_and_exit_1(
        tmp_path: Path, certs: tuple[TestCA, CertFiles]) -> None:
    _, server = certs
    r = _run(tmp_path, "--port", "0", "--management-port", "0",
             "--ssl-certfile", str(server.cert), "--ssl-keyfile", str(server.key),
             "--ssl-cacertfile", str(tmp_path))  # a directory: not a file one can read
    _refused_before_serving(r, f"ssl_cacertfile {tmp_path}: cannot read (Is a directory)")


def test_not_a_certificate_is_one_line_and_exit_1(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    r = _run(tmp_path, "--port", "0", "--management-port", "0",
             "--management-ssl-certfile", str(junk))
    assert r.returncode == 1
    line = r.stderr.splitlines()[-1]
    assert line.startswith(f"hare-server: management_ssl_certfile {junk}: not a PEM certificate")
    assert "listening" not in r.stdout


def test_key_of_another_certificate_is_one_line_and_exit_1(
        tmp_path: Path, certs: tuple[TestCA, CertFiles]) -> None:
    ca, server = certs
    other = ca.issue("other", "other")
    r = _run(tmp_path, "--port", "0", "--management-port", "0",
             "--ssl-certfile", str(server.cert), "--ssl-keyfile", str(other.key))
    assert r.returncode == 1
    line = r.stderr.splitlines()[-1]
    assert line.startswith(
        f"hare-server: ssl_certfile {server.cert} / ssl_keyfile {other.key}: "
        "not a PEM certificate with its private key"), line
    assert "listening" not in r.stdout


def test_two_listeners_given_one_port_is_refused_before_serving(tmp_path: Path) -> None:
    # Linux lets both bind (SO_REUSEADDR, neither listening yet): the clash shows at listen
    port = _free_port()
    r = _run(tmp_path, "--port", str(port), "--management-port", str(port))
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1] == f"hare-server: management port {port} is already in use"
    assert "listening" not in r.stdout and "broker started" not in r.stderr
