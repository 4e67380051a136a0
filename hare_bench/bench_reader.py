"""Micro-benchmark: the publish path from bytes to queue, without a socket.

Run: .venv/bin/python -m hare_bench.bench_reader [--messages N] [--per-chunk K] [--size B]
                                                   [--write-pattern REGEX]

A Node runs in this process (its listener is on a free port and unused); one Reader gets a
stand-in transport and is fed the bytes a client would send: the handshake, then N publishes
to a queue in chunks of K, the loop running between chunks so the channel and queue tasks
take them. What is measured is Reader.data_received + the channel task + the queue's enqueue:
the hot path. With no I/O the run is deterministic, so instruction counts compare cleanly:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python -m hare_bench.bench_reader --messages 20000
    (the "Collected" line; subtract a --messages 0 run for the start-up)

`--write-pattern` gives the publishing user (guest) that write permission instead of `.*`
(e.g. `^amq\\.default$`): a narrow pattern must cost no more per publish than `.*`, the
check being cached per channel (docs/BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from pamqp import commands

from broker.config import Settings
from broker.logs import configure_logging
from broker.node import Node
from broker.protocol import frames
from broker.protocol.constants import PROTOCOL_HEADER
from broker.server.reader import Reader

__all__ = ["main"]


class _Transport:
    """Just enough of asyncio.Transport for a Reader: writes are counted and dropped."""

    def __init__(self) -> None:
        self.written = 0
        self.paused = False
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


def handshake_frames(*extra: Any) -> list[bytes]:
    """A client's side of the handshake up to an open channel 1, then `extra` methods on it."""
    return [
        PROTOCOL_HEADER,
        frames.encode_method(
            0,
            commands.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response="\0guest\0guest"
            ),
        ),
        frames.encode_method(
            0, commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0)
        ),
        frames.encode_method(0, commands.Connection.Open(virtual_host="/")),
        frames.encode_method(1, commands.Channel.Open()),
        *(frames.encode_method(1, method) for method in extra),
    ]


async def _settle(reader: Reader, transport: _Transport) -> None:
    """Run the loop until the channels have taken everything and reading is not paused."""
    for _ in range(10_000):
        await asyncio.sleep(0)
        if not transport.paused and not any(len(ch.mailbox) for ch in reader.channels.values()):
            return
    raise RuntimeError("the publish path did not settle")


async def run(data_dir: Path, messages: int, per_chunk: int, size: int,
              write_pattern: str = ".*") -> float:
    settings = Settings(data_dir=data_dir, port=0, management_port=0, heartbeat_s=0)
    node = Node(settings)
    await node.start()
    node.users.set_permissions("guest", "/", ".*", write_pattern, ".*")
    try:
        reader = Reader(node)
        transport = _Transport()
        reader.connection_made(transport)  # type: ignore[arg-type]
        for chunk in handshake_frames(commands.Queue.Declare(queue="bench-reader")):
            reader.data_received(chunk)
            await _settle(reader, transport)
        one = b"".join(
            [
                frames.encode_method(
                    1, commands.Basic.Publish(exchange="", routing_key="bench-reader")
                ),
                *frames.encode_content(1, b"\x00\x00", bytes(size), 131072),
            ]
        )
        chunk = one * per_chunk
        started = time.perf_counter()
        for _ in range(messages // per_chunk):
            reader.data_received(chunk)
            await _settle(reader, transport)
        elapsed = time.perf_counter() - started
        queued = node.vhosts["/"].queues["bench-reader"].message_count
        if queued != messages // per_chunk * per_chunk:
            raise RuntimeError(f"{queued} messages queued")
        reader.connection_lost(None)
        return elapsed
    finally:
        await node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--per-chunk", type=int, default=50)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--write-pattern", default=".*",
                        help="the publisher's write permission (default .*)")
    args = parser.parse_args()
    configure_logging("warning", "console")
    with tempfile.TemporaryDirectory() as d:
        elapsed = asyncio.run(run(Path(d), args.messages, args.per_chunk, args.size,
                                  args.write_pattern))
    if args.messages:
        print(
            f"{args.messages} publishes of {args.size} B in chunks of {args.per_chunk}: "
            f"{elapsed:.3f} s, {elapsed / args.messages * 1e9:.0f} ns/publish"
        )


if __name__ == "__main__":
    main()
