"""The management plugin: HTTP API, Prometheus metrics and the management page, served by one
aiohttp listener in the broker's own event loop (docs/MANAGEMENT.md)."""

from broker.mgmt.server import ManagementServer, start_management

__all__ = ["ManagementServer", "start_management"]
