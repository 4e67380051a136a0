"""A consumer: one basic.consume on one channel. The channel owns its counters; the queue asks
`can_take()` before each delivery (prefetch per consumer and per channel, writer back-pressure,
channel.flow)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.protocol.channel_state import ChannelState
from broker.protocol.frames import shortstr

if TYPE_CHECKING:
    from broker.queue.amqqueue import AMQQueue
    from broker.server.channel import Channel

__all__ = ["Consumer"]

_OPEN = ChannelState.OPEN


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
        "unacked",
    )

    def __init__(
        self,
        tag: str,
        channel: Channel,
        queue: AMQQueue,
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

    def __repr__(self) -> str:
        return f"<Consumer {self.tag!r} on {self.queue.name!r}>"
