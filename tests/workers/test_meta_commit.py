"""A worker's metadata writes to the parent's meta server while a channel waits for them.

A method that changes nothing still waits for the node's metadata writes in flight (a
passive declare's `cluster.commit()`), so what it answers about comes after them. One that
came while a batch was on its way, with nothing of its own pending, was never answered by
that batch: it waited for the next write or, with none, the commit's timeout, and then
closed the channel with 541 "metadata store unavailable". Seen as the intermittent
conformance rows at workers = 2: a row right after one whose exclusive queue went with its
connection found its usability probe (a passive declare of amq.direct) unanswered for 6 s."""

from __future__ import annotations

import time
from pathlib import Path

from pamqp import base, commands
from pamqp import frame as pframe

from tests.conformance.wire import Conn, Row, handshake
from tests.workers.helpers import WorkersBroker

ROUNDS = 60


def _send(conn: Conn, channel: int, method: base.Frame) -> None:
    conn.send(pframe.marshal(method, channel))


def test_passive_declare_during_a_metadata_write_is_answered(tmp_path: Path) -> None:
    """Channel 1 deletes a queue without waiting (its delete goes to the meta server);
    channel 2 of the same connection (so the same worker) then passively declares amq.direct,
    a little later each round, so that some declares come while the delete is on its way.
    Every one is answered with declare-ok, none with 541."""
    b = WorkersBroker(tmp_path / "data", 2).start()
    try:
        conn = Conn("127.0.0.1", b.port)
        handshake(conn, Row("meta-commit", [], channels=(1, 2)))
        for i in range(ROUNDS):
            name = f"meta-commit-{i}"
            _send(conn, 1, commands.Queue.Declare(queue=name, exclusive=True))
            conn.expect(commands.Queue.DeclareOk, timeout=30)
            _send(conn, 1, commands.Queue.Delete(queue=name, nowait=True))
            time.sleep((i % 6) / 1000)  # 0-5 ms: the delete's write is on its way to the parent
            _send(conn, 2, commands.Exchange.Declare(exchange="amq.direct", passive=True))
            # the old bug answered channel.close 541 after the commit's 6 s timeout
            got = conn.next(30)
            assert isinstance(got, tuple) and isinstance(got[1], commands.Exchange.DeclareOk), (
                i, got if not isinstance(got, tuple) else (got[0], dict(got[1])))
        conn.close()
    finally:
        b.stop()
