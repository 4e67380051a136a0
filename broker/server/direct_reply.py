"""Direct reply-to (RabbitMQ's amq.rabbitmq.reply-to): RPC replies that reach a consumer
without a queue.

A channel consumes (no-ack) from the pseudo-queue `amq.rabbitmq.reply-to` and gets a reply name
`amq.rabbitmq.reply-to.<key>`; its publishes with `reply_to` set to the pseudo-queue's name go
out with that name instead. A reply published to the name through the default exchange is
handed straight to the channel, as a delivery to its reply consumer. As RabbitMQ, the reply
name is not a queue: such a publish counts as unroutable (a mandatory one is returned too, and
a confirm is an ack), and a name nobody holds drops the reply.

The registry is the node's: a reply may come from any connection. In a cluster (a
multi-worker hare-server's workers are one) the name carries its node's name, so a reply
published on another node is forwarded there over the link (`cluster.forward_reply`)."""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.server.channel import Channel

__all__ = ["REPLY_PREFIX", "REPLY_QUEUE", "ReplyRegistry", "may_reply_to", "reply_node"]

REPLY_QUEUE = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_QUEUE + "."
_REPLY_BYTES = REPLY_QUEUE.encode()
_FLAG_REPLY_TO = 0x02  # reply_to (0x0200) in the first byte of the property flags


def may_reply_to(props: bytes) -> bool:
    """Raw-bytes test before decoding: reply_to is set and the pseudo-queue's name is there."""
    return bool(props[0] & _FLAG_REPLY_TO) and _REPLY_BYTES in props


def _node_key(node: str) -> str:
    return base64.urlsafe_b64encode(node.encode()).decode().rstrip("=")


def reply_node(name: str) -> str | None:
    """The node whose channel holds reply name `name` (`amq.rabbitmq.reply-to.<node>.<key>`,
    as RabbitMQ's names carry their node), or None for a name not of that form."""
    node_key, dot, _ = name[len(REPLY_PREFIX):].partition(".")
    if not dot or not node_key:
        return None
    try:
        return base64.urlsafe_b64decode(node_key + "=" * (-len(node_key) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


class ReplyRegistry:
    """Reply name -> the channel consuming from the pseudo-queue under it. The key is random
    (128 bits), so a name cannot be guessed from another one."""

    __slots__ = ("_channels", "_prefix")

    def __init__(self, node: str = "") -> None:
        self._channels: dict[str, Channel] = {}
        self._prefix = REPLY_PREFIX + _node_key(node) + "." if node else REPLY_PREFIX

    def register(self, channel: Channel) -> str:
        name = self._prefix + secrets.token_urlsafe(16)
        self._channels[name] = channel
        return name

    def unregister(self, name: str) -> None:
        self._channels.pop(name, None)

    def lookup(self, name: str) -> Channel | None:
        return self._channels.get(name)
