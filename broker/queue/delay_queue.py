"""The queue that holds a delayed-message exchange's messages of one delay until they are due.

It is a classic queue with that delay as its message TTL: messages of one delay fall due in the
order they came, so the TTL timer of the head is the only timer, and the messages page to disk
like any queue's (bounded memory, however many are pending). When one expires it is published
to its exchange again with `x-delay` negated, as the plugin delivers it, so it routes at once.
The queue is in no vhost listing and no exchange reaches it by name (vhost.py keeps it on the
exchange, not in `VHost.queues`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from broker.message import Message
from broker.protocol.properties import encode_field_value, rewrite_properties
from broker.queue import dead_letter as dlx
from broker.queue.amqqueue import AMQQueue

if TYPE_CHECKING:
    from broker.vhost import VHost

__all__ = ["DelayQueue", "delay_queue_name"]

log = structlog.get_logger("hare.queue")


def delay_queue_name(exchange: str, delay: int) -> str:
    return f"amq.delayed.{delay}.{exchange}"


class DelayQueue(AMQQueue):
    def __init__(self, vhost: VHost, exchange: str, delay: int) -> None:
        super().__init__(vhost, delay_queue_name(exchange, delay),
                         arguments={"x-message-ttl": delay})
        self.exchange = exchange
        self.delay = delay

    def _dead_letter(self, msg: Message, reason: str, seq: int = -1) -> bool:
        if reason != dlx.EXPIRED:
            return True
        try:
            props = rewrite_properties(
                msg.props, drop_headers=("x-delay",),
                add_headers={"x-delay": encode_field_value(-self.delay)})
            self.vhost.publish_internal(Message(self.exchange, msg.routing_key, props, msg.body))
        except Exception as exc:  # as dead-lettering: keep the message rather than lose it
            log.error("delayed message kept", exchange=self.exchange,
                                       vhost=self.vhost.name, error=repr(exc)[:200])
            return False
        return True
