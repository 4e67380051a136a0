"""docker/healthcheck.py run as the container runs it, against tiny TCP servers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pamqp import commands, frame

SCRIPT = Path(__file__).resolve().parents[2] / "docker" / "healthcheck.py"
HEADER = b"AMQP\x00\x00\x09\x01"

Answer = Callable[[socket.socket], None]


def connection_start(conn: socket.socket) -> None:
    assert conn.recv(8) == HEADER
    start = commands.Connection.Start(
        server_properties={"product": "Hare"}, mechanisms="PLAIN AMQPLAIN", locales="en_US"
    )
    data = frame.marshal(start, 0)
    conn.sendall(data[:5])  # in two pieces: the probe must read until it has the frame
    conn.sendall(data[5:])


def protocol_header(conn: socket.socket) -> None:
    conn.recv(8)
    conn.sendall(b"AMQP\x00\x00\x09\x01")


def http(conn: socket.socket) -> None:
    conn.recv(8)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def wrong_method(conn: socket.socket) -> None:
    conn.recv(8)
    conn.sendall(frame.marshal(commands.Connection.Tune(), 0))


def hang_up(conn: socket.socket) -> None:
    conn.recv(8)


def silent(conn: socket.socket) -> None:
    conn.recv(8)
    conn.recv(1)  # until the probe gives up and closes


@pytest.fixture
def server() -> Iterator[Callable[[Answer], int]]:
    """Start a one-connection TCP server on 127.0.0.1 that answers with `answer`."""
    listeners: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def start(answer: Answer) -> int:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                answer(conn)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return int(listener.getsockname()[1])

    yield start
    for listener in listeners:
        listener.close()
    for thread in threads:
        thread.join(timeout=5)


def healthcheck(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],  # by its shebang, as HEALTHCHECK runs it
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"], **(env or {})},
    )


@pytest.mark.parametrize(
    ("answer", "said"),
    [(connection_start, "connection.start"), (protocol_header, "protocol header 0.9.1")],
)
def test_healthy_when_amqp_answers(
    server: Callable[[Answer], int], answer: Answer, said: str
) -> None:
    port = server(answer)
    done = healthcheck("--port", str(port))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"healthy: 127.0.0.1:{port}") and said in done.stdout


@pytest.mark.parametrize("answer", [http, wrong_method, hang_up, silent])
def test_unhealthy_on_a_wrong_answer(server: Callable[[Answer], int], answer: Answer) -> None:
    port = server(answer)
    done = healthcheck("--port", str(port), "--timeout", "0.5")
    assert done.returncode == 1
    assert done.stdout.startswith("unhealthy:") and done.stdout.count("\n") == 1


def test_unhealthy_when_nothing_listens() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # free once closed
    done = healthcheck("--port", str(port))
    assert done.returncode == 1 and "unhealthy" in done.stdout


def test_port_and_host_from_the_broker_environment(server: Callable[[Answer], int]) -> None:
    port = server(connection_start)
    done = healthcheck(env={"HARE_PORT": str(port), "HARE_HOST": "0.0.0.0"})
    assert done.returncode == 0, done.stdout
    assert f"127.0.0.1:{port}" in done.stdout


def test_help_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and "--port" in done.stdout


def test_healthy_against_hare(tmp_path: Path) -> None:
    """End to end: the probe accepts what hare-server really sends."""
    pytest.importorskip("broker.cli")
    argv = ["--port", "0", "--management-port", "0", "--data-dir", str(tmp_path / "data")]
    env = {key: value for key, value in os.environ.items() if not key.startswith("HARE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    watchdog = threading.Timer(20, proc.kill)  # a broker that never starts fails, not hangs
    watchdog.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "hare-server listening on port N"
        assert "listening on port" in line, line
        port = line.rsplit(" ", 1)[1].strip()
        done = healthcheck("--port", port)
        assert done.returncode == 0, done.stdout
        assert "connection.start" in done.stdout
    finally:
        watchdog.cancel()
        proc.terminate()
        proc.wait(timeout=15)
