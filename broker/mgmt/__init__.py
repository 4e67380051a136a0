"""The management plugin: HTTP API, Prometheus metrics and the management page, served by one
aiohttp listener in the broker's own event loop (docs/MANAGEMENT.md)."""

from broker.mgmt.plugin import Management

__all__ = ["Management"]
