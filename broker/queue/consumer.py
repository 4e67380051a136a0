"""A consumer: one basic.consume on one channel. The channel owns its counters; the queue asks
`can_take()` before each delivery (prefetch per consumer and per channel, writer back-pressure,
channel.flow)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.protocol.channel_state import ChannelState
from broker.protocol.constants import ACCESS_REFUSED
from broker.protocol.errors import ChannelError
from broker.protocol.frames import shortstr

if TYPE_CHECKING:
    from broker.queue.contract import ConsumerChannel, QueueType

__all__ = ["PROMPT_TICKS", "Consumer", "check_exclusive_use"]

_OPEN = ChannelState.OPEN
PROMPT_TICKS = 2


class Consumer:
    __slots__ = (
        "arguments",
        "channel",
        "exclusive",
        "no_ack",
        "prefetch",
        "priority",
        "queue",
        "tag",
        "tag_sstr",
        "tick",
        "tick_tag",
        "unacked",
    )

    def __init__(
        self,
        tag: str,
        channel: ConsumerChannel,
        queue: QueueType,
        *,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
        arguments: dict[str, Any] | None = None,
        priority: int = 0,
    ) -> None:
        self.tag = tag
        self.tag_sstr = shortstr(tag)
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch  # 0 = unlimited
        self.unacked = 0
        self.arguments = arguments or {}
        self.priority = priority  # x-priority: higher ones are served first
        # the loop iteration (broker/flow/loop_ticks.py) of the latest deliveries to this
        # consumer and the first delivery tag given in it: an ack that reaches it within
        # an iteration or two came from a consumer that is waiting on the broker
        self.tick = -1
        self.tick_tag = 0

    def can_take(self) -> bool:
        """May the queue deliver to this consumer now: channel open and flowing, its writer
        not backed up, prefetch (per consumer and per channel) not used up. Asked before
        every delivery, so the checks are inline."""
        ch = self.channel
        w = ch.writer
        if w.paused or w.full or ch.state is not _OPEN or not ch.flow_active:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        limit = ch.global_prefetch
        return not limit or ch.consumer_unacked < limit

    def room(self, limit: int) -> int:
        """How many deliveries, up to `limit`, this consumer may take now: `can_take`'s
        checks once for a run of deliveries to it alone (its writer filling up meanwhile is
        for the caller to watch)."""
        ch = self.channel
        w = ch.writer
        if w.paused or w.full or ch.state is not _OPEN or not ch.flow_active:
            return 0
        if self.no_ack:
            return limit
        if self.prefetch:
            limit = min(limit, self.prefetch - self.unacked)
        if ch.global_prefetch:
            limit = min(limit, ch.global_prefetch - ch.consumer_unacked)
        return max(limit, 0)

    def waiting_on_us(self, acked_tag: int, now_tick: int) -> bool:
        """An ack of `acked_tag` says this consumer has been through everything it was sent
        and is idle until the broker sends more: it acks its latest deliveries, and they went
        out at most PROMPT_TICKS loop iterations ago (a consumer that is slow itself acks
        old deliveries, or late)."""
        return acked_tag >= self.tick_tag and now_tick - self.tick <= PROMPT_TICKS

    def __repr__(self) -> str:
        return f"<Consumer {self.tag!r} on {self.queue.name!r}>"


def check_exclusive_use(queue: QueueType, exclusive: bool) -> None:
    """RabbitMQ's rule for basic.consume, judged where every consumer of `queue` is known (its
    home): refused (403) while a consumer holds it exclusively, and an exclusive consume is
    refused while it has any consumer."""
    if queue.has_exclusive_consumer() or (exclusive and queue.consumers):
        raise ChannelError(
            ACCESS_REFUSED,
            f"queue '{queue.name}' in vhost '{queue.vhost.name}' in exclusive use",
        )
