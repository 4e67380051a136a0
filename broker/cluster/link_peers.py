"""What a home node's queues see of the peer's channels across a link: a `LinkSender` per
publishing channel (confirms and credit go back to it), and one `LinkChannel` per link for
the peer's consumers (deliveries go to it, within each consumer's prefetch, while the link's
socket keeps up)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.cluster.link_codec import DeliverItem, encode_deliver
from broker.flow.credit_flow import CreditFlow
from broker.protocol.channel_state import ChannelState
from broker.protocol.errors import AMQPError
from broker.queue.consumer import Consumer
from broker.store.definitions import decode_table

if TYPE_CHECKING:
    from broker.cluster.link import Link
    from broker.message import Message
    from broker.queue.contract import QueueType
    from broker.queue.variable_queue import Entry

__all__ = ["LinkBackPressure", "LinkChannel", "LinkSender"]


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
    """The link's socket as a consumer's writer (broker/queue/contract.py ConsumerWriter):
    full while its buffer is past the high-water mark; never paused on its own."""

    def __init__(self) -> None:
        self.paused = False
        self.full = False


class LinkChannel:
    """The peer's consumers of our queues, as one channel (broker/queue/contract.py
    ConsumerChannel): `Consumer.can_take` asks its writer about back-pressure (the link's
    socket), and the queue calls `deliver`."""

    number = 0  # what the management API shows as its channel

    def __init__(self, link: Link) -> None:
        self.link = link
        self.state = ChannelState.OPEN
        self.flow_active = True
        self.global_prefetch = 0
        self.consumer_unacked = 0  # stays 0: the peer's channel holds its global prefetch
        self.writer = LinkBackPressure()
        self.reader = _LinkReader(link.peer)
        self.user = "(cluster)"
        self.consumers: dict[int, Consumer] = {}
        self._cids: dict[Consumer, int] = {}
        # deliveries the peer has not settled, by a number of the link's own (a queue's seq
        # is not enough: two consumers of one stream read the same offsets)
        self._unacked: dict[int, tuple[QueueType, int, Consumer | None]] = {}
        self._next_id = 1
        self._out: dict[int, list[DeliverItem]] = {}

    def subscribe(self, m: dict[str, Any]) -> None:
        q = self.link._local_queue(m["v"], m["q"])
        if q is None or q.deleted:
            self.link.control({"op": "cancel", "cid": m["cid"]})
            return
        c = Consumer(m["tag"], self, q, no_ack=m["no_ack"],
                     exclusive=m["exclusive"], prefetch=m["prefetch"], priority=m["priority"],
                     arguments=decode_table(m["args"]) if m.get("args") else None)
        self.consumers[m["cid"]] = c
        self._cids[c] = m["cid"]
        q.add_consumer(c)

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
