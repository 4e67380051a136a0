"""The queue-type contract, written down: what a channel may call on any queue (classic,
quorum, stream, or one homed on another node), and what a queue may call on the channels that
publish to it and consume from it. Type-only (typing.Protocol): nothing here runs on the hot
path; mypy holds the implementations to it and tests/queue/test_contract.py checks each class
has every member.

Publish, deliver, ack and reject stay synchronous for every queue type (the hot path pays for
no awaitable); the rare operations that a queue may answer later (a remote queue over the
link, a quorum queue after a commit) are coroutines on every queue type, so callers always
await them and never ask which kind they hold."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from broker.flow.credit_flow import CreditFlow
    from broker.message import Message
    from broker.protocol.channel_state import ChannelState
    from broker.queue.arguments import QueueArgs
    from broker.queue.consumer import Consumer
    from broker.queue.policy_args import AppliedPolicies
    from broker.queue.variable_queue import Entry
    from broker.vhost import VHost

__all__ = ["ConsumerChannel", "ConsumerWriter", "PublishingChannel", "QueueType"]


@runtime_checkable
class PublishingChannel(Protocol):
    """What a queue calls on a channel that published to it (a client's channel, a link's
    sender on the home node, a quorum queue's dead-letterer)."""

    @property
    def credit_flow(self) -> CreditFlow:
        """The sender's credit: the queue grants, and says peer_down when it goes."""
        ...

    def queue_confirmed(self, queue: Any, seqs: list[int], rejected: list[int]) -> None:
        """These publish sequence numbers are safe in (seqs) or refused by (rejected) queue."""
        ...

    def publishes_lost(self, queue: Any, items: list[tuple[Message, int]]) -> None:
        """These publishes never reached queue (its home node is down): return or nack them."""
        ...


@runtime_checkable
class ConsumerWriter(Protocol):
    """The back-pressure a queue reads off a consumer's channel before each delivery."""

    @property
    def paused(self) -> bool:
        """The socket stopped taking bytes."""
        ...

    @property
    def full(self) -> bool:
        """Past the buffer limit (or a remote consumer's credit): deliver no more until it
        drains."""
        ...


@runtime_checkable
class ConsumerChannel(Protocol):
    """What a queue (and Consumer.can_take) reads and calls on a consumer's channel: a
    client's channel, or the link's channel for the peer node's consumers."""

    state: ChannelState  # deliveries go to an OPEN channel only
    flow_active: bool  # channel.flow
    global_prefetch: int  # basic.qos global: 0 for none
    consumer_unacked: int  # the channel's unacked deliveries, against global_prefetch

    @property
    def writer(self) -> ConsumerWriter:
        """Its connection's writer, for paused/full."""
        ...

    def deliver(self, consumer: Consumer, queue: Any, entry: Entry) -> None:
        """Send entry to consumer (the queue has checked Consumer.can_take or room)."""
        ...

    def consumer_cancelled_by_queue(self, consumer: Consumer) -> None:
        """The queue went away with consumer on it: tell the client (basic.cancel)."""
        ...

    def wake_queues(self) -> None:
        """Room in its global prefetch came back: its consumers' queues look again."""
        ...


@runtime_checkable
class QueueType(Protocol):
    """What a channel (and the link, for the peer's clients) may call on any queue."""

    name: str
    vhost: VHost
    home: str  # the node it lives on (this node's name for a local queue)
    durable: bool
    auto_delete: bool
    exclusive_owner: object | None
    deleted: bool
    arguments: dict[str, Any]  # as declared
    args: QueueArgs  # as resolved with the policies that apply
    consumers: Any  # this node's consumers of it, in the queue type's own collection

    @property
    def credit_flow(self) -> Any:
        """Its side of credit flow (peer_down when a publishing channel goes)."""
        ...

    @property
    def message_count(self) -> int:
        """Messages ready here (0 for a queue homed elsewhere: see counts)."""
        ...

    @property
    def consumer_count(self) -> int:
        """Consumers on this node."""
        ...

    # -- hot path: synchronous on every queue type ------------------------------------------
    def post_publishes(self, channel: PublishingChannel | None,
                       items: list[tuple[Message, int]]) -> None:
        """A batch routed here; confirms go back to channel.queue_confirmed (seq 0: none)."""
        ...

    def publish_now(self, channel: PublishingChannel, items: list[tuple[Message, int]]) -> None:
        """A batch routed here from a reader's callback (Channel.publish_now), taken in this
        loop iteration as post_publishes then drain would, without waking an idle task."""
        ...

    def ack(self, seqs: list[int]) -> None:
        """Deliveries settled by the consumer."""
        ...

    def reject(self, seqs: list[int], requeue: bool) -> None:
        """Deliveries rejected: requeued, or dead-lettered/dropped."""
        ...

    def requeue(self, seqs: list[int]) -> None:
        """A closing channel's unacked deliveries go back."""
        ...

    def consumer_waiting(self) -> None:
        """A consumer acked at once: it is waiting on us (flow: busy queues)."""
        ...

    # -- consumers --------------------------------------------------------------------------
    def check_consume(self, *, no_ack: bool, prefetch: int, global_prefetch: int,
                      arguments: dict[str, Any] | None) -> None:
        """Raise the queue type's refusal of this basic.consume, before consume-ok."""
        ...

    def add_consumer(self, consumer: Consumer) -> None:
        """basic.consume, after admit_consumer and consume-ok: deliveries start."""
        ...

    def remove_consumer(self, consumer: Consumer) -> Awaitable[None] | None:
        """basic.cancel or the channel closing. None: the consumer is off the queue now;
        else what completes when it is (a queue whose home is another node or worker) and
        never raises: basic.cancel's cancel-ok waits for it, a closing channel need not."""
        ...

    def consumer_activity(self, consumer: Consumer) -> tuple[bool, str]:
        """(active, activity status) of consumer, for single active consumer."""
        ...

    def has_exclusive_consumer(self) -> bool:
        """Some consumer holds it exclusively."""
        ...

    # -- rare, may answer later: coroutines on every queue type -----------------------------
    async def get(self, ack_required: bool) -> tuple[Entry, int] | None:
        """basic.get: (entry, messages left) or None for empty."""
        ...

    async def purge(self) -> int:
        """queue.purge: how many ready messages went."""
        ...

    async def counts(self) -> tuple[int, int]:
        """(messages, consumers) as the queue's home has them (queue.declare-ok)."""
        ...

    async def admit_consumer(self, consumer: Consumer) -> None:
        """basic.consume, before consume-ok: the queue's home judges exclusive use (403,
        check_exclusive_use) against every consumer it has, whatever their node; a queue
        homed elsewhere subscribes the consumer there meanwhile, nothing delivered to it
        before add_consumer."""
        ...

    # -- lifecycle --------------------------------------------------------------------------
    def touch(self) -> None:
        """A client used it: x-expires restarts (raises if it cannot be reached)."""
        ...

    def wake(self) -> None:
        """Look again for deliveries to make (a consumer's writer drained)."""
        ...

    def drain(self) -> None:
        """Process what was posted to it before a synchronous answer."""
        ...

    def set_policies(self, applied: AppliedPolicies) -> None:
        """The policies that apply to it changed."""
        ...

    def shutdown(self) -> None:
        """It leaves this node (deleted, or moved): consumers and publishers let go."""
        ...

    def stop(self) -> None:
        """Deleted."""
        ...

    def info(self) -> dict[str, Any]:
        """What the management API shows of it."""
        ...
