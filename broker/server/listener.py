"""The AMQP listener: IPv4 and IPv6 on all interfaces by default, as RabbitMQ."""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

import structlog

from broker.server.reader import Reader

if TYPE_CHECKING:
    from broker.node import Node

__all__ = ["start_listeners"]

log = structlog.get_logger("hare.listener")


async def start_listeners(node: Node, host: str, port: int) -> list[asyncio.Server]:
    loop = asyncio.get_running_loop()

    def factory() -> Reader:
        return Reader(node)

    if host:
        server = await loop.create_server(
            factory, host, port, reuse_address=True, backlog=1024
        )
        _tune(server)
        return [server]
    servers = []
    server4 = await loop.create_server(
        factory, "0.0.0.0", port, reuse_address=True, backlog=1024, family=socket.AF_INET
    )
    servers.append(server4)
    bound = server4.sockets[0].getsockname()[1]
    if socket.has_ipv6:
        try:
            servers.append(
                await loop.create_server(
                    factory, "::", bound, reuse_address=True, backlog=1024,
                    family=socket.AF_INET6,
                )
            )
        except OSError as exc:  # no IPv6 on this host: IPv4 alone is fine
            log.info("IPv6 listener unavailable", error=str(exc))
    for s in servers:
        _tune(s)
    return servers


def _tune(server: asyncio.Server) -> None:
    for sock in server.sockets:
        if sock.family == socket.AF_INET6:
            try:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            except OSError:
                pass
