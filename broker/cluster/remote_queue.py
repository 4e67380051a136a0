"""A queue homed on another node, as this node's vhost holds it: the queue-type contract
(broker/queue/contract.py) for routing, declare/bind/delete rules and the management API;
messages and consumers go over the inter-node link to the home node (broker/cluster/link.py)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from broker.cluster.link import LinkError
from broker.flow.credit_flow import CreditFlow
from broker.message import Message
from broker.protocol.constants import NOT_FOUND
from broker.protocol.errors import ChannelError
from broker.queue.arguments import QueueArgs
from broker.queue.consumer import check_exclusive_use
from broker.queue.policy_args import AppliedPolicies, effective_arguments
from broker.queue.stream_queue import check_stream_consume, not_supported
from broker.store.definitions import decode_table

if TYPE_CHECKING:
    from broker.cluster.etcd_cluster import EtcdCluster
    from broker.cluster.link import Link
    from broker.queue.consumer import Consumer
    from broker.queue.contract import PublishingChannel
    from broker.queue.variable_queue import Entry
    from broker.vhost import VHost

__all__ = ["REMOTE_OWNER", "RemoteQueue"]


class _RemoteOwner:
    """The exclusive owner of a queue declared exclusive on another node: nobody here."""

    name = "(connection on another node)"


REMOTE_OWNER = _RemoteOwner()


class _RemoteCredit(CreditFlow):
    """A RemoteQueue's side of credit flow: the home node's queue grants (BUMP frames), so
    all that is left here is telling it when a publishing channel goes."""

    def __init__(self, rq: RemoteQueue) -> None:
        super().__init__(rq)
        self.rq = rq

    def peer_down(self, channel: Any) -> None:
        self.rq._senders.discard(channel)
        link = self.rq.cluster.links.get(self.rq.home)
        if link is not None:
            link.sender_down(channel)


WAITING_EVERY_S = 0.05


class RemoteQueue:
    def __init__(self, vhost: VHost, record: dict[str, Any], cluster: EtcdCluster) -> None:
        self.vhost = vhost
        self.cluster = cluster
        self.name: str = record["name"]
        self.home: str = record["node"]
        self.durable: bool = record["durable"]
        self.auto_delete: bool = record["auto_delete"]
        self.exclusive_owner: object | None = REMOTE_OWNER if record["exclusive"] else None
        self.arguments: dict[str, Any] = decode_table(record["arguments"])
        self.args = QueueArgs(self.arguments)
        self.consumers: deque[Consumer] = deque()  # this node's consumers of it
        self.deleted = False
        self._senders: set[PublishingChannel] = set()  # told when it goes
        self.credit_flow = _RemoteCredit(self)
        self._waiting_told = 0.0  # when the home queue was last told a consumer waits
        # a quorum queue's members and leader epoch (None: a queue homed on one node)
        self.members: list[str] | None = None
        self.epoch = 0
        self.update(record)

    def update(self, record: dict[str, Any]) -> None:
        """The record changed without moving the queue (a quorum queue's members)."""
        if "members" in record:
            self.members = list(record["members"])
            self.epoch = int(record["epoch"])

    # -- what the vhost and channels ask of any queue ---------------------------------------
    def _home_down(self) -> ChannelError:
        return ChannelError(
            NOT_FOUND,
            f"home node '{self.home}' of durable queue '{self.name}' in vhost "
            f"'{self.vhost.name}' is down or inaccessible",
        )

    def available(self) -> bool:
        """Its home node is reachable: a member with a link up (a node killed is down for
        us as soon as its link breaks, before its lease runs out)."""
        return self.cluster.links.get(self.home) is not None

    def touch(self) -> None:
        """A declare or consume here restarts the home queue's x-expires clock: a control
        frame, ahead on the link of the declare-ok's count call or the consume's subscribe
        (a basic.get's call restarts it at home)."""
        link = self.cluster.links.get(self.home)
        if link is None:
            raise self._home_down()
        if self.args.expires_ms is not None:
            link.control({"op": "touch", "v": self.vhost.name, "q": self.name})

    def set_policies(self, applied: AppliedPolicies) -> None:
        """What the management API shows; the home node applies them."""
        self.args = QueueArgs(effective_arguments(self.arguments, applied.effective), applied)

    def post_publishes(self, channel: PublishingChannel | None,
                       items: list[tuple[Message, int]]) -> None:
        """A batch routed here: over the link to the home node; the home node down, the
        messages are lost for this queue (the channel returns and nacks what reached no
        live queue)."""
        link = self.cluster.links.get(self.home)
        if link is None:
            if channel is not None:
                channel.publishes_lost(self, items)
            return
        if channel is not None:
            self._senders.add(channel)
        link.publish(self, channel, items)

    def _link(self) -> Link:
        link = self.cluster.links.get(self.home)
        if link is None:
            raise self._home_down()
        return link

    # -- consumers and acks, over the link --------------------------------------------------
    def check_consume(self, *, no_ack: bool, prefetch: int, global_prefetch: int,
                      arguments: dict[str, Any] | None) -> None:
        """The home queue's type decides, here, before consume-ok: a stream's rules."""
        if self.args.kind == "stream":
            check_stream_consume(self.name, self.vhost.name, no_ack=no_ack, prefetch=prefetch,
                                 global_prefetch=global_prefetch, arguments=arguments)

    async def admit_consumer(self, consumer: Consumer) -> None:
        """Subscribed on the home node, which judges exclusive use against every consumer
        of the queue, on any node (this node's own are refused here at once)."""
        check_exclusive_use(self, consumer.exclusive)
        try:
            reply = await self._link().subscribe(self, consumer)
        except LinkError:
            raise self._home_down() from None
        if reply.get("refused"):
            code, text = reply["refused"]
            raise ChannelError(code, text)
        if reply.get("missing"):
            raise self._missing()

    def add_consumer(self, consumer: Consumer) -> None:
        """Consume-ok is out: deliveries may come (unless the subscription went meanwhile;
        then its basic.cancel is on its way to the channel)."""
        link = self.cluster.links.get(self.home)
        if link is not None and link.open_window(consumer):
            self.consumers.append(consumer)

    def remove_consumer(self, consumer: Consumer) -> asyncio.Task[None] | None:
        """Off here at once; the task ends when the home has it off too."""
        with contextlib.suppress(ValueError):
            self.consumers.remove(consumer)
        link = self.cluster.links.get(self.home)
        if link is None:  # the home dropped it with the link
            return None
        return link.unsubscribe(consumer)  # also one admitted that add_consumer did not take

    def consumer_activity(self, consumer: Consumer) -> tuple[bool, str]:
        return True, "up"

    def _settle(self, op: str, seqs: list[int], requeue: bool = False) -> None:
        link = self.cluster.links.get(self.home)
        if link is not None and seqs:  # else the home node requeued them when the link went
            link.settle(self, op, list(seqs), requeue)

    def consumer_waiting(self) -> None:
        """A consumer here acked at once (docs/FLOW.md, busy queues): the home queue is told,
        so a queue whose consumers are on other nodes (workers) is busy like one whose
        consumers are at home, and grants its publishers no more than it delivers; without
        it, publishers outran those consumers without bound. At most every WAITING_EVERY_S
        (the home holds "busy" for 0.25 s), so an ack-heavy consumer costs few frames."""
        now = time.monotonic()
        if now - self._waiting_told < WAITING_EVERY_S:
            return
        link = self.cluster.links.get(self.home)
        if link is not None:
            self._waiting_told = now
            link.control({"op": "waiting", "v": self.vhost.name, "q": self.name})

    def ack(self, seqs: Iterable[int]) -> None:
        self._settle("ack", list(seqs))

    def reject(self, seqs: list[int], requeue: bool) -> None:
        self._stream_refuses("basic.nack and basic.reject")
        self._settle("reject", seqs, requeue)

    def _stream_refuses(self, what: str) -> None:
        """What a stream refuses is refused here, as on its home node."""
        if self.args.kind == "stream":
            raise not_supported(what, self.name, self.vhost.name)

    def requeue(self, seqs: list[int]) -> None:
        self._settle("reject", seqs, True)

    async def get(self, ack_required: bool) -> tuple[Entry, int] | None:
        """basic.get, answered by the home node."""
        self._stream_refuses("basic.get")
        reply = await self._call({"op": "get", "ack": ack_required})
        if reply.get("empty"):
            return None
        msg = Message(reply["exchange"], reply["routing_key"], base64.b64decode(reply["props"]),
                      base64.b64decode(reply["body"]))
        return (reply["seq"], msg, reply["redelivered"], 0.0), reply["remaining"]

    async def counts(self) -> tuple[int, int]:
        """(messages, consumers) as the home node has them (its consumers and ours)."""
        reply = await self._call({"op": "count"})
        return int(reply.get("messages", 0)), int(reply.get("consumers", 0))

    async def purge(self) -> int:
        self._stream_refuses("queue.purge")
        return int((await self._call({"op": "purge"})).get("count", 0))

    async def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = await self._link().call({**message, "v": self.vhost.name, "q": self.name})
        except LinkError:
            raise self._home_down() from None
        if reply.get("missing"):
            raise self._missing()
        return reply

    def publish_now(self, channel: PublishingChannel, items: list[tuple[Message, int]]) -> None:
        self.post_publishes(channel, items)

    def _missing(self) -> ChannelError:
        return ChannelError(NOT_FOUND, f"no queue '{self.name}' in vhost '{self.vhost.name}'")

    def drain(self) -> None:
        pass

    @property
    def message_count(self) -> int:
        return 0

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def stop(self) -> None:
        """Deleted: a quorum queue's member on this node goes too."""
        self.shutdown()
        if self.members is not None:
            self.cluster.quorum.forget((self.vhost.name, self.name))

    def shutdown(self) -> None:
        self.deleted = True
        for ch in self._senders:
            ch.credit_flow.peer_down(self)
        self._senders.clear()
        for consumer in list(self.consumers):
            self.consumers.remove(consumer)
            link = self.cluster.links.get(self.home)
            if link is not None:
                link.unsubscribe(consumer)

    def close(self) -> None:
        pass

    def wake(self) -> None:
        """A consumer's channel can write again (or its prefetch changed): the credit held
        while its writer was backed up goes home, and the home queue delivers again."""
        link = self.cluster.links.get(self.home)
        if link is not None:
            for consumer in self.consumers:
                link.writer_drained(consumer)

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "vhost": self.vhost.name, "durable": self.durable,
                "auto_delete": self.auto_delete, "exclusive": self.exclusive_owner is not None,
                "arguments": self.arguments, "messages": 0, "messages_ready": 0,
                "messages_unacknowledged": 0, "consumers": len(self.consumers),
                "message_bytes_ready": 0,
                "state": "running" if self.available() else "down",
                **self._quorum_info()}

    def _quorum_info(self) -> dict[str, Any]:
        if self.members is None:
            return {}
        running = self.cluster.node_running
        return {"leader": self.home, "members": list(self.members), "epoch": self.epoch,
                "online": [m for m in self.members if running(m)],
                "member": self.cluster.quorum.info(self.vhost.name, self.name)}

    def __repr__(self) -> str:
        return f"<RemoteQueue {self.vhost.name}/{self.name} on {self.home}>"
