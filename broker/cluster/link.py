"""The inter-node link: one TCP connection per pair of nodes, authenticated with the cluster
secret, multiplexing every channel's publishes to the peer's queues and every consumer's
deliveries from them (frames: broker/cluster/link_codec.py).

Publisher side (this node's channel, a queue homed on the peer): a RemoteQueue hands each
batch to `publish`, which writes one PUBLISH frame. The peer's queue sees a `LinkSender`
(broker/cluster/link_peers.py) as the channel: its confirms come back as CONFIRM frames
(released only when the home node has the message: in RAM, or fsynced when persistent, as
on one node), and the credit it grants comes back as BUMP frames, applied to the publishing
channel's own CreditFlow. So a busy remote queue stops granting, the channel blocks, stops
granting its reader, and the publisher's socket pauses - the chain of docs/FLOW.md with a
link in the middle.

Consumer side: a consumer here of a queue homed on the peer is subscribed there (a call:
the home queue judges exclusive use before our consume-ok); the peer's queue delivers to a
stand-in consumer on the peer's `LinkChannel`, whose deliveries come as DELIVER frames and
go out through the real channel here; acks, rejects and requeues go back, and so does credit
as our client's writer takes the deliveries (CBUMP), so a client that does not read stops
its queue on the peer instead of filling this node's buffers.

Who dials: the node whose name sorts first; the other accepts. Both see one Link."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import hashlib
import hmac
import json
import os
from collections.abc import Coroutine
from itertools import count
from typing import TYPE_CHECKING, Any

import structlog

from broker.cluster.link_codec import (
    CONTROL,
    DELIVER,
    HEADER,
    LOG,
    PUBLISH,
    decode_deliver,
    decode_publish,
    encode_control,
    encode_publish,
)
from broker.cluster.link_peers import (
    CONSUMER_CREDIT,
    CONSUMER_MORE_CREDIT_AFTER,
    ConsumerCredit,
    LinkChannel,
    LinkSender,
    delivery_size,
)
from broker.flow.credit_flow import CreditFlow
from broker.message import Message
from broker.queue.amqqueue import AMQQueue
from broker.queue.stream_queue import StreamQueue
from broker.server.listener import ListenerError
from broker.store.definitions import encode_table

if TYPE_CHECKING:
    from broker.cluster.etcd_cluster import EtcdCluster
    from broker.cluster.remote_queue import RemoteQueue
    from broker.queue.consumer import Consumer
    from broker.queue.contract import PublishingChannel

__all__ = ["Link", "LinkError", "Links"]

log = structlog.get_logger("hare.cluster.link")

HANDSHAKE_TIMEOUT_S = 5.0
RPC_TIMEOUT_S = 5.0
HIGH_WATER = 1 << 20  # bytes buffered towards the peer before remote consumers pause


class LinkError(Exception):
    """No link to the node, or it went down during the call."""


def _shares_window(consumer: Consumer) -> bool:
    """The consumer's deliveries count against its channel's basic.qos global window."""
    return bool(consumer.channel.global_prefetch) and not consumer.no_ack


def _proof(secret: str, who: str, nonce: str) -> str:
    return hmac.new(secret.encode(), f"{who}\0{nonce}".encode(), hashlib.sha256).hexdigest()


async def _read_control(reader: asyncio.StreamReader) -> dict[str, Any]:
    size, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
    if kind != CONTROL or size > 65536:
        raise LinkError("handshake: unexpected frame")
    return json.loads(await reader.readexactly(size - 1))


class Link:
    def __init__(self, links: Links, peer: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.links = links
        self.cluster = links.cluster
        self.peer = peer
        self.reader = reader
        self.writer = writer
        self.closed = False
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._draining: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        # publisher side: our channels by sender id, confirms they still wait for
        self._sender_ids: dict[PublishingChannel, int] = {}
        self._senders: dict[int, PublishingChannel] = {}
        self._ids = count(1)
        self._inflight: dict[tuple[int, RemoteQueue], dict[int, None]] = {}
        # consumer side: our consumers of the peer's queues, by consumer id, and their
        # credit (granted as their channels' writers take deliveries)
        self._consumers: dict[int, Consumer] = {}
        self._consumer_ids: dict[Consumer, int] = {}
        self._credit: dict[int, ConsumerCredit] = {}
        self.delivery_credit = CreditFlow(self, CONSUMER_CREDIT, CONSUMER_MORE_CREDIT_AFTER)
        # home side: the peer's channels and consumers as our queues see them
        self._proxies: dict[int, LinkSender] = {}
        self.channel = LinkChannel(self)
        # calls waiting for a reply
        self._calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        # held while they run: answers to the peer's calls, our cancels waiting for theirs
        self._tasks: set[asyncio.Task[None]] = set()
        self.published = 0  # messages sent in PUBLISH frames (metrics, benchmarks)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name=f"link:{self.peer}")

    # -- writing ----------------------------------------------------------------------------
    def send(self, parts: list[bytes]) -> None:
        if self.closed:
            return
        self._out.extend(parts)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.channel.flush()  # deliveries gathered this iteration
        if self._out and not self.closed:
            out, self._out = self._out, []
            self.writer.writelines(out)
            if (self.writer.transport.get_write_buffer_size() > HIGH_WATER
                    and self._draining is None):
                self.channel.writer.full = True
                self._draining = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()
        self._draining = None
        self.channel.resume()

    def control(self, message: dict[str, Any]) -> None:
        self.send(encode_control(message))

    async def drained(self) -> None:
        """Let what was sent go out, and wait while more than HIGH_WATER is buffered (a
        long stream of frames, such as a quorum queue's copy, keeps to the socket's pace)."""
        await asyncio.sleep(0)
        while not self.closed and self.writer.transport.get_write_buffer_size() > HIGH_WATER:
            with contextlib.suppress(ConnectionError):
                await self.writer.drain()
        if self.closed:
            raise LinkError(f"link to {self.peer} closed")

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        call_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self.control({**message, "call": call_id})
        try:
            return await asyncio.wait_for(future, RPC_TIMEOUT_S)
        except TimeoutError:
            raise LinkError(f"no answer from {self.peer}") from None
        finally:
            self._calls.pop(call_id, None)

    # -- publisher side ---------------------------------------------------------------------
    def sender_id(self, channel: PublishingChannel) -> int:
        sid = self._sender_ids.get(channel)
        if sid is None:
            sid = self._sender_ids[channel] = next(self._ids)
            self._senders[sid] = channel
        return sid

    def publish(self, rq: RemoteQueue, channel: PublishingChannel | None,
                items: list[tuple[Message, int]]) -> None:
        sid = 0 if channel is None else self.sender_id(channel)
        if sid:
            inflight = self._inflight.get((sid, rq))
            if inflight is None:
                inflight = self._inflight[(sid, rq)] = {}
            for _, seq in items:
                if seq:
                    inflight[seq] = None
        self.published += len(items)
        self.send(encode_publish(sid, rq.vhost.name, rq.name, [
            (seq, m.exchange, m.routing_key, m.props, m.body) for m, seq in items]))

    def sender_down(self, channel: PublishingChannel) -> None:
        sid = self._sender_ids.pop(channel, None)
        if sid is not None:
            del self._senders[sid]
            for key in [k for k in self._inflight if k[0] == sid]:
                del self._inflight[key]
            self.control({"op": "sender_down", "sid": sid})

    def _on_confirm(self, m: dict[str, Any]) -> None:
        channel = self._senders.get(m["sid"])
        rq = self.cluster.remote_queue(m["v"], m["q"])
        if channel is None or rq is None:
            return
        inflight = self._inflight.get((m["sid"], rq))
        if inflight is not None:
            for seq in m["acks"]:
                inflight.pop(seq, None)
            for seq in m["nacks"]:
                inflight.pop(seq, None)
        channel.queue_confirmed(rq, m["acks"], m["nacks"])

    def _on_bump(self, m: dict[str, Any]) -> None:
        channel = self._senders.get(m["sid"])
        rq = self.cluster.remote_queue(m["v"], m["q"])
        if channel is not None and rq is not None:
            channel.credit_flow.handle_bump(rq, m["n"])

    # -- consumer side ----------------------------------------------------------------------
    async def subscribe(self, rq: RemoteQueue, consumer: Consumer) -> dict[str, Any]:
        """basic.consume of a queue on the peer: its home's answer (refused, missing, or
        subscribed, with nothing delivered until open_window). LinkError: the link went."""
        cid = next(self._ids)
        self._consumers[cid] = consumer
        self._consumer_ids[consumer] = cid
        credit = self._credit[cid] = ConsumerCredit(self, cid)
        credit.shares = _shares_window(consumer)
        try:
            reply = await self.call({
                "op": "sub", "cid": cid, "v": rq.vhost.name, "q": rq.name,
                "tag": consumer.tag, "no_ack": consumer.no_ack,
                "exclusive": consumer.exclusive, "prefetch": consumer.prefetch,
                "priority": consumer.priority, "gqos": credit.shares,
                # basic.consume's own arguments (a stream's x-stream-offset)
                "args": encode_table(consumer.arguments)})
        except LinkError:
            self.unsubscribe(consumer)  # no answer in time: the home may have it
            raise
        if reply.get("missing") or reply.get("refused"):
            self._forget(consumer)
        return reply

    def open_window(self, consumer: Consumer) -> bool:
        """Consume-ok is out: the home may deliver (its credit window opens). False when the
        subscription is gone meanwhile (cancelled by the home, or the link closed)."""
        credit = self._credit.get(self._consumer_ids.get(consumer, 0))
        if credit is None:
            return False
        credit.credit_flow.deliver_bump(self, CONSUMER_CREDIT)
        return True

    def writer_drained(self, consumer: Consumer) -> None:
        """The consumer's channel can write again (or its global prefetch changed, or an
        ack freed some of it): the credit held for what reached its writer while it was
        backed up goes home, and so does a share of the channel's window it asked for."""
        credit = self._credit.get(self._consumer_ids.get(consumer, 0))
        if credit is None:
            return
        writer = consumer.channel.writer
        if credit.held and not (writer.paused or writer.full):
            held, credit.held = credit.held, 0
            self.delivery_credit.ack_many(credit, held)
        shares = _shares_window(consumer)
        if shares != credit.shares:  # basic.qos global set or cleared since
            self._release(consumer, credit)
            credit.shares = shares
            self.control({"op": "gqos", "cid": credit.cid, "on": shares})
        elif credit.wanted:
            self._grant(consumer, credit)

    # -- channel-global prefetch (basic.qos global) for consumers of the peer's queues ------
    # The channel's window (global_prefetch - consumer_unacked) is the one count: the home
    # delivers to such a consumer only within a share it asked for ("want", when it has
    # messages for it) and we granted ("gcredit"), counted here as unacked until its
    # deliveries come (or it gives back what it could not use: "greturn").
    def _grant(self, consumer: Consumer, credit: ConsumerCredit) -> None:
        ch = consumer.channel
        n = min(ch.global_prefetch - ch.consumer_unacked, credit.wanted)
        if n > 0:  # else it waits for an ack (writer_drained, as the channel wakes queues)
            ch.consumer_unacked += n
            credit.reserved += n
            credit.wanted = 0
            self.control({"op": "gcredit", "cid": credit.cid, "n": n})

    def _on_want(self, m: dict[str, Any]) -> None:
        consumer = self._consumers.get(m["cid"])
        credit = self._credit.get(m["cid"])
        if consumer is not None and credit is not None and credit.shares:
            credit.wanted = m["n"]
            self._grant(consumer, credit)

    def _on_greturn(self, m: dict[str, Any]) -> None:
        consumer = self._consumers.get(m["cid"])
        credit = self._credit.get(m["cid"])
        if consumer is not None and credit is not None and self._unreserve(
                consumer, credit, m["n"]):
            consumer.channel.wake_queues()

    @staticmethod
    def _unreserve(consumer: Consumer, credit: ConsumerCredit, n: int) -> int:
        """Up to `n` of the share granted to the consumer stop counting as its channel's
        unacked (they came as deliveries, which count themselves, or went back): how many."""
        n = min(n, credit.reserved)
        credit.reserved -= n
        consumer.channel.consumer_unacked -= n
        return n

    def _release(self, consumer: Consumer, credit: ConsumerCredit) -> int:
        """The consumer's share of its channel's window goes back (it went, or its channel's
        global prefetch changed): how much."""
        credit.wanted = 0
        return self._unreserve(consumer, credit, credit.reserved)

    def _give_back(self, consumer: Consumer, credit: ConsumerCredit) -> None:
        """The consumer went: the channel's other consumers may use its share now."""
        if self._release(consumer, credit):
            consumer.channel.wake_queues()

    def _forget(self, consumer: Consumer) -> int | None:
        cid = self._consumer_ids.pop(consumer, None)
        if cid is not None:
            del self._consumers[cid]
            credit = self._credit.pop(cid, None)
            if credit is not None:
                self._give_back(consumer, credit)
                self.delivery_credit.peer_down(credit)
        return cid

    def unsubscribe(self, consumer: Consumer) -> asyncio.Task[None] | None:
        """The consumer stops here at once (what the home still sends goes back to its queue);
        the task ends when the home has it off its queue, or the link went (which takes them
        all off), or the call timed out; it never raises. basic.cancel's cancel-ok waits for
        it, as RabbitMQ's follows the queue's removal: the client's next basic.consume, on any
        connection, is judged without the cancelled one."""
        cid = self._forget(consumer)
        if cid is None:
            return None
        return self._spawn(self._unsubscribe(cid))

    async def _unsubscribe(self, cid: int) -> None:
        with contextlib.suppress(LinkError):
            await self.call({"op": "unsub", "cid": cid})

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def settle(self, rq: RemoteQueue, op: str, seqs: list[int], requeue: bool = False) -> None:
        self.control({"op": op, "v": rq.vhost.name, "q": rq.name, "seqs": seqs,
                      "requeue": requeue})

    def _on_deliver(self, payload: bytes) -> None:
        cid, items = decode_deliver(payload)
        consumer = self._consumers.get(cid)
        if consumer is None:  # cancelled meanwhile: back to the queue
            self.control({"op": "unsub_requeue", "cid": cid, "seqs": [i[0] for i in items]})
            return
        channel, rq = consumer.channel, consumer.queue
        credit = self._credit[cid]
        if credit.reserved:  # counted as unacked when granted; channel.deliver counts them
            self._unreserve(consumer, credit, len(items))
        size = 0
        for seq, redelivered, exchange, routing_key, props, body in items:
            channel.deliver(consumer, rq, (seq, Message(exchange, routing_key, props, body),
                                           redelivered, 0.0))
            size += delivery_size(body)
        writer = channel.writer
        if writer.paused or writer.full:  # granted once it drains (writer_drained)
            credit.held += size
        else:
            self.delivery_credit.ack_many(credit, size)

    # -- home side: what the peer asks of our queues ----------------------------------------
    def _local_queue(self, vhost: str, name: str) -> AMQQueue | StreamQueue | None:
        v = self.cluster.node.vhosts.get(vhost)
        q = v.queues.get(name) if v is not None else None
        return q if isinstance(q, AMQQueue | StreamQueue) else None

    def _on_publish(self, payload: bytes) -> None:
        sid, vhost, name, raw = decode_publish(payload)
        items = [(Message(ex, rk, props, body), seq) for seq, ex, rk, props, body in raw]
        q = self._local_queue(vhost, name)
        if q is None:  # deleted meanwhile: not taken, so not confirmed
            nacks = [seq for _, seq in items if seq]
            if sid and nacks:
                self.control({"op": "confirm", "sid": sid, "v": vhost, "q": name,
                              "acks": [], "nacks": nacks})
            return
        if not sid:
            q.post_publishes(None, items)
            return
        proxy = self._proxies.get(sid)
        if proxy is None:
            proxy = self._proxies[sid] = LinkSender(self, sid)
        proxy.posted.add(q)
        q.post_publishes(proxy, items)

    def _on_sender_down(self, m: dict[str, Any]) -> None:
        proxy = self._proxies.pop(m["sid"], None)
        if proxy is not None:
            proxy.down()

    async def _on_call(self, m: dict[str, Any]) -> dict[str, Any]:
        op = m["op"]
        if op == "ensure":  # a queue placed here by another node's declare
            record = m["record"]
            vhost = self.cluster.node.vhosts.get(record["vhost"])
            if vhost is not None:
                with self.cluster.metadata.quiet():
                    self.cluster.place_queue(vhost, record, new=bool(m.get("new")))
            return {}
        if op == "dreply_alive":  # a direct-reply name of a channel here?
            return {"alive": self.cluster.node.reply_registry.lookup(m["name"]) is not None}
        handler = self.cluster.node.peer_handlers.get(op)
        if handler is not None:  # a part of the node's own asked by a peer (management)
            return await handler(m)
        q = self._local_queue(m["v"], m["q"])
        if q is None:
            return {"missing": True}
        if op == "sub":  # the peer's basic.consume
            return self.channel.subscribe(q, m)
        if op == "get":
            got = await q.get(m["ack"])
            if got is None:
                return {"empty": True}
            (seq, msg, redelivered, _), remaining = got
            if m["ack"]:
                seq = self.channel.got(q, seq)  # settled like a delivery of the link's
            return {"seq": seq, "redelivered": redelivered, "exchange": msg.exchange,
                    "routing_key": msg.routing_key, "remaining": remaining,
                    "props": base64.b64encode(msg.props).decode(),
                    "body": base64.b64encode(msg.body).decode()}
        if op == "purge":
            return {"count": await q.purge()}
        if op == "count":
            return {"messages": q.message_count, "consumers": q.consumer_count}
        return {"error": f"unknown call {op}"}

    def _on_control(self, m: dict[str, Any]) -> None:
        op = m["op"]
        if op.startswith("q_"):  # a quorum queue's members (broker/cluster/quorum.py)
            self.cluster.quorum.on_control(self, m)
        elif op == "confirm":
            self._on_confirm(m)
        elif op == "bump":
            self._on_bump(m)
        elif op in ("ack", "reject"):
            self.channel.settle(m["seqs"], op, m["requeue"])
        elif op == "cbump":  # the peer's client took deliveries of one of its consumers
            self.channel.bump(m["cid"], m["n"])
        elif op == "want":  # the home has messages for our consumer: a share of the window
            self._on_want(m)
        elif op == "greturn":  # what it could not use of that share
            self._on_greturn(m)
        elif op == "gcredit":  # the peer's channel granted its consumer a share
            self.channel.grant(m["cid"], m["n"])
        elif op == "gqos":  # the peer's channel set or cleared basic.qos global
            self.channel.share_window(m["cid"], m["on"])
        elif op == "unsub":  # a call, answered in this frame's order with the others
            self.channel.unsubscribe(m["cid"])
            self.control({"op": "reply", "call": m["call"]})
        elif op == "unsub_requeue":
            self.channel.requeue_for(m["cid"], m["seqs"])
        elif op == "cancel":  # our consumer's queue went away on the peer
            consumer = self._consumers.get(m["cid"])
            if consumer is not None:
                self._forget(consumer)
                self.cluster.consumer_gone(consumer)
        elif op == "sender_down":
            self._on_sender_down(m)
        elif op == "dreply":  # a direct reply published on the peer to a name held here
            target = self.cluster.node.reply_registry.lookup(m["rk"])
            if target is not None:
                target.deliver_reply(Message(m["ex"], m["rk"], base64.b64decode(m["props"]),
                                             base64.b64decode(m["body"])))
        elif op == "touch":  # a declare or consume on the peer: x-expires restarts
            q = self._local_queue(m["v"], m["q"])
            if q is not None:
                q.touch()
        elif op == "waiting":  # a consumer of one of our queues, on the peer, waits on it
            q = self._local_queue(m["v"], m["q"])
            if q is not None:
                q.consumer_waiting()
        elif op == "reply":
            future = self._calls.get(m["call"])
            if future is not None and not future.done():
                future.set_result(m)
        elif "call" in m:
            self._spawn(self._answer(m))
        else:
            log.warning("unknown link frame", op=op, peer=self.peer)

    async def _answer(self, m: dict[str, Any]) -> None:
        try:
            reply = await self._on_call(m)
        except Exception as exc:
            log.exception("link call failed", op=m.get("op"))
            reply = {"error": repr(exc)}
        self.control({**reply, "op": "reply", "call": m["call"]})

    # -- reading ----------------------------------------------------------------------------
    async def _run(self) -> None:
        reader = self.reader
        try:
            while True:
                size, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
                payload = await reader.readexactly(size - 1)
                if kind == PUBLISH:
                    self._on_publish(payload)
                elif kind == DELIVER:
                    self._on_deliver(payload)
                elif kind == CONTROL:
                    self._on_control(json.loads(payload))
                elif kind == LOG:
                    self.cluster.quorum.on_log(self, payload)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except Exception:
            log.exception("link failed", peer=self.peer)
        finally:
            self.close()

    def close(self) -> None:
        """The link is gone: what was in flight either way is settled as lost."""
        if self.closed:
            return
        self.closed = True
        self.writer.close()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(LinkError(f"link to {self.peer} closed"))
        # publisher side: unconfirmed publishes to the peer's queues are nacked, credit freed
        for (sid, rq), inflight in self._inflight.items():
            channel = self._senders.get(sid)
            if channel is not None:
                if inflight:
                    channel.queue_confirmed(rq, [], list(inflight))
                channel.credit_flow.peer_down(rq)
        self._inflight.clear()
        for channel in self._senders.values():
            for rq in self.cluster.remote_queues_on(self.peer):
                channel.credit_flow.peer_down(rq)
        # consumer side: our consumers of its queues are cancelled (the peer requeues)
        for cid, consumer in list(self._consumers.items()):
            self._give_back(consumer, self._credit[cid])
            self.cluster.consumer_gone(consumer)
        self._consumers.clear()
        self._consumer_ids.clear()
        self._credit.clear()
        # home side: the peer's channels and consumers are gone
        for proxy in self._proxies.values():
            proxy.down()
        self._proxies.clear()
        self.channel.down()
        self.links.link_closed(self)
        log.info("cluster link down", peer=self.peer)


class Links:
    """This node's links: the listener, the dialling, and the link to each running peer."""

    def __init__(self, cluster: EtcdCluster) -> None:
        self.cluster = cluster
        self.me = cluster.node.name
        self.secret = cluster.node.settings.cluster_secret
        self.links: dict[str, Link] = {}
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._dialling: dict[str, asyncio.Task[None]] = {}
        self._handshakes: set[asyncio.Task[None]] = set()
        self._stopping = False

    async def start(self) -> None:
        s = self.cluster.node.settings
        try:
            self._server = await asyncio.start_server(self._accept, s.cluster_link_host or None,
                                                      s.cluster_link_port)
        except OSError as exc:
            # one line at start, as for the other listeners (RabbitMQ's inter-node port is
            # 25672 too: a Hare node beside a RabbitMQ node needs another cluster_link_port)
            taken = exc.errno == errno.EADDRINUSE
            raise ListenerError(
                f"cluster link port {s.cluster_link_port} is already in use (cluster_link_port)"
                if taken else f"cannot listen on cluster link port {s.cluster_link_port}: "
                f"{exc.strerror or exc}") from None
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self._stopping = True  # closing the links below must not dial them again
        for task in self._dialling.values():
            task.cancel()
        for link in list(self.links.values()):
            link.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def get(self, peer: str) -> Link | None:
        return self.links.get(peer)

    def link_closed(self, link: Link) -> None:
        if self.links.get(link.peer) is link:
            del self.links[link.peer]
            self.cluster.link_down(link.peer)
        self.node_up(link.peer)  # dial again while the peer is running

    # -- dialling (the first name of a pair dials) ------------------------------------------
    def node_up(self, peer: str) -> None:
        if peer == self.me or self.me > peer or peer in self.links or self._stopping:
            return
        task = self._dialling.get(peer)
        if task is None or task.done():
            self._dialling[peer] = asyncio.get_running_loop().create_task(
                self._dial(peer), name=f"link-dial:{peer}")

    def node_down(self, peer: str) -> None:
        task = self._dialling.pop(peer, None)
        if task is not None:
            task.cancel()
        link = self.links.get(peer)
        if link is not None:
            link.close()

    async def _dial(self, peer: str) -> None:
        delay = 0.1
        while self.cluster.node_running(peer) and peer not in self.links:
            card = self.cluster.membership.running.get(peer, {})
            host, port = card.get("link_host"), card.get("link_port")
            try:
                if not port:
                    raise LinkError("no link port on its card")
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host or "127.0.0.1", port), HANDSHAKE_TIMEOUT_S)
                try:
                    await asyncio.wait_for(self._hello(reader, writer, peer),
                                           HANDSHAKE_TIMEOUT_S)
                except BaseException:
                    writer.close()
                    raise
                return
            except LinkError as exc:  # a node that cannot prove the secret: say so
                log.warning("cluster link refused", peer=peer, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
                log.debug("link dial failed", peer=peer, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     peer: str) -> None:
        nonce = os.urandom(16).hex()
        writer.writelines(encode_control({"op": "hello", "node": self.me, "nonce": nonce,
                                          "cluster": self.cluster.name}))
        answer = await _read_control(reader)
        if answer.get("node") != peer or not hmac.compare_digest(
                answer.get("proof", ""), _proof(self.secret, peer, nonce)):
            raise LinkError(f"{peer} did not prove the cluster secret")
        writer.writelines(encode_control(
            {"op": "proof", "proof": _proof(self.secret, self.me, answer["nonce"])}))
        self._up(peer, reader, writer)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handshakes.add(task)
        try:
            hello = await asyncio.wait_for(_read_control(reader), HANDSHAKE_TIMEOUT_S)
            peer = str(hello.get("node"))
            if hello.get("cluster") != self.cluster.name:
                raise LinkError(f"{peer} is of cluster {hello.get('cluster')!r}")
            nonce = os.urandom(16).hex()
            writer.writelines(encode_control(
                {"op": "hello", "node": self.me, "nonce": nonce,
                 "proof": _proof(self.secret, self.me, hello["nonce"])}))
            proof = await asyncio.wait_for(_read_control(reader), HANDSHAKE_TIMEOUT_S)
            if not hmac.compare_digest(proof.get("proof", ""),
                                       _proof(self.secret, peer, nonce)):
                raise LinkError(f"{peer} did not prove the cluster secret")
            self._up(peer, reader, writer)
        except (OSError, LinkError, TimeoutError, asyncio.IncompleteReadError, ValueError,
                KeyError) as exc:
            log.warning("cluster link refused", peer=writer.get_extra_info("peername"),
                        error=str(exc))
            writer.close()
        finally:
            if task is not None:
                self._handshakes.discard(task)

    def _up(self, peer: str, reader: asyncio.StreamReader,
            writer: asyncio.StreamWriter) -> None:
        if self._stopping:  # a handshake that finished as the node stops
            writer.close()
            return
        old = self.links.get(peer)
        if old is not None:
            old.close()
        link = self.links[peer] = Link(self, peer, reader, writer)
        link.start()
        log.info("cluster link up", peer=peer)
        self.cluster.link_up(peer)
