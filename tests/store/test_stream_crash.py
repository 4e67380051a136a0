"""kill -9 a process appending to a stream: every message it was told is committed comes back
with its offset and body, and the stream goes on after it without reusing an offset."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from broker.message import Message
from broker.store.stream_log import StreamLog
from broker.store.stream_reader import StreamReader

CHILD = r"""
import asyncio, sys
from pathlib import Path
import structlog
from broker.message import Message
from broker.store.stream_log import StreamLog
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout: offsets

def body(i):
    return i.to_bytes(8, "big") * (1 + i % 40)

async def main():
    caught_up = asyncio.Event()
    def committed(offset):
        sys.stdout.write(f"{offset}\n")
        caught_up.set()
    slog = StreamLog(Path(sys.argv[1]), name="crash", max_segment_bytes=64_000, fsync="batch",
                     on_commit=committed)
    await slog.open()
    i = slog.next_offset
    while True:
        slog.append([Message("", "k", b"\x00\x00", body(j)) for j in range(i, i + 37)])
        i += 37
        await asyncio.sleep(0)
        while i - slog.committed > 2000:
            caught_up.clear()
            await caught_up.wait()

asyncio.run(main())
"""


def run_and_kill(directory: Path, log: Path, at_least: int) -> int:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as stderr:
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(directory)],
                                 stdout=subprocess.PIPE, stderr=stderr, env=env, text=True)
    committed = 0
    try:
        assert child.stdout is not None
        while committed < at_least:
            line = child.stdout.readline()
            assert line, f"the child died: {log.read_text()[-2000:]}"
            committed = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return committed


def test_committed_messages_survive_kill_9(tmp_path: Path) -> None:
    directory = tmp_path / "stream"
    first = run_and_kill(directory, tmp_path / "child1.log", 20_000)
    second = run_and_kill(directory, tmp_path / "child2.log", first + 10_000)

    async def check() -> None:
        slog = StreamLog(directory, name="crash", max_segment_bytes=64_000)
        await slog.open()
        try:
            assert slog.committed >= second > first
            reader = StreamReader(slog, 0)
            expected = 0
            while got := reader.read(1000):
                for offset, m in got:
                    # each message carries its own offset in its body: none reused or lost
                    assert offset == expected
                    assert m.body == offset.to_bytes(8, "big") * (1 + offset % 40)
                    expected += 1
            assert expected == slog.committed
            reader.close()
            assert slog.append([Message("", "k", b"\x00\x00", b"after")]) == slog.committed
        finally:
            await slog.close()

    asyncio.run(check())
