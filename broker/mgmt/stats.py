"""Counters and rates for the management API and the metrics (rabbit_mgmt_* in miniature).

Queues and channels count what they did since they were created; when one goes away its
counts would vanish from the node's totals. The sampler remembers every object's last counts
and folds them into `retired` when the object disappears, so node totals only ever grow (what
happened between the last sample and the deletion is lost: at most one interval). Every
`interval` seconds it also turns the change of each counter into a per-second rate."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from broker.node import Node
    from broker.queue.amqqueue import AMQQueue
    from broker.server.channel import Channel
    from broker.server.reader import Reader
    from broker.store.msg_store import MsgStore

__all__ = [
    "CHANNEL_COUNTERS", "QUEUE_COUNTERS", "Stats", "channels", "details", "opened_connections",
    "queues", "stores",
]

log = structlog.get_logger("hare.mgmt")

SAMPLE_INTERVAL_S = 5.0

# RabbitMQ's message_stats names -> the attribute that counts it on the object.
QUEUE_COUNTERS: dict[str, str] = {
    "publish": "published",
    "deliver_get": "delivered",
    "ack": "acked",
    "redeliver": "redelivered",
}
# confirm/return_unroutable light up once Channel grows those counters (read with getattr).
CHANNEL_COUNTERS: dict[str, str] = {
    "publish": "published",
    "confirm": "confirmed",
    "return_unroutable": "returned",
}


def queues(node: Node) -> Iterator[AMQQueue]:
    for vhost in list(node.vhosts.values()):
        yield from list(vhost.queues.values())


def channels(node: Node) -> Iterator[Channel]:
    for conn in list(node.connections):
        yield from list(conn.channels.values())


def opened_connections(node: Node) -> list[Reader]:
    """Connections past connection.open (RabbitMQ lists no half-open ones)."""
    return [conn for conn in list(node.connections) if conn.vhost is not None]


def stores(node: Node) -> list[MsgStore]:
    """The node's message stores (persistent, transient), once they have started."""
    durable = getattr(node, "durable", None)
    return [s for s in (getattr(durable, "persistent", None),
                        getattr(durable, "transient", None)) if s is not None]


def _counts(obj: object, names: dict[str, str]) -> dict[str, int]:
    return {key: int(getattr(obj, attr, 0) or 0) for key, attr in names.items()}


def _depth(q: AMQQueue) -> dict[str, int]:
    info = q.info()
    return {k: int(info.get(k, 0)) for k in ("messages", "messages_ready",
                                              "messages_unacknowledged")}


class Stats:
    """Samples the node's queues and channels; `clock` is injectable for tests."""

    def __init__(self, node: Node, interval: float = SAMPLE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.interval = interval
        self.clock = clock
        self.retired_q: dict[str, int] = dict.fromkeys(QUEUE_COUNTERS, 0)
        self.retired_ch: dict[str, int] = dict.fromkeys(CHANNEL_COUNTERS, 0)
        self._last_q: dict[AMQQueue, dict[str, int]] = {}
        self._last_ch: dict[Channel, dict[str, int]] = {}
        # retired by the hook, until a sample finds them gone from the node (held, not weakly:
        # the compiled Channel, a mypyc class, takes no weak reference)
        self._closed_ch: set[Channel] = set()
        self.queue_rates: dict[AMQQueue, dict[str, float]] = {}
        self.node_rates: dict[str, float] = {}
        self._last_totals: dict[str, int] | None = None
        self._last_time: float | None = None  # no sample yet
        self._task: asyncio.Task[None] | None = None

    # -- totals, exact at the time of the call ------------------------------------------------
    def queue_totals(self) -> dict[str, int]:
        """publish/deliver_get/ack/redeliver into queues, deleted ones included."""
        out = dict(self.retired_q)
        for q in queues(self.node):
            for key, n in _counts(q, QUEUE_COUNTERS).items():
                out[key] += n
        return out

    def channel_totals(self) -> dict[str, int]:
        """publish/confirm/return_unroutable on channels, closed ones included."""
        out = dict(self.retired_ch)
        for ch in self._live_channels():
            for key, n in _counts(ch, CHANNEL_COUNTERS).items():
                out[key] += n
        return out

    def _live_channels(self) -> Iterator[Channel]:
        closed = self._closed_ch
        return (ch for ch in channels(self.node) if ch not in closed)

    def depth_totals(self) -> dict[str, int]:
        out = {"messages": 0, "messages_ready": 0, "messages_unacknowledged": 0}
        for q in queues(self.node):
            for key, n in _depth(q).items():
                out[key] += n
        return out

    def totals(self) -> dict[str, int]:
        """One flat dict: channel publishes as `publish` (what clients sent, as RabbitMQ's
        overview), queue-side counts as `deliver_get`, `ack`, `redeliver`, plus depths."""
        q = self.queue_totals()
        ch = self.channel_totals()
        return {
            "publish": ch["publish"],
            "confirm": ch["confirm"],
            "return_unroutable": ch["return_unroutable"],
            "publish_in": q["publish"],
            "deliver_get": q["deliver_get"],
            "ack": q["ack"],
            "redeliver": q["redeliver"],
            **self.depth_totals(),
        }

    def channel_closed(self, ch: Channel) -> None:
        """Fold a closing channel's final counts into the totals at once (for a hook in the
        channel's termination; without it they are folded at the next sample, and what a
        channel did after the previous sample is lost)."""
        for key, n in _counts(ch, CHANNEL_COUNTERS).items():
            self.retired_ch[key] += n
        self._last_ch.pop(ch, None)
        self._closed_ch.add(ch)

    # -- rates --------------------------------------------------------------------------------
    def sample(self) -> None:
        now = self.clock()
        dt = now - self._last_time if self._last_time is not None else 0.0
        live_q: dict[AMQQueue, dict[str, int]] = {}
        rates: dict[AMQQueue, dict[str, float]] = {}
        for q in queues(self.node):
            cur = {**_counts(q, QUEUE_COUNTERS), **_depth(q)}
            live_q[q] = cur
            prev = self._last_q.get(q)
            if prev is None and self._last_time is not None:
                # created since the last sample, with every counter at zero then
                prev = dict.fromkeys(cur, 0)
            rates[q] = {k: (v - prev[k]) / dt if prev and dt > 0 else 0.0
                        for k, v in cur.items()}
        for q, last in self._last_q.items():
            if q not in live_q:
                for key in QUEUE_COUNTERS:
                    self.retired_q[key] += last[key]
        self._last_q = live_q
        self.queue_rates = rates
        self._closed_ch.intersection_update(channels(self.node))
        live_ch = {ch: _counts(ch, CHANNEL_COUNTERS) for ch in self._live_channels()}
        for ch, last in self._last_ch.items():
            if ch not in live_ch:
                for key, n in last.items():
                    self.retired_ch[key] += n
        self._last_ch = live_ch
        totals = self.totals()
        prev_totals = self._last_totals
        self.node_rates = {k: (v - prev_totals[k]) / dt if prev_totals and dt > 0 else 0.0
                           for k, v in totals.items()}
        self._last_totals = totals
        self._last_time = now

    def rate(self, q: AMQQueue, key: str) -> float:
        return round(self.queue_rates.get(q, {}).get(key, 0.0), 1)

    def node_rate(self, key: str) -> float:
        return round(self.node_rates.get(key, 0.0), 1)

    # -- the sampling task --------------------------------------------------------------------
    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="mgmt:stats")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.sample()
            except Exception:  # a bad object must not stop the rates for good
                log.exception("stats sample failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def details(rate: float) -> dict[str, Any]:
    return {"rate": rate}
