"""hare-server's life cycle: clean SIGTERM with clients connected and while starting, one
clear line and exit 1 for a port in use, an unusable data directory or a second broker on the
same data dir."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time

import aio_pika
import pytest
from aio_pika import DeliveryMode, Message

from broker.store.layout import LOCK_FILE
from tests.conftest import ROOT
from tests.start_stop_helpers import (
    PER_QUEUE,
    QUEUES,
    fill,
    spawn,
    stopped_while_starting,
)


def _run(args: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "broker", "--management-port", "0", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_port_in_use_is_one_line_and_exit_1(tmp_path):
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _run(["--port", str(port), "--data-dir", str(tmp_path / "d")])
    assert r.returncode == 1
    assert f"port {port} is already in use" in r.stderr
    assert "Traceback" not in r.stderr


def test_unusable_data_dir_is_one_line_and_exit_1(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = _run(["--port", "0", "--data-dir", str(blocker / "data")])
    assert r.returncode == 1
    assert "data directory" in r.stderr and "cannot be created" in r.stderr
    assert "Traceback" not in r.stderr


def test_second_broker_on_the_same_data_dir_is_refused(fresh_broker):
    fresh_broker.start()
    r = _run(["--port", "0", "--data-dir", str(fresh_broker.data_dir)])
    assert r.returncode == 1
    assert "in use by another broker" in r.stderr
    assert f"pid {fresh_broker.pid}" in r.stderr


def test_bad_config_value_is_one_line_and_exit_2(tmp_path):
    r = _run(["--port", "nope", "--data-dir", str(tmp_path / "d")])
    assert r.returncode == 2
    assert "port" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.asyncio
async def test_sigterm_closes_clients_with_320_and_keeps_persistent_messages(fresh_broker):
    fresh_broker.start()
    conn = await aio_pika.connect(fresh_broker.url)
    closed: asyncio.Future = asyncio.get_running_loop().create_future()
    conn.close_callbacks.add(lambda _c, exc: closed.done() or closed.set_result(exc))
    ch = await conn.channel(publisher_confirms=True)
    q = await ch.declare_queue("sigterm-q", durable=True)
    for i in range(100):
        await ch.default_exchange.publish(
            Message(b"m%d" % i, delivery_mode=DeliveryMode.PERSISTENT), q.name)
    started = time.monotonic()
    code = await asyncio.to_thread(fresh_broker.stop)
    assert code == 0
    assert time.monotonic() - started < 10
    exc = await asyncio.wait_for(closed, 5)
    assert "320" in str(exc) or "CONNECTION_FORCED" in str(exc)
    assert "broker stopped" in fresh_broker.log()
    fresh_broker.start()
    conn2 = await aio_pika.connect(fresh_broker.url)
    ch2 = await conn2.channel()
    q2 = await ch2.declare_queue("sigterm-q", durable=True)
    assert q2.declaration_result.message_count == 100
    await conn2.close()


def test_sigterm_while_recovering_stops_cleanly(fresh_broker):
    """SIGTERM during the recovery of its queues: the start stops at its next step with the
    stores closed as at any stop (exit 0, no "listening"), and the directory starts again,
    clean, with every message."""
    fresh_broker.start()
    fill(fresh_broker)
    assert fresh_broker.stop() == 0
    log = stopped_while_starting(fresh_broker, "msg_store_started")
    assert '"event": "msg_store_stopped"' in log  # closed, not dropped
    fresh_broker.start(timeout=60)
    lines = [json.loads(x) for x in fresh_broker.log_path.read_text()[len(log):].splitlines()]
    # two stores (persistent, transient) per node: each worker of a tree has its own
    per_node = [True, True]
    assert [x["clean"] for x in lines if x["event"] == "msg_store_started"] == (
        per_node * len(fresh_broker.node_dirs()))
    for i in range(QUEUES):
        assert asyncio.run(_depth(fresh_broker.port, f"slow-{i}")) == PER_QUEUE


async def _depth(port: int, queue: str) -> int:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    async with conn:
        q = await (await conn.channel()).declare_queue(queue, durable=True, passive=True)
        return int(q.declaration_result.message_count or 0)


def test_sigterm_before_the_loop_runs_stops_cleanly(fresh_broker):
    """SIGTERM as soon as the data directory is locked (before the event loop runs): noted,
    and the start stops at its first step: exit 0, not the signal's default action."""
    proc = spawn(fresh_broker)
    lock = fresh_broker.data_dir / LOCK_FILE
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.read_text().strip() == str(proc.pid)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, fresh_broker.log()
    assert "listening" not in out
    fresh_broker.start()  # the directory's lock went with it
