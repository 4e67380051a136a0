"""The node: one broker process.

node.py     the Node: settings, vhosts, auth, connections, alarms, listeners; start/stop order
durable.py  the definitions database <-> the live topology; durable queues get their index and
            store; the restart order
"""

from broker.node.node import Node

__all__ = ["Node"]
