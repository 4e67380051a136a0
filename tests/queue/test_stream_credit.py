"""A stream's credit to its publishers: given back at once while its log keeps up, held until
their chunks are committed once more than UNWRITTEN_BYTES wait to be written. So a disk that
stalls blocks the publishers (credit flow carries it up to their sockets) and the RAM the
stream holds for them stays bounded. In process: a real StreamLog on a disk whose writes wait
on an event, and a publishing peer with its own CreditFlow as a channel has."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from broker.flow.credit_flow import CreditFlow
from broker.message import Message
from broker.queue.stream_queue import UNWRITTEN_BYTES, StreamQueue
from broker.store.segment import FileWriter
from broker.store.stream_log import StreamLog
from broker.vhost import VHost


class StalledDisk(FileWriter):
    """Writes wait until `go` is set (a disk that stopped answering)."""

    def __init__(self) -> None:
        self.go = threading.Event()

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        self.go.wait(30)
        super().pwrite(fd, data, offset)


class Publisher:
    """What a publishing channel is to a queue: a credit-flow peer that hears confirms."""

    def __init__(self) -> None:
        self.credit_flow = CreditFlow(self, 400, 200)
        self.confirmed: list[int] = []

    def queue_confirmed(self, queue: object, seqs: list[int], rejected: list[int]) -> None:
        self.confirmed.extend(seqs)


async def test_a_stalled_disk_blocks_publishers_and_bounds_ram(tmp_path: Path) -> None:
    slog = StreamLog(tmp_path / "s", name="s")
    disk = slog.file_writer = StalledDisk()
    q = StreamQueue(VHost("/"), "s", arguments={"x-queue-type": "stream"})
    q.log = slog
    slog.open_now()
    q.start()
    pub = Publisher()
    body = b"x" * 64 * 1024
    seq = 0
    try:
        # while little waits to be written, credit comes back with each batch, before any
        # commit: 1,000 small messages pass the 400 of initial credit without a write
        for _ in range(100):
            pub.credit_flow.send_many(q, 10)
            q.post_publishes(pub, [(Message("", "s", b"\x00\x00", b"small"),
                                    seq := seq + 1) for _ in range(10)])
            await asyncio.sleep(0)
        assert not pub.credit_flow.blocked() and pub.confirmed == []
        # the disk stalls: once UNWRITTEN_BYTES wait, credit stops and the publisher blocks
        sent = 0
        while not pub.credit_flow.blocked():
            pub.credit_flow.send_many(q, 10)
            q.post_publishes(pub, [(Message("", "s", b"\x00\x00", body), seq := seq + 1)
                                   for _ in range(10)])
            sent += 10
            assert sent < 2000, "never blocked"
        assert slog.unwritten_bytes <= UNWRITTEN_BYTES + 400 * len(body)
        assert pub.confirmed == []
        disk.go.set()  # the disk answers again: the chunks commit, credit and confirms come
        await slog.sync()
        assert not pub.credit_flow.blocked()
        assert pub.confirmed == list(range(1, seq + 1))
        assert slog.unwritten_bytes == 0
    finally:
        disk.go.set()
        await slog.close()
