"""What the node offers the parts that run beside it (RabbitMQ's plugins, fed by rabbit_event).

A plugin is registered on the node before it starts (`Node.add_plugin`), is started once the
node serves AMQP, with the listeners it serves among those the node bound, and is stopped
first. Events are what the broker's parts report as they happen; a plugin subscribes to the
ones it needs. The node and the channel know no plugin by name: the management API
(broker/mgmt) is one, registered by hare-server (broker/cli.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from broker.node.node import Node
    from broker.server.channel import Channel
    from broker.server.listener import Listener

__all__ = ["Event", "NodeEvents", "ParameterComponent", "Plugin"]

T = TypeVar("T")


class Event(Generic[T]):
    """One kind of event: its handlers are called in turn with the event's subject, on the loop
    and at once (plain calls, quick: they run inside the part that reports)."""

    __slots__ = ("_handlers",)

    def __init__(self) -> None:
        self._handlers: list[Callable[[T], None]] = []

    def subscribe(self, handler: Callable[[T], None]) -> None:
        self._handlers.append(handler)

    def unsubscribe(self, handler: Callable[[T], None]) -> None:
        self._handlers.remove(handler)

    def notify(self, subject: T) -> None:
        for handler in self._handlers:
            handler(subject)


class NodeEvents:
    """The events a node's parts report."""

    __slots__ = ("channel_closed", "definition_changed", "nodes_changed")

    def __init__(self) -> None:
        # a channel has ended: its counters are final (the management's totals keep them)
        self.channel_closed: Event[Channel] = Event()
        # (vhost, what, object) as Node.changed gets it: an exchange, queue, binding, policy
        # or vhost changed (reported before a policy change is applied: act on the next turn)
        self.definition_changed: Event[tuple[str | None, str, object]] = Event()
        # (node name, running): a node of the cluster (a worker of a multi-worker server)
        # started or stopped running; what runs once in the cluster is placed again
        self.nodes_changed: Event[tuple[str, bool]] = Event()


class Plugin(Protocol):
    """A part started and stopped with the node."""

    # the protocols of the node's listeners it serves ("http", "https"); () for none
    listens: tuple[str, ...]

    def restore(self, node: Node) -> None:
        """Before the cluster's definitions are taken (the node has restored its own): register
        the plugin's parameter components and load what it kept on disk, running nothing yet,
        so the cluster's state can be applied over it (or seeded from it)."""

    async def start(self, node: Node, listeners: list[Listener]) -> None:
        """Serve `listeners` (bound and listening; empty when none of its protocols is on)."""

    async def stop(self) -> None:
        """First in the node's stop (before its clients are closed), or when the node's start
        fails after this plugin started. A plugin that served nothing has nothing to stop."""


class ParameterComponent(Protocol):
    """A component of runtime parameters a plugin owns (RabbitMQ's rabbit_runtime_parameter:
    "shovel"), registered in `Node.parameter_components` so the management API can serve
    /api/parameters/{component} without knowing the plugin."""

    def parameters(self) -> list[dict[str, object]]:
        """Every parameter as {"vhost", "component", "name", "value"}."""

    def put(self, vhost: str, name: str, value: object, user: str | None) -> bool:
        """Validate and apply; True when new. A malformed value raises ValueError whose text is
        the reason (HTTP 400), and nothing changes."""

    def delete(self, vhost: str, name: str) -> bool:
        """Remove and stop it; False when there was none."""

    def status(self) -> list[dict[str, object]]:
        """What each instance running on this node is doing (GET /api/shovels; the other
        nodes' rows are theirs to give)."""

    def records(self) -> list[dict[str, object]]:
        """Every parameter as the cluster keeps it: {"vhost", "name", "value", "user"}."""

    def apply(self, vhost: str, name: str, record: dict[str, object] | None) -> None:
        """The cluster's state of one parameter (another node's put or delete, or the
        cluster's at start; None: there is none), made this node's without reporting it."""
