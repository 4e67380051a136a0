"""Federation (RabbitMQ's rabbitmq_federation plugin, built in): exchanges and queues of this
broker that receive what is published to (or waits in) their namesakes on other brokers, as
an AMQP client of those brokers, chosen by policy (docs/FEDERATION.md).

upstream.py  upstreams and upstream sets: the plugin's keys, validated; the loop rules
link.py      one link per (exchange or queue, upstream): connect, mirror bindings, republish
plugin.py    the node plugin: the parameter components, their file, which links run
"""

from broker.federation.plugin import Federation

__all__ = ["Federation"]
