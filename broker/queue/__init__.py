"""Queues: the queue task (amqqueue), consumers and prefetch, dead-lettering, TTL, paging."""
