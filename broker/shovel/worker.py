"""One running shovel: an AMQP client of its source and destination (aio-pika), consuming with
prefetch and republishing; under on-confirm the source delivery is acked only once the
destination confirmed it, so a message is lost by no failure and duplicated only when a
connection drops between the publish and the ack (as RabbitMQ's plugin); a stop (a changed
definition, a move to another worker) first finishes what the session holds. Either side going
away ends the session; the shovel shows why and tries again after its reconnect delay,
doubling up to a cap. It runs as its own task: nothing in the broker waits on it."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from typing import Any

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractQueue
from aiormq import Channel as RawChannel
from aiormq.abc import DeliveredMessage
from aiormq.exceptions import ChannelNotFoundEntity, DeliveryError

from broker.amqp_uri import LocalBroker, ReconnectBackoff, redacted
from broker.shovel.definition import ShovelDefinition

__all__ = ["Shovel"]

log = structlog.get_logger("hare.shovel")


class Shovel:
    """`user`: who it acts as on this broker (the defining user; the node's default user for
    a static shovel). A static shovel has no vhost of its own: its local URIs mean "/"."""

    def __init__(self, vhost: str, name: str, definition: ShovelDefinition, local: LocalBroker,
                 on_finished: Callable[[Shovel], None], *, user: str,
                 static: bool = False) -> None:
        self.vhost, self.name, self.definition = vhost, name, definition
        self.user, self.static = user, static
        self._local = local
        self._on_finished = on_finished
        self.state = "starting"
        self.reason: str | None = None
        self.since = time.time()
        self.moved = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()  # stop(): finish what is in flight, then end
        self._urls: dict[str, str] = {}  # side -> the URL it is connected with

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"shovel {self.vhost}/{self.name}")

    async def stop(self, grace_s: float = 5.0) -> None:
        """A stop first lets the session cancel its consumer and finish the messages it
        holds (each forwarded is confirmed then acked), so a shovel moving to another worker
        or restarting with a new definition duplicates none. Past `grace_s`, or with no
        session running (connecting, waiting to reconnect), it is cancelled: what was in
        flight comes back to the source (at least once, as after a failure)."""
        task, self._task = self._task, None
        self._stopping.set()
        if task is not None and not task.done() and self.state == "running":
            await asyncio.wait({task}, timeout=grace_s)
        # a cancel landing while aiormq opens a channel is swallowed there ("cancelled before
        # Channel.Open was sent") and the session went on to consume: cancel until it ends
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)

    def status(self) -> dict[str, Any]:
        d = self.definition
        out: dict[str, Any] = {
            "name": self.name, "type": "static" if self.static else "dynamic",
            "state": self.state,
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.since)),
            "src_protocol": "amqp091", "dest_protocol": "amqp091",
            "src_uri": redacted(d.src_uris[0]), "dest_uri": redacted(d.dest_uris[0]),
            "messages_moved": self.moved,
        }
        if not self.static:  # the plugin's static shovels belong to no vhost
            out["vhost"] = self.vhost
        for key, value in (("src_queue", d.src_queue), ("src_exchange", d.src_exchange),
                           ("dest_queue", d.dest_queue), ("dest_exchange", d.dest_exchange)):
            if value is not None:
                out[key] = value
        if self.reason is not None:
            out["reason"] = self.reason
        return out

    def _set(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason, self.since = state, reason, time.time()

    async def _run(self) -> None:
        backoff = ReconnectBackoff(self.definition.reconnect_delay_s)
        while True:
            self._set("starting", self.reason)
            moved = self.moved
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of either side: show it, retry later
                if self._stopping.is_set():
                    return
                self._set("terminated", f"{type(exc).__name__}: {exc}")
                log.warning("shovel failed", vhost=self.vhost, shovel=self.name,
                            reason=self.reason)
            else:
                if self._stopping.is_set():
                    return
                self._set("terminated", "src-delete-after reached")
                self._on_finished(self)
                return
            delay = backoff.next_delay(progressed=self.moved > moved)  # it moved messages
            if delay is None:
                return
            await asyncio.sleep(delay)

    async def _connect(self, uris: tuple[str, ...], side: str) -> AbstractConnection:
        error: Exception | None = None
        for uri in uris:  # the plugin's list of URIs: the first that answers
            url = self._local.resolve(uri, self.vhost, self.user)
            try:
                conn = await aio_pika.connect(
                    url, timeout=10,
                    client_properties={"connection_name": f"Shovel {self.name} ({side})"})
                self._urls[side] = url
                return conn
            except Exception as exc:
                error = exc
        raise ConnectionError(f"{side}: {error}")

    async def _session(self) -> None:
        """Until the source is done (src-delete-after) or either side fails."""
        d = self.definition
        src = await self._connect(d.src_uris, "source")
        try:
            dest = await self._connect(d.dest_uris, "destination")
        except BaseException:
            await src.close()
            raise
        try:
            await self._shovel(src, dest)
        finally:
            for conn in (src, dest):
                if not conn.is_closed:
                    await conn.close()

    async def _shovel(self, src: AbstractConnection, dest: AbstractConnection) -> None:
        d = self.definition
        closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def on_close(*args: Any) -> None:
            if not closed.done():
                closed.set_result(str(args[-1]) if len(args) > 1 else "connection closed")

        dest_ch = await dest.channel(publisher_confirms=d.ack_mode == "on-confirm")
        src_ch = await src.channel()
        for part in (src, dest, src_ch, dest_ch):
            part.close_callbacks.add(on_close)
        if d.dest_queue is not None:
            await _declare(self._urls["destination"], dest_ch, d.dest_queue)
        queue, remaining = await self._source(src, src_ch)
        if remaining == 0:
            return
        await src_ch.set_qos(prefetch_count=d.prefetch)
        # The hot path talks to aiormq's channels under aio-pika's: aio-pika publishes with
        # wait=True, holding the channel's lock until each publish is written, which makes
        # publishes one per writer turn (and wraps every delivery in an IncomingMessage).
        src_raw, dest_raw = (await src_ch.get_underlay_channel(),
                             await dest_ch.get_underlay_channel())
        assert isinstance(src_raw, RawChannel) and isinstance(dest_raw, RawChannel)
        pending: set[asyncio.Task[Any]] = set()
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def on_message(msg: DeliveredMessage) -> None:
            nonlocal remaining
            if remaining is not None:
                if remaining <= 0:
                    return  # past the count: left unacked, so the source keeps it
                remaining -= 1
                if remaining == 0 and not finished.done():
                    finished.set_result(None)
            # aiormq runs each delivery in a task of its own, in delivery order; each writes
            # its publish before it first waits, so publishes leave in that order and their
            # confirms are awaited side by side, up to the prefetch
            task = asyncio.current_task()
            assert task is not None
            pending.add(task)
            task.add_done_callback(pending.discard)
            await self._forward(dest_raw, src_raw, msg)

        if self._stopping.is_set():
            return
        ok = await src_raw.basic_consume(queue.name, on_message,
                                         no_ack=d.ack_mode == "no-ack")
        self._set("running")
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((finished, closed, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if closed.done():
            raise ConnectionError(closed.result())
        if not finished.done():  # stopping: no delivery after the cancel-ok, then drain
            assert ok.consumer_tag is not None
            await src_raw.basic_cancel(ok.consumer_tag)
            await asyncio.sleep(0)  # deliveries read before the cancel-ok start their tasks
        await asyncio.gather(*pending)

    async def _source(self, src: AbstractConnection, ch: AbstractChannel
                      ) -> tuple[AbstractQueue, int | None]:
        """The queue consumed from, and how many messages to move (None: no end)."""
        d = self.definition
        if d.src_queue is not None:
            queue = await _declare(self._urls["source"], ch, d.src_queue)
        else:
            assert d.src_exchange is not None
            queue = await ch.declare_queue(exclusive=True)
            await queue.bind(d.src_exchange, d.src_exchange_key)
        if d.delete_after == "queue-length":
            return queue, queue.declaration_result.message_count or 0
        return queue, None if d.delete_after == "never" else int(d.delete_after)

    async def _forward(self, dest: RawChannel, src: RawChannel, msg: DeliveredMessage) -> None:
        d = self.definition
        props = msg.header.properties
        if props.user_id is not None:  # the destination checks it against its own login
            props = copy.copy(props)
            props.user_id = None
        if d.dest_queue is not None:
            exchange, key = "", d.dest_queue
        elif d.dest_exchange is not None:
            exchange, key = d.dest_exchange, d.dest_exchange_key or msg.routing_key or ""
        else:  # neither: where the message was published, as the plugin
            exchange, key = msg.exchange or "", msg.routing_key or ""
        tag = msg.delivery_tag
        assert tag is not None
        try:
            # on-confirm: returns once the destination confirmed (a nack raises)
            await dest.basic_publish(msg.body, exchange=exchange, routing_key=key,
                                     properties=props, wait=False)
        except DeliveryError:
            if d.ack_mode != "no-ack":  # the destination refused it: keep it at the source
                await src.basic_nack(tag, requeue=True, wait=False)
            return
        if d.ack_mode != "no-ack":
            await src.basic_ack(tag, wait=False)
        self.moved += 1


async def _declare(url: str, ch: AbstractChannel, name: str) -> AbstractQueue:
    """The queue as it is; declared durable when missing (the plugin declares it). The probe
    is a connection of its own: closing a probe channel on the shovel's own connection was
    seen to stall the other channels of that connection on Hare (reported; see SHOVEL.md)."""
    async with await aio_pika.connect(url, timeout=10) as probe:
        try:
            await (await probe.channel()).declare_queue(name, passive=True)
        except ChannelNotFoundEntity:
            return await ch.declare_queue(name, durable=True)
    return await ch.declare_queue(name, passive=True)

