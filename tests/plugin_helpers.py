"""What the shovel and federation tests share: whether a RabbitMQ answers on 127.0.0.1:5672
(the tests that run against one skip otherwise), and a queue's depth over AMQP."""

from __future__ import annotations

import socket

import aio_pika


def rabbitmq_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


async def queue_depth(url: str, queue: str) -> int:
    """Its ready messages (passive declare: the queue must exist)."""
    async with await aio_pika.connect(url) as conn:
        q = await (await conn.channel()).declare_queue(queue, passive=True)
        return q.declaration_result.message_count or 0
