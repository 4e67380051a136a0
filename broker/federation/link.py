"""Federation links: one per (downstream exchange or queue, upstream), each an asyncio task
that is an AMQP client (aio-pika) of the upstream and of this broker, as the plugin's links.

An exchange link declares on the upstream a durable queue `federation: X -> NODE` bound,
through an internal fanout exchange `federation: X -> NODE A` (or `B`), to the upstream
exchange with the downstream exchange's binding keys; it republishes what arrives into the
downstream exchange with an `x-received-from` entry, and acks upstream once this broker
confirmed (on-confirm). A queue link consumes the upstream queue (consumer priority -1, so
the upstream's own consumers come first) only while the downstream queue has consumers and
no messages, and moves what it gets into it.

A session ends when either connection or channel goes; the link shows the error and starts
again after reconnect-delay, doubling up to 30 s. Nothing in the broker waits on a link."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
import structlog
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)
from aiormq.exceptions import ChannelNotFoundEntity

from broker.amqp_uri import LocalBroker, ReconnectBackoff, uri_vhost, without_credentials
from broker.federation.upstream import (
    BINDING_HEADER,
    ROUTING_HEADER,
    Upstream,
    binding_hops,
    should_forward,
)

__all__ = ["ExchangeLink", "Link", "QueueLink", "upstream_queue_name"]

log = structlog.get_logger("hare.federation")

DEMAND_POLL_S = 0.1  # how often a queue link looks at its downstream queue
_PROPERTIES = ("content_type", "content_encoding", "delivery_mode", "priority",
               "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
               "app_id")


def upstream_queue_name(upstream_x: str, upstream_vhost: str, node: str, down_vhost: str,
                        down_x: str) -> str:
    """The plugin's name for the upstream queue of an exchange link."""
    if down_vhost != upstream_vhost:
        suffix = f":{down_vhost}:{down_x}"
    else:
        suffix = "" if down_x == upstream_x else f":{down_x}"
    return f"federation: {upstream_x} -> {node}{suffix}"


class Link:
    """What exchange and queue links share: the reconnect loop, the state shown at
    /api/federation-links, the connections."""

    kind = ""

    def __init__(self, vhost: str, name: str, upstream: Upstream, node: str,
                 local: LocalBroker, *, user: str) -> None:
        self.vhost, self.name, self.upstream, self.node = vhost, name, upstream, node
        self._local, self.user = local, user
        self.status = "starting"
        self.error: str | None = None
        self.since = time.time()
        self.uri = upstream.uris[0]  # the one connected to (the first that answers)
        self.upstream_name = "unknown"  # the upstream's cluster_name, once connected
        self.upstream_vhost = vhost
        self._url = ""  # the upstream URL connected with
        self._cleanup = False
        self.ran = False  # the current session got to running
        self._task: asyncio.Task[None] | None = None

    @property
    def upstream_object(self) -> str:
        return self.name

    def start(self) -> None:
        self._task = asyncio.create_task(
            self._run(), name=f"federation {self.kind} {self.vhost}/{self.name}")

    async def stop(self, cleanup: bool = False) -> None:
        """`cleanup`: the link is gone for good (its policy or exchange went), so what it
        declared on the upstream goes too, as the plugin's; not at a node's stop, so the
        upstream keeps collecting for when this broker is back."""
        self._cleanup = cleanup
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def row(self, node: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node": node, "vhost": self.vhost, "type": self.kind, self.kind: self.name,
            f"upstream_{self.kind}": self.upstream_object, "upstream": self.upstream.name,
            "id": f"{self.kind}:{self.vhost}:{self.name}:{self.upstream.name}",
            "status": self.status, "uri": without_credentials(self.uri),
            "local_connection": f"Federation link (downstream) {self.upstream.name}",
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.since)),
        }
        if self.error is not None:
            out["error"] = self.error
        return out

    def _set(self, status: str, error: str | None = None) -> None:
        self.status, self.error, self.since = status, error, time.time()
        self.ran = self.ran or status == "running"

    async def _run(self) -> None:
        backoff = ReconnectBackoff(self.upstream.reconnect_delay_s)
        while True:
            self._set("starting", self.error)
            self.ran = False
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # either side failed: show it, try again later
                text = str(exc)
                self._set("error", f"{type(exc).__name__}: {text}" if text else
                          type(exc).__name__)
                log.warning("federation link failed", vhost=self.vhost, link=self.kind,
                            name=self.name, upstream=self.upstream.name, reason=self.error)
            delay = backoff.next_delay(progressed=self.ran)  # it got to running
            if delay is None:
                return
            await asyncio.sleep(delay)

    async def _session(self) -> None:
        """Connect both sides and federate until something fails (raises)."""
        up = await self._connect_upstream()
        try:
            down = await aio_pika.connect(
                self._local.resolve("amqp://", self.vhost, self.user), timeout=10,
                client_properties={"connection_name":
                                   f"Federation link (downstream) {self.upstream.name}"})
        except BaseException:
            await up.close()
            raise
        forwarder = _Forwarder(self, acks=self.upstream.ack_mode != "no-ack")
        try:
            await self._federate(up, down, _closed_future(up, down), forwarder)
        finally:
            await forwarder.close()
            if self._cleanup and not up.is_closed:
                await self._clean_upstream(up)
            for conn in (up, down):
                if not conn.is_closed:
                    await conn.close()

    async def _connect_upstream(self) -> AbstractConnection:
        error: Exception | None = None
        for uri in self.upstream.uris:  # the plugin's list of URIs: the first that answers
            url = self._local.resolve(uri, self.vhost, self.user)
            parts = urlsplit(url)
            if parts.path in ("", "/"):  # no vhost named: the downstream's, as the plugin
                url = urlunsplit(parts._replace(path="/" + quote(self.vhost, safe="")))
            try:
                conn = await aio_pika.connect(url, timeout=10, client_properties={
                    "connection_name": f"Federation link (upstream) {self.vhost}/{self.name}"})
            except Exception as exc:
                error = exc
                continue
            self.uri, self._url = uri, url
            self.upstream_vhost = uri_vhost(url, self.vhost)
            props = conn.transport.connection.server_properties if conn.transport else {}
            name = props.get("cluster_name")
            self.upstream_name = name.decode() if isinstance(name, bytes) else str(
                name or "unknown")
            return conn
        raise ConnectionError(f"upstream: {error}")

    async def _federate(self, up: AbstractConnection, down: AbstractConnection,
                        closed: asyncio.Future[str], forwarder: _Forwarder) -> None:
        raise NotImplementedError

    async def _clean_upstream(self, up: AbstractConnection) -> None:
        """What the link declared on the upstream, deleted (a queue link declares nothing of
        its own)."""

    # -- forwarding -------------------------------------------------------------------------
    def _entry(self, msg: AbstractIncomingMessage) -> dict[str, Any]:
        return {"uri": without_credentials(self.uri), self.kind: self.upstream_object,
                "redelivered": bool(msg.redelivered), "cluster-name": self.upstream_name,
                "vhost": self.upstream_vhost}

    async def publish(self, msg: AbstractIncomingMessage, target: AbstractExchange,
                      key: str) -> bool:
        """Republish downstream with this link's x-received-from entry first; False when
        this broker refused it (a nack under on-confirm)."""
        u = self.upstream
        props = {k: getattr(msg, k) for k in _PROPERTIES if getattr(msg, k) is not None}
        if u.trust_user_id and msg.user_id is not None:
            props["user_id"] = msg.user_id  # else cleared, as the plugin
        headers = dict(msg.headers or {})
        seen = headers.get(ROUTING_HEADER)
        headers[ROUTING_HEADER] = [self._entry(msg), *(seen if isinstance(seen, list) else [])]
        try:
            # not mandatory, as the plugin: routed nowhere here is dropped here, not returned
            # (and nacked back upstream, to come again)
            await target.publish(aio_pika.Message(msg.body, headers=headers, **props), key,
                                 mandatory=False)
        except aio_pika.exceptions.DeliveryError:
            return False
        return True


def _closed_future(*parts: AbstractConnection) -> asyncio.Future[str]:
    closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_close(*args: Any) -> None:
        if not closed.done():
            closed.set_result(str(args[-1]) if len(args) > 1 else "connection closed")

    for part in parts:
        part.close_callbacks.add(on_close)
    return closed


def _watch(closed: asyncio.Future[str], *channels: AbstractChannel) -> None:
    for ch in channels:
        ch.close_callbacks.add(lambda *args: None if closed.done() else closed.set_result(
            str(args[-1]) if len(args) > 1 else "channel closed"))


class _Forwarder:
    """One session's deliveries: republished in order (each publish is written before its
    task first waits), confirms awaited side by side up to the prefetch, and settled upstream
    in delivery order, all that are done by one basic.ack (multiple) per loop turn, so the
    upstream is sent one ack per confirm batch rather than one per message."""

    def __init__(self, link: Link, *, acks: bool) -> None:
        self._link, self._acks = link, acks
        self._pending: set[asyncio.Task[None]] = set()
        self._order: deque[AbstractIncomingMessage] = deque()  # unsettled, delivery order
        self._done: set[int] = set()  # delivery tags ready to be acked
        self._flush_due = False

    def forward(self, msg: AbstractIncomingMessage, target: AbstractExchange, key: str) -> None:
        if self._acks:
            self._order.append(msg)
        self._spawn(self._one(msg, target, key))

    def drop(self, msg: AbstractIncomingMessage) -> None:
        """Acked without being forwarded (it has been here, or is out of hops)."""
        if self._acks:
            self._order.append(msg)
            self._settled(msg)

    async def close(self) -> None:
        """The session ended: what is still in flight stays unacked, so the upstream
        delivers it again to the next session."""
        for task in self._pending:
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    async def _one(self, msg: AbstractIncomingMessage, target: AbstractExchange,
                   key: str) -> None:
        if not await self._link.publish(msg, target, key) and self._acks:
            await msg.nack(requeue=True)  # refused here: it stays upstream
        if self._acks:
            self._settled(msg)

    def _settled(self, msg: AbstractIncomingMessage) -> None:
        self._done.add(msg.delivery_tag or 0)
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        last: AbstractIncomingMessage | None = None
        while self._order and (self._order[0].delivery_tag or 0) in self._done:
            last = self._order.popleft()
            self._done.discard(last.delivery_tag or 0)
        if last is not None:  # a nacked one before it is no longer outstanding: not covered
            self._spawn(last.ack(multiple=True))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        """A publish or ack that failed (the downstream refused the exchange and closed the
        channel, or the connection went) ends the session through the channel's close, which
        the link reports; here it is only noted, not left for asyncio to call unretrieved."""
        self._pending.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.debug("federation: a forward ended with its session", error=str(exc))


class ExchangeLink(Link):
    kind = "exchange"

    def __init__(self, vhost: str, name: str, upstream: Upstream, node: str,
                 local: LocalBroker, exchange_type: str, *, user: str) -> None:
        super().__init__(vhost, name, upstream, node, local, user=user)
        self.exchange_type = exchange_type
        self._bindings: list[tuple[str, dict[str, Any]]] = []  # the downstream exchange's
        self._changed = asyncio.Event()
        self._suffix = "A"  # the internal exchange in use (the upstream's "A" or "B")

    @property
    def upstream_object(self) -> str:
        return self.upstream.exchange or self.name

    def set_bindings(self, bindings: list[tuple[str, dict[str, Any]]]) -> None:
        """The downstream exchange's bindings (key, arguments) now; mirrored upstream."""
        if bindings != self._bindings:
            self._bindings = bindings
            self._changed.set()

    async def _clean_upstream(self, up: AbstractConnection) -> None:
        qname = upstream_queue_name(self.upstream_object, self.upstream_vhost, self.node,
                                    self.vhost, self.name)
        try:
            async with asyncio.timeout(5):
                ch = await up.channel()
                await ch.queue_delete(qname)
                await ch.exchange_delete(f"{qname} {self._suffix}")
        except Exception as exc:  # the upstream may be going too: logged, nothing waits
            log.warning("federation link left its upstream queue", queue=qname,
                        reason=str(exc))

    def _wanted(self) -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
        """The upstream bindings the downstream ones call for, by a hashable identity."""
        out: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        for key, arguments in self._bindings:
            hops = binding_hops(arguments, self.upstream.max_hops, self.upstream_name,
                                self.upstream_vhost)
            if hops == 0:
                continue
            seen = arguments.get(BINDING_HEADER)
            entry = {"cluster-name": self.node, "vhost": self.vhost,
                     "exchange": f"{self.vhost}:{self.name} {self._suffix}", "hops": hops}
            args = {**arguments,
                    BINDING_HEADER: [entry, *(seen if isinstance(seen, list) else [])]}
            out[(key, repr(sorted(args.items())))] = (key, args)
        return out

    async def _federate(self, up: AbstractConnection, down: AbstractConnection,
                        closed: asyncio.Future[str], forwarder: _Forwarder) -> None:
        u = self.upstream
        ux = self.upstream_object
        ch = await up.channel()
        cmd = await up.channel()  # binds and unbinds, apart from the deliveries
        dch = await down.channel(publisher_confirms=u.ack_mode == "on-confirm")
        _watch(closed, ch, cmd, dch)
        if not await _exists(self._url, "exchange", ux):  # the plugin declares it like ours
            await cmd.declare_exchange(ux, self.exchange_type, durable=True)
        qname = upstream_queue_name(ux, self.upstream_vhost, self.node, self.vhost, self.name)
        args: dict[str, Any] = {"x-internal-purpose": "federation"}
        if u.expires is not None:
            args["x-expires"] = u.expires
        if u.message_ttl is not None:
            args["x-message-ttl"] = u.message_ttl
        queue = await ch.declare_queue(qname, durable=True, arguments=args)
        # a fresh internal exchange with every binding, then the old one goes: the queue is
        # bound throughout, and bindings that went while the link was down go with it. Which
        # one is old is asked of the upstream, so it holds across restarts of either side.
        old = "A" if await _exists(self._url, "exchange", f"{qname} A") else "B"
        self._suffix = "B" if old == "A" else "A"
        await cmd.exchange_delete(f"{qname} {self._suffix}")  # left by a swap cut short
        internal = await cmd.declare_exchange(
            f"{qname} {self._suffix}", aio_pika.ExchangeType.FANOUT, durable=True,
            internal=True, auto_delete=True, arguments={
                "x-internal-purpose": "federation", "x-max-hops": u.max_hops,
                "x-downstream-name": self.node, "x-downstream-vhost": self.vhost})
        bound: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        self._changed.clear()
        bound = await self._sync(internal, ux, bound)
        await queue.bind(internal)
        await cmd.exchange_delete(f"{qname} {old}")
        if u.ack_mode != "no-ack":
            await ch.set_qos(prefetch_count=u.prefetch)
        target = await dch.get_exchange(self.name, ensure=False)

        async def on_message(msg: AbstractIncomingMessage) -> None:
            if should_forward(msg.headers, u.max_hops, self.node, self.vhost):
                forwarder.forward(msg, target, msg.routing_key or "")
            else:
                forwarder.drop(msg)  # been here, or out of hops: dropped, as the plugin

        await queue.consume(on_message, no_ack=u.ack_mode == "no-ack")
        self._set("running")
        while True:
            changed = asyncio.ensure_future(self._changed.wait())
            await asyncio.wait((closed, changed), return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            if closed.done():
                raise ConnectionError(closed.result())
            self._changed.clear()
            bound = await self._sync(internal, ux, bound)

    async def _sync(self, internal: AbstractExchange, ux: str,
                    bound: dict[tuple[str, str], tuple[str, dict[str, Any]]]
                    ) -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
        wanted = self._wanted()
        for ident in bound.keys() - wanted.keys():
            key, args = bound[ident]
            await internal.unbind(ux, key, arguments=args)
        for ident in wanted.keys() - bound.keys():
            key, args = wanted[ident]
            await internal.bind(ux, key, arguments=args)
        return wanted


class QueueLink(Link):
    kind = "queue"

    def __init__(self, vhost: str, name: str, upstream: Upstream, node: str,
                 local: LocalBroker, demand: Callable[[], bool], *, user: str) -> None:
        super().__init__(vhost, name, upstream, node, local, user=user)
        self._demand = demand  # the downstream queue has consumers and no messages

    @property
    def upstream_object(self) -> str:
        return self.upstream.queue or self.name

    async def _federate(self, up: AbstractConnection, down: AbstractConnection,
                        closed: asyncio.Future[str], forwarder: _Forwarder) -> None:
        u = self.upstream
        ch = await up.channel()
        dch = await down.channel(publisher_confirms=u.ack_mode == "on-confirm")
        _watch(closed, ch, dch)
        queue: AbstractQueue
        if await _exists(self._url, "queue", self.upstream_object):
            queue = await ch.declare_queue(self.upstream_object, passive=True)
        else:
            queue = await ch.declare_queue(self.upstream_object, durable=True)
        if u.ack_mode != "no-ack":
            await ch.set_qos(prefetch_count=u.prefetch)
        target = dch.default_exchange

        async def on_message(msg: AbstractIncomingMessage) -> None:
            forwarder.forward(msg, target, self.name)

        self._set("running")
        tag: str | None = None
        while not closed.done():
            wanted = self._demand()
            if wanted and tag is None:
                tag = await queue.consume(on_message, no_ack=u.ack_mode == "no-ack",
                                          arguments={"x-priority": -1})
            elif not wanted and tag is not None:
                await queue.cancel(tag)
                tag = None
            await asyncio.wait((closed,), timeout=DEMAND_POLL_S)
        raise ConnectionError(closed.result())


async def _exists(url: str, kind: str, name: str) -> bool:
    """A passive declare on a connection of its own: a 404 closes the channel it is sent on,
    and closing a channel of the link's own connection was seen to stall its other channels
    on Hare (docs/SHOVEL.md, "Known issue")."""
    async with await aio_pika.connect(url, timeout=10) as probe:
        ch = await probe.channel()
        try:
            if kind == "exchange":
                await ch.declare_exchange(name, passive=True)
            else:
                await ch.declare_queue(name, passive=True)
        except ChannelNotFoundEntity:
            return False
    return True
