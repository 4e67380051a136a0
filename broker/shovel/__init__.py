"""Dynamic shovels (RabbitMQ's rabbitmq_shovel plugin, built in): move messages from a queue or
exchange of one broker to a queue or exchange of another (or the same), as an AMQP client.

definition.py  the plugin's keys: validated into a ShovelDefinition (400 with the reason)
worker.py      one shovel: connect both sides, consume, republish, ack on confirm, reconnect
plugin.py      the node plugin: the "shovel" parameter component, its file, the running workers
"""

from broker.shovel.plugin import Shovels

__all__ = ["Shovels"]
