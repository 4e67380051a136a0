"""Hare: an AMQP 0-9-1 message broker shaped like RabbitMQ."""

__version__ = "0.1.0"
