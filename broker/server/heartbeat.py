"""Heartbeats of an open connection (RabbitMQ's rabbit_heartbeat): a tick twice per negotiated
interval sends a heartbeat frame if nothing else went out, and closes the socket after two
intervals with nothing read. The reader marks reads (`_recv_activity`), the writer marks
writes (`activity`); the tick runs on the reader's one timer, which closing cancels."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from broker.protocol import frames
from broker.protocol.connection_state import ConnectionState

if TYPE_CHECKING:
    from broker.server.reader import Reader

__all__ = ["Heartbeat"]

log = structlog.get_logger("hare.connection")

# ticks without a read before the client is given up: two intervals, ticking twice an interval
MISSED_TICKS = 4


class Heartbeat:
    __slots__ = ("_missed", "reader")

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self._missed = 0

    def start(self) -> None:
        r = self.reader
        r._timer = r.loop.call_later(r.heartbeat / 2, self._tick)

    def _tick(self) -> None:
        r = self.reader
        r._timer = None
        if r.state != ConnectionState.OPENED:
            return
        if r._recv_activity:
            r._recv_activity = False
            self._missed = 0
        else:
            self._missed += 1
            if self._missed >= MISSED_TICKS:
                log.warning(
                    "missed heartbeats from client",
                    conn=r.name,
                    peer=r._peer(),
                    timeout_s=r.heartbeat,
                )
                r._close_transport()
                return
        if not r.writer.activity:
            r.writer.send(frames.HEARTBEAT_FRAME)
        r.writer.activity = False
        self.start()
