"""What a restart of the whole multi-worker server forgets, as a single process does, and what
a restart of one worker (kill -9, the server still up) keeps."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pika

from tests.workers.helpers import WorkersBroker, alive, connect, one_per_worker, wait_for


def _restart_workers(b: WorkersBroker, indexes: tuple[int, ...]) -> None:
    """kill -9 of these workers; back when each runs again and the server serves."""
    before = b.workers()
    for i in indexes:
        os.kill(before[i], signal.SIGKILL)
    for i in indexes:
        wait_for(lambda i=i: b.workers().get(i, before[i]) != before[i]  # type: ignore[misc]
                 and not alive(before[i]), what=f"worker {i} restarted")
    # running in the cluster comes before serving: back once a connection lands on each
    wait_for(lambda: _serving(b), timeout=60, what="every worker serving")


def _serving(b: WorkersBroker) -> bool:
    try:
        conns = one_per_worker(b)
    except (AssertionError, pika.exceptions.AMQPError):
        return False
    for conn in conns.values():
        conn.close()
    return True


def _routed(ch: pika.adapters.blocking_connection.BlockingChannel, exchange: str) -> bool:
    """A confirmed mandatory publish: False when it reached no queue (basic.return)."""
    try:
        ch.basic_publish(exchange, "", b"m", mandatory=True)
    except pika.exceptions.UnroutableError:
        return False
    return True


def _exists(conn: pika.BlockingConnection, exchange: str) -> bool:
    try:
        conn.channel().exchange_declare(exchange, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    return True


def test_transient_topology_outlives_a_worker_not_the_server(tmp_path: Path) -> None:
    """A non-durable exchange and its bindings stay while a worker restarts after kill -9
    (the server was up, as a RabbitMQ cluster keeps them while one node restarts); a restart
    of the whole server drops them and every binding from or to them, so none comes back
    with a namesake declared later."""
    b = WorkersBroker(tmp_path / "data", 2).start()
    try:
        c = connect(b)
        ch = c.channel()
        ch.queue_declare("keep-q", durable=True)
        ch.exchange_declare("keep-x", "fanout", durable=True)
        ch.exchange_declare("lose-x", "fanout", durable=False)
        ch.exchange_bind("lose-x", "keep-x")  # keep-x -> lose-x -> keep-q
        ch.queue_bind("keep-q", "lose-x")
        c.close()
        _restart_workers(b, (2,))
        for conn in one_per_worker(b).values():  # each worker still has them
            assert _exists(conn, "lose-x")
            ch = conn.channel()
            ch.confirm_delivery()
            assert _routed(ch, "keep-x") and _routed(ch, "lose-x")
            conn.close()

        assert b.stop() == 0
        b.start()
        c = connect(b)
        assert _exists(c, "keep-x") and not _exists(c, "lose-x")
        ch = c.channel()
        ch.exchange_declare("lose-x", "fanout", durable=False)  # a namesake, no bindings
        c.close()
        _restart_workers(b, (1, 2))  # each worker reads every definition again
        for conn in one_per_worker(b).values():
            ch = conn.channel()
            ch.confirm_delivery()
            assert not _routed(ch, "keep-x") and not _routed(ch, "lose-x")
            conn.close()
    finally:
        b.kill()


def test_renamed_server_forgets_its_old_worker_names(tmp_path: Path) -> None:
    """Started under another --node-name on the same data directory, the server's workers
    take the new names and the old ones are not listed as stopped nodes (a single process
    forgets its old name too); the queues and messages are the renamed workers'."""
    data = tmp_path / "data"
    b = WorkersBroker(data, 2, ["--node-name", "old"]).start()
    try:
        c = connect(b)
        ch = c.channel()
        ch.queue_declare("kept", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "kept", b"m", pika.BasicProperties(delivery_mode=2))
        c.close()
        assert {n["name"] for n in b.get("/api/nodes")} == {"old-w1", "old-w2"}
    finally:
        assert b.stop() == 0
    b = WorkersBroker(data, 2, ["--node-name", "new"]).start()
    try:
        assert {n["name"] for n in b.get("/api/nodes")} == {"new-w1", "new-w2"}
        q = b.get("/api/queues/%2F/kept")
        assert q["node"] in ("new-w1", "new-w2") and q["messages"] == 1
    finally:
        assert b.stop() == 0
