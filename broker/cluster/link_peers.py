"""What a home node's queues see of the peer's channels across a link: a `LinkSender` per
publishing channel (confirms and credit go back to it), and one `LinkChannel` per link for
the peer's consumers, each seen by its queue through a `LinkConsumer` (deliveries go to it
within the consumer's prefetch and its credit, while the link's socket keeps up); on the
consumers' node a `ConsumerCredit` per consumer grants that credit back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.cluster.link_codec import DeliverItem, encode_deliver
from broker.flow.credit_flow import CreditFlow
from broker.protocol.channel_state import ChannelState
from broker.protocol.errors import AMQPError
from broker.queue.consumer import Consumer, check_exclusive_use
from broker.server.writer import FULL_BYTES
from broker.store.definitions import decode_table

if TYPE_CHECKING:
    from broker.cluster.link import Link
    from broker.message import Message
    from broker.queue.contract import QueueType
    from broker.queue.variable_queue import Entry

__all__ = [
    "CONSUMER_CREDIT",
    "CONSUMER_MORE_CREDIT_AFTER",
    "ConsumerCredit",
    "LinkBackPressure",
    "LinkChannel",
    "LinkConsumer",
    "LinkSender",
    "delivery_size",
]

# Credit for deliveries to one of the peer's consumers, in bytes (a body and 64 for its
# frames, as the writer counts them): what may be on its way beyond what the peer's client
# writer has taken. A local consumer's writer takes FULL_BYTES a loop turn before it is full.
CONSUMER_CREDIT = FULL_BYTES
CONSUMER_MORE_CREDIT_AFTER = FULL_BYTES // 4


def delivery_size(body: bytes) -> int:
    """What one delivery costs in consumer credit, counted alike on both nodes."""
    return len(body) + 64


class LinkSender:
    """A channel of the peer's, publishing to queues homed here."""

    def __init__(self, link: Link, sid: int) -> None:
        self.link = link
        self.sid = sid
        self.posted: set[QueueType] = set()
        s = link.cluster.node.settings
        self.credit_flow = CreditFlow(self, s.credit_flow_initial_credit,
                                      s.credit_flow_more_credit_after, deliver_bump=self._bump)

    def _bump(self, queue: Any, amount: int) -> None:
        """Credit a queue of ours grants: to the publishing channel, on its node."""
        self.link.control({"op": "bump", "sid": self.sid, "v": queue.vhost.name,
                           "q": queue.name, "n": amount})

    def queue_confirmed(self, queue: QueueType, seqs: list[int], rejected: list[int]) -> None:
        if seqs or rejected:
            self.link.control({"op": "confirm", "sid": self.sid, "v": queue.vhost.name,
                               "q": queue.name, "acks": seqs, "nacks": rejected})

    def publishes_lost(self, queue: Any, items: list[tuple[Message, int]]) -> None:
        """Not taken by queue: nacked, as for a queue deleted meanwhile."""
        self.queue_confirmed(queue, [], [seq for _, seq in items if seq])

    def down(self) -> None:
        for q in self.posted:
            q.credit_flow.peer_down(self)
        self.posted.clear()


class _LinkReader:
    """What the management API shows as a remote consumer's connection."""

    def __init__(self, peer: str) -> None:
        self.name = f"cluster link from {peer}"
        self.peer = (peer, 0)


class LinkBackPressure:
    """The link's socket, for its LinkConsumers: full while its buffer is past the high-water
    mark."""

    def __init__(self) -> None:
        self.full = False


class ConsumerCredit:
    """On the consumers' node: the credit of one consumer of a queue homed on the peer, as
    the sender side of credit flow (broker/flow/credit_flow.py) for the home's LinkConsumer.
    The link's `delivery_credit` acks what the consumer's channel wrote, and the grants go
    home as CBUMP controls; what reached a writer that was backed up is `held` until it
    drains (the channel wakes its queues then), so the home stops when the client stops
    reading, as a local consumer's writer stops its queue."""

    # slots here and in LinkConsumer: there is one of each for every consumer of another
    # worker's queue, and servers run thousands of consumers
    __slots__ = ("cid", "credit_flow", "held", "link", "reserved", "shares", "wanted")

    def __init__(self, link: Link, cid: int) -> None:
        self.link = link
        self.cid = cid
        self.held = 0
        # basic.qos global: its deliveries share its channel's window (Link._grant)
        self.shares = False
        self.reserved = 0  # granted of that window, counted unacked, not yet delivered
        self.wanted = 0  # asked for by the home, not granted yet
        self.credit_flow = CreditFlow(self, CONSUMER_CREDIT, CONSUMER_MORE_CREDIT_AFTER,
                                      deliver_bump=self._bump)

    def _bump(self, _granter: Any, amount: int) -> None:
        self.link.control({"op": "cbump", "cid": self.cid, "n": amount})


class LinkConsumer:
    """One of the peer's consumers as its home queue sees the consumer's channel (broker/
    queue/contract.py ConsumerChannel, and its own ConsumerWriter): deliveries go out on the
    link's LinkChannel, and it is full while the link's socket is, or while the consumer's
    credit is spent. The window is shut until the peer opens it (its first grant, after
    consume-ok), so nothing reaches the peer before its client has consume-ok."""

    __slots__ = ("_asked", "channel", "cid", "consumer", "consumer_unacked", "credit",
                 "global_prefetch", "queue", "reader", "state", "user", "writer")

    number = 0  # what the management API shows as its channel
    paused = False
    flow_active = True

    def __init__(self, channel: LinkChannel, cid: int) -> None:
        self.channel = channel
        self.cid = cid
        self.state = ChannelState.OPEN
        self.writer = self
        self.reader: _LinkReader = channel.reader
        self.user: str = channel.user
        self.queue: QueueType | None = None
        self.consumer: Consumer | None = None
        # The peer's channel has basic.qos global: its window is counted there, and this
        # consumer gets shares of it (grant). Then global_prefetch - consumer_unacked is the
        # share left (Consumer.can_take and room read them as for a client's channel);
        # 0 and 0 without.
        self.global_prefetch = 0
        self.consumer_unacked = 0
        self._asked = False
        # bytes the peer's consumer, which this stands for, lets us send it: the sender side
        # of one credit-flow link with one peer, so a count (a CreditFlow of its own was
        # about 800 bytes a consumer). 0: shut until the peer opens it
        self.credit = 0

    @property
    def full(self) -> bool:
        """Asked only when the queue has a message for this consumer: so with its share of
        the peer's window spent, that is when it asks for more."""
        return (self.channel.writer.full or self.credit <= 0
                or (self.global_prefetch != 0 and self.consumer_unacked >= self.global_prefetch
                    and self._want()))

    def _want(self) -> bool:
        """Ask the peer's channel for a share of its window, once until it answers. True:
        this consumer cannot take a delivery now."""
        c, q = self.consumer, self.queue
        if self._asked or c is None or q is None:
            return True
        n = q.message_count
        if c.prefetch:
            n = min(n, c.prefetch - c.unacked)
        if n > 0:
            self._asked = True
            # deliveries gathered this turn go ahead of it: any made without a share (before
            # the peer set its global prefetch) reach the peer before the share it grants
            self.channel.flush()
            self.channel.link.control({"op": "want", "cid": self.cid, "n": n})
        return True

    def share_window(self, on: bool) -> None:
        """The peer's channel set (or cleared) basic.qos global: shares from now on. Not
        for a stream (it refuses global qos at consume; set later, its readers keep their
        own credit, and a reader that cannot be drained now would give back every share)."""
        if self.queue is not None and self.queue.args.kind == "stream":
            on = False
        self.global_prefetch = self.consumer_unacked = 1 if on else 0
        self._asked = False
        if self.queue is not None:
            self.queue.wake()

    def grant(self, n: int) -> None:
        """A share of the peer's window: delivered at once, and what the queue could not
        use now (its messages went to other consumers meanwhile) is given back, so a share
        never sits idle while the channel's other consumers wait."""
        if not self.global_prefetch or self.queue is None:
            return  # cleared meanwhile: the peer released it
        self.global_prefetch += n
        self._asked = False
        self.queue.wake()
        self.queue.drain()
        left = self.global_prefetch - self.consumer_unacked
        if left > 0:
            self.global_prefetch = self.consumer_unacked
            self.channel.link.control({"op": "greturn", "cid": self.cid, "n": left})

    def wake_queues(self) -> None:
        if self.queue is not None:
            self.queue.wake()

    def bump(self, amount: int) -> None:
        """The peer's consumer granted `amount` more (CreditFlow.handle_bump's rule)."""
        before = self.credit
        self.credit = before + amount
        if before <= 0 < self.credit and self.queue is not None:
            self.queue.wake()

    def deliver(self, consumer: Consumer, queue: QueueType, entry: Entry) -> None:
        self.credit -= delivery_size(entry[1].body)
        if self.global_prefetch:
            self.consumer_unacked += 1
        self.channel.deliver(consumer, queue, entry)

    def consumer_cancelled_by_queue(self, consumer: Consumer) -> None:
        self.channel.consumer_cancelled_by_queue(consumer)


class LinkChannel:
    """The peer's consumers of our queues: each is seen by its queue through a LinkConsumer,
    which delivers here; deliveries are numbered and settled here, and written to the link
    in one DELIVER frame per consumer and loop turn."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.writer = LinkBackPressure()
        self.reader: _LinkReader = _LinkReader(link.peer)
        self.user: str = "(cluster)"
        self.consumers: dict[int, Consumer] = {}
        self._cids: dict[Consumer, int] = {}
        # deliveries the peer has not settled, by a number of the link's own (a queue's seq
        # is not enough: two consumers of one stream read the same offsets)
        self._unacked: dict[int, tuple[QueueType, int, Consumer | None]] = {}
        self._next_id = 1
        self._out: dict[int, list[DeliverItem]] = {}

    def subscribe(self, q: QueueType, m: dict[str, Any]) -> dict[str, Any]:
        """The peer's basic.consume, judged here against every consumer of q (exclusive use):
        the answer the peer waits for before its consume-ok."""
        if q.deleted:
            return {"missing": True}
        try:
            check_exclusive_use(q, m["exclusive"])
        except AMQPError as exc:
            return {"refused": [exc.code, exc.text]}
        view = LinkConsumer(self, m["cid"])
        c = Consumer(m["tag"], view, q, no_ack=m["no_ack"],
                     exclusive=m["exclusive"], prefetch=m["prefetch"], priority=m["priority"],
                     arguments=decode_table(m["args"]) if m.get("args") else None)
        view.queue, view.consumer = q, c
        if m.get("gqos"):
            view.share_window(True)
        self.consumers[m["cid"]] = c
        self._cids[c] = m["cid"]
        q.add_consumer(c)
        return {}

    def bump(self, cid: int, amount: int) -> None:
        """The peer's client took deliveries: credit for more."""
        view = self._view(cid)
        if view is not None:
            view.bump(amount)

    def _view(self, cid: int) -> LinkConsumer | None:
        c = self.consumers.get(cid)
        if c is None:
            return None
        assert isinstance(c.channel, LinkConsumer)
        return c.channel

    def grant(self, cid: int, n: int) -> None:
        """The peer's channel granted its consumer a share of its global prefetch."""
        view = self._view(cid)
        if view is not None:
            view.grant(n)

    def share_window(self, cid: int, on: bool) -> None:
        view = self._view(cid)
        if view is not None:
            view.share_window(on)

    def unsubscribe(self, cid: int) -> None:
        c = self.consumers.pop(cid, None)
        if c is not None:
            del self._cids[c]
            c.queue.remove_consumer(c)

    def deliver(self, consumer: Consumer, queue: QueueType, entry: Entry) -> None:
        cid = self._cids[consumer]
        seq, msg = entry[0], entry[1]
        if not consumer.no_ack:
            consumer.unacked += 1
            seq = self._next_id  # what the peer settles it by
            self._next_id = seq + 1
            self._unacked[seq] = (queue, entry[0], consumer)
        out = self._out.get(cid)
        if out is None:
            out = self._out[cid] = []
            self.link.send([])  # a flush this iteration takes what gathers meanwhile
        out.append((seq, entry[2], msg.exchange, msg.routing_key, msg.props, msg.body))

    def flush(self) -> None:
        if self._out:
            out, self._out = self._out, {}
            for cid, items in out.items():
                self.link._out.extend(encode_deliver(cid, items))

    def got(self, queue: QueueType, seq: int) -> int:
        """A basic.get of the peer's that must be acked: the number it settles it by."""
        delivery = self._next_id
        self._next_id = delivery + 1
        self._unacked[delivery] = (queue, seq, None)
        return delivery

    def settle(self, ids: list[int], op: str, requeue: bool) -> None:
        """The peer settled these deliveries (the link's numbers, see deliver)."""
        by_queue: dict[QueueType, list[int]] = {}
        for delivery in ids:
            record = self._unacked.pop(delivery, None)
            if record is None:
                continue
            q, seq, c = record
            if c is not None:
                c.unacked -= 1
            by_queue.setdefault(q, []).append(seq)
        for q, seqs in by_queue.items():
            if op == "ack":
                q.ack(seqs)
                continue
            try:
                q.reject(seqs, requeue)
            except AMQPError:
                # a stream refuses reject: the peer refused its client's already; what is
                # left is a closing channel's requeue, and a log has nothing to put back
                pass

    def requeue_for(self, cid: int, ids: list[int]) -> None:
        """Deliveries that reached the peer after its consumer was cancelled."""
        self.settle(ids, "reject", True)

    def consumer_cancelled_by_queue(self, consumer: Consumer) -> None:
        cid = self._cids.pop(consumer, None)
        if cid is not None:
            self.consumers.pop(cid, None)
            self.link.control({"op": "cancel", "cid": cid})

    def resume(self) -> None:
        self.writer.full = False
        for q in {c.queue for c in self.consumers.values()}:
            q.wake()

    def down(self) -> None:
        """The link is gone: the peer's consumers go, what they had not acked is requeued."""
        for c in list(self.consumers.values()):
            c.queue.remove_consumer(c)
        self.consumers.clear()
        self._cids.clear()
        by_queue: dict[QueueType, list[int]] = {}
        for q, seq, _ in self._unacked.values():
            by_queue.setdefault(q, []).append(seq)
        self._unacked.clear()
        for q, seqs in by_queue.items():
            q.requeue(seqs)
