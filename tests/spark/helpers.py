"""Small helpers of the Spark tests: publish with pika, read queue counts, wait for a state."""

from __future__ import annotations

import os
import signal
import time
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pika

from tests.mgmt.helpers import MgmtBroker


def publish(url: str, queue: str, bodies: Iterable[bytes],
            props: Callable[[int], pika.BasicProperties] | None = None) -> int:
    """Declare `queue` and publish the bodies to it through the default exchange, confirmed."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.confirm_delivery()
        count = 0
        for i, body in enumerate(bodies):
            channel.basic_publish("", queue, body, props(i) if props else None)
            count += 1
        return count
    finally:
        connection.close()


def counts(hare: MgmtBroker, queue: str) -> tuple[int, int, int]:
    """(ready, unacked, consumers) of a queue in vhost "/"."""
    info = hare.get(f"/api/queues/%2F/{urllib.parse.quote(queue, safe='')}")
    return (int(info["messages_ready"]), int(info["messages_unacknowledged"]),
            int(info["consumers"]))


def wait_for(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something true; fail with its last value."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout}s; last value {value!r}")
        time.sleep(0.1)
        value = check()
    return value


def source_runners(jvm_pid: int) -> list[int]:
    """PIDs of the JVM's Python streaming source runners (one per running amqp source)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == jvm_pid and b"python_streaming_source_runner" in cmdline:
            found.append(int(proc.name))
    return found


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
