"""AMQP 0-9-1 wire protocol: frames, codec fast paths, state machines, errors. No asyncio here."""
