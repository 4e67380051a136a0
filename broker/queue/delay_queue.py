"""The queue that holds a delayed-message exchange's messages of one delay until they are due.

It is a classic queue with that delay as its message TTL: messages of one delay fall due in the
order they came, so the TTL timer of the head is the only timer, and the messages page to disk
like any queue's (bounded memory, however many are pending). When one expires it is published
to its exchange again with `x-delay` negated, as the plugin delivers it, so it routes at once.
The queue is in no vhost listing and no exchange reaches it by name (vhost.py keeps it on the
exchange, not in `VHost.queues`)."""

from __future__ import annotations

import asyncio
import time
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
    """Durable for a durable exchange: its persistent messages are confirmed once on disk and
    recovered at start. A recovered message has lost its due time (expiry is kept in memory
    only), so it falls due `delay` after the recovery: late rather than early."""

    def __init__(self, vhost: VHost, exchange: str, delay: int, *, durable: bool = False
                 ) -> None:
        super().__init__(vhost, delay_queue_name(exchange, delay), durable=durable,
                         arguments={"x-message-ttl": delay})
        self.exchange = exchange
        self.delay = delay
        self._recovered_due = 0.0  # when the recovered messages fall due

    def recover(self) -> int:
        n = super().recover()
        self._recovered_due = time.monotonic() + self.delay / 1000.0
        return n

    def start(self) -> None:
        super().start()
        if self.bq:
            self._arm_ttl()

    def _arm_ttl(self) -> None:
        head = self.bq.peek()
        if head is not None and not head[3]:  # recovered: no due time of its own
            if self._ttl_timer is not None:
                self._ttl_timer.cancel()
                self._ttl_timer = None
            if time.monotonic() >= self._recovered_due:
                entry = self.bq.fetch(True)
                if entry is not None:
                    if self._dead_letter(entry[1], dlx.EXPIRED, entry[0]):
                        self.bq.ack((entry[0],))
                    else:
                        self.bq.restore((entry[0],))
                        return
                    if self.durability is not None:
                        self.durability.end_batch()
                # the next one, at once (a call per message keeps the loop responsive)
                asyncio.get_running_loop().call_soon(self._on_ttl_timer)
            else:
                loop = asyncio.get_running_loop()
                self._ttl_timer = loop.call_at(
                    loop.time() + self._recovered_due - time.monotonic(), self._on_ttl_timer)
            return
        super()._arm_ttl()

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
