"""Direct reply-to (RabbitMQ's amq.rabbitmq.reply-to): RPC replies that reach a consumer
without a queue.

A channel consumes (no-ack) from the pseudo-queue `amq.rabbitmq.reply-to` and gets a reply name
`amq.rabbitmq.reply-to.<key>`; its publishes with `reply_to` set to the pseudo-queue's name go
out with that name instead. A reply published to the name through the default exchange is
handed straight to the channel, as a delivery to its reply consumer. As RabbitMQ, the reply
name is not a queue: such a publish counts as unroutable (a mandatory one is returned too, and
a confirm is an ack), and a name nobody holds drops the reply.

The registry is the node's: a reply may come from any connection."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.server.channel import Channel

__all__ = ["REPLY_PREFIX", "REPLY_QUEUE", "ReplyRegistry", "may_reply_to"]

REPLY_QUEUE = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_QUEUE + "."
_REPLY_BYTES = REPLY_QUEUE.encode()
_FLAG_REPLY_TO = 0x02  # reply_to (0x0200) in the first byte of the property flags


def may_reply_to(props: bytes) -> bool:
    """Raw-bytes test before decoding: reply_to is set and the pseudo-queue's name is there."""
    return bool(props[0] & _FLAG_REPLY_TO) and _REPLY_BYTES in props


class ReplyRegistry:
    """Reply name -> the channel consuming from the pseudo-queue under it. The key is random
    (128 bits), so a name cannot be guessed from another one."""

    __slots__ = ("_channels",)

    def __init__(self) -> None:
        self._channels: dict[str, Channel] = {}

    def register(self, channel: Channel) -> str:
        name = REPLY_PREFIX + secrets.token_urlsafe(16)
        self._channels[name] = channel
        return name

    def unregister(self, name: str) -> None:
        self._channels.pop(name, None)

    def lookup(self, name: str) -> Channel | None:
        return self._channels.get(name)
