"""kill -9 a process in the middle of writing, removing and compacting: every message it was
told is durable must come back, with its body, after a dirty start."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from msg_store_helpers import body

from broker.store.msg_store import MsgStore

CHILD = r"""
import asyncio, sys
from pathlib import Path
import structlog
from broker.store.msg_store import MsgStore
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout: ids only

def body(i, size):
    return i.to_bytes(8, "big") * (size // 8) + b"#" * (size % 8)

class Printer:
    n = 0
    caught_up = asyncio.Event()
    def msgs_durable(self, ids):
        sys.stdout.write(" ".join(map(str, ids)) + "\n")
        sys.stdout.flush()
        self.n += len(ids)
        self.caught_up.set()
    def msgs_failed(self, ids, error):
        raise SystemExit(str(error))

async def main():
    store = MsgStore(Path(sys.argv[1]), file_size_limit=20_000, fsync="batch")
    await store.start()
    client = Printer()
    i = 0
    while True:
        for _ in range(50):
            i += 1
            store.write(i, body(i, 300 + i % 500), client)
            if i % 4 and i > 3000:  # 3 in 4 go again once written: holes, compactions
                store.remove(i - 3000)
        await asyncio.sleep(0)
        while i - client.n > 2000:  # a bounded backlog, as credit flow gives the queues
            client.caught_up.clear()
            await client.caught_up.wait()

asyncio.run(main())
"""


def test_confirmed_messages_survive_kill_9(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "child.log"
    with open(log, "wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(directory)],
            stdout=subprocess.PIPE, stderr=stderr, env=env, text=True,
        )
    confirmed: list[int] = []
    try:
        assert child.stdout is not None
        while len(confirmed) < 30_000 or b"compacted" not in log.read_bytes():
            line = child.stdout.readline()
            assert line, "the child died before confirming enough messages"
            confirmed.extend(int(x) for x in line.split())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    wanted = {i: 1 for i in confirmed if i % 4 == 0}

    async def recover() -> None:
        store = MsgStore(directory, file_size_limit=20_000)
        report = await store.start(lambda: wanted)
        try:
            assert not report.clean
            assert report.missing == 0
            for i in wanted:
                assert store.read(i) == body(i, 300 + i % 500)
        finally:
            await store.stop()

    asyncio.run(recover())
    assert b"compacted" in log.read_bytes()  # the kill came while files were being combined
