"""Which class serves a queue of each x-queue-type (RabbitMQ's rabbit_queue_type:discover)."""

from __future__ import annotations

from typing import Any

from broker.queue.amqqueue import AMQQueue
from broker.queue.quorum_queue import QuorumQueue
from broker.queue.stream_queue import StreamQueue

__all__ = ["queue_class"]


def queue_class(arguments: dict[str, Any]) -> type[AMQQueue] | type[StreamQueue]:
    """The class of a queue declared with these (validated) arguments."""
    kind = arguments.get("x-queue-type")
    if kind == "quorum":
        return QuorumQueue
    if kind == "stream":
        return StreamQueue
    return AMQQueue
