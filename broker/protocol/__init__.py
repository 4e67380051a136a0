"""AMQP 0-9-1 wire protocol: frames, codec fast paths, state machines, errors. No asyncio here."""

import re

from pamqp import constants as _pamqp_constants

# pamqp checks exchange and queue names against a client-side pattern ([a-zA-Z0-9-_.:@#,/+ ])
# whenever a command is built: also when Hare answers queue.declare-ok or delivers with a name
# a client chose (541 for "a -> b"), and when the plugins' aio-pika clients declare the
# federation plugin's "federation: X -> node" queues. RabbitMQ takes any name a shortstr holds,
# so pamqp's check is opened to any name (process-wide: the one place pamqp is set up).
for _kind in ("exchange-name", "queue-name"):
    _pamqp_constants.DOMAIN_REGEX[_kind] = re.compile(r".*", re.DOTALL)
