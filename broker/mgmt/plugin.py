"""The management plugin as the node sees it (RabbitMQ's rabbitmq_management): registered on
the node before start (broker/cli.py), handed the HTTP and HTTPS listeners the node bound, fed
the node's events. aiohttp is imported only when a listener is on: it costs start-up time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.mgmt.stats import SAMPLE_INTERVAL_S, Stats

if TYPE_CHECKING:
    from aiohttp import web

    from broker.node import Node
    from broker.server.listener import Listener

__all__ = ["Management"]


class Management:
    """The HTTP API, /metrics and the page, with the sampler behind their rates and totals."""

    listens = ("http", "https")

    def __init__(self, sample_interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.sample_interval_s = sample_interval_s
        self.stats: Stats | None = None
        self._node: Node | None = None
        self._runner: web.AppRunner | None = None

    def restore(self, node: Node) -> None:
        pass  # no definitions of its own

    async def start(self, node: Node, listeners: list[Listener]) -> None:
        if not listeners:
            return  # management_port 0 and no HTTPS: nothing to serve, nothing to sample
        from broker.mgmt.app import serve
        from broker.mgmt.peers import register

        stats = Stats(node, self.sample_interval_s)
        self._runner = await serve(node, stats, listeners)
        register(node, stats)  # our part of the other nodes' answers (plugins' status too)
        self.stats, self._node = stats, node
        # a channel's counters join the totals when it closes, not at the next sample
        node.events.channel_closed.subscribe(stats.channel_closed)
        stats.start()

    async def stop(self) -> None:
        if self.stats is None or self._node is None or self._runner is None:
            return
        self._node.events.channel_closed.unsubscribe(self.stats.channel_closed)
        self._node.peer_handlers.clear()
        await self.stats.stop()
        await self._runner.cleanup()
        self.stats = self._node = self._runner = None
