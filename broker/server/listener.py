"""The listeners: AMQP, AMQPS and the management's HTTP and HTTPS.

Start-up binds every listener's sockets first (before recovery), listens on all of them once
the broker is ready, and only then accepts on any, so a port that is taken stops the broker
before it has accepted a single connection, with a message that names the listener that
failed. An empty host means all interfaces, IPv4 and IPv6, as RabbitMQ."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from broker.server.reader import Reader

if TYPE_CHECKING:
    from broker.node import Node

__all__ = [
    "BANNERS",
    "PROTOCOLS",
    "Listener",
    "ListenerError",
    "adopt",
    "bind",
    "close_all",
    "listen_all",
    "serve_amqp",
    "stop_accepting",
]

log = structlog.get_logger("hare.listener")

# RabbitMQ's protocol names (as /api/overview lists them) and how messages call each one
PROTOCOLS = {"amqp": "AMQP", "amqp/ssl": "AMQPS", "http": "management",
             "https": "management HTTPS"}
BACKLOG = 1024
# the line printed per listener once the broker serves (tests and supervisors wait for it):
# AMQP first, then management HTTP, AMQPS, management HTTPS when on
BANNERS = {"amqp": "hare-server", "http": "hare-management", "amqp/ssl": "hare-server amqps",
           "https": "hare-management https"}


class ListenerError(Exception):
    """A listener that cannot bind: one line naming it, its port and the reason."""


@dataclass(slots=True)
class Listener:
    """One listener's sockets: bound by `bind`, listening once served."""

    protocol: str
    host: str
    port: int  # the bound one (the one asked for, or the one picked for 0)
    tls: ssl.SSLContext | None
    sockets: list[socket.socket] = field(default_factory=list)
    servers: list[asyncio.Server] = field(default_factory=list)
    acceptors: list[asyncio.Task[None]] = field(default_factory=list)  # AMQPS accept loops
    handshakes: set[asyncio.Task[None]] = field(default_factory=set)  # AMQPS: TLS under way

    @property
    def what(self) -> str:
        return PROTOCOLS[self.protocol]


def _addresses(host: str, port: int) -> list[tuple[socket.AddressFamily, tuple[str, int]]]:
    if not host:
        wildcard = [(socket.AF_INET, ("0.0.0.0", port))]
        if socket.has_ipv6:
            wildcard.append((socket.AF_INET6, ("::", port)))
        return wildcard
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    seen: list[tuple[socket.AddressFamily, tuple[str, int]]] = []
    for family, _, _, _, address in infos:
        entry = (family, (str(address[0]), port))
        if entry not in seen:
            seen.append(entry)
    return seen


def _bind_one(family: socket.AddressFamily, address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            # the IPv4 socket has the v4 addresses; without this the two would collide
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def bind(protocol: str, host: str, port: int, tls: ssl.SSLContext | None = None) -> Listener:
    """Bind (not listen on) the listener's sockets; ListenerError if one cannot be bound."""
    listener = Listener(protocol, host, port, tls)
    try:
        addresses = _addresses(host, port)
    except OSError as exc:  # an unknown host name
        raise ListenerError(
            f"cannot listen on {listener.what} port {port}: host {host!r}: {_reason(exc)}"
        ) from None
    for family, (address, _) in addresses:
        try:
            sock = _bind_one(family, (address, listener.port))
        except OSError as exc:
            if not host and family == socket.AF_INET6 and listener.sockets:
                # no IPv6 on this host (or the picked port is taken there): IPv4 alone is fine
                log.info("IPv6 listener unavailable", listener=protocol, error=str(exc))
                continue
            close_all([listener])
            listener.port = port  # name the port that was asked for
            raise _bind_error(listener, exc, address if host else "") from None
        listener.sockets.append(sock)
        listener.port = sock.getsockname()[1]  # port 0: the rest bind the port picked here
    return listener


def adopt(protocol: str, host: str, fds: list[int],
          tls: ssl.SSLContext | None = None) -> Listener:
    """A listener on sockets bound (and listening) in another process and inherited by this
    one: a worker of a multi-worker hare-server accepts on its parent's sockets."""
    socks = [socket.socket(fileno=fd) for fd in fds]
    for sock in socks:
        sock.setblocking(False)
    return Listener(protocol, host, socks[0].getsockname()[1], tls, socks)


def listen_all(listeners: list[Listener]) -> None:
    """Listen on every bound socket, accepting nothing yet. Binding alone cannot see every
    clash: Linux lets two SO_REUSEADDR sockets bind one port while neither listens (two
    listeners given the same port, or a broker starting beside another), so the clash shows
    here, still before any listener has accepted a connection."""
    for listener in listeners:
        for sock in listener.sockets:
            try:
                sock.listen(BACKLOG)
            except OSError as exc:
                close_all(listeners)
                raise _bind_error(listener, exc, "") from None


def _bind_error(listener: Listener, exc: OSError, address: str) -> ListenerError:
    if exc.errno == errno.EADDRINUSE:
        return ListenerError(f"{listener.what} port {listener.port} is already in use")
    where = f" (host {address})" if address else ""
    return ListenerError(f"cannot listen on {listener.what} port {listener.port}{where}: "
                         f"{_reason(exc)}")


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def close_all(listeners: list[Listener]) -> None:
    """Close what start-up had opened when it fails half-way."""
    stop_accepting(listeners)
    for listener in listeners:
        if not listener.servers:  # served ones: their servers own the sockets
            for sock in listener.sockets:
                sock.close()
        listener.sockets.clear()


async def serve_amqp(node: Node, listener: Listener) -> None:
    """Listen and accept on an AMQP or AMQPS listener's bound sockets."""
    loop = asyncio.get_running_loop()
    if listener.tls is not None:
        for sock in listener.sockets:
            task = loop.create_task(_accept_tls(node, listener, sock))
            listener.acceptors.append(task)
        return

    def factory() -> Reader:
        return Reader(node)

    for sock in listener.sockets:
        listener.servers.append(await loop.create_server(factory, sock=sock, backlog=BACKLOG))


def stop_accepting(listeners: list[Listener]) -> list[asyncio.Server]:
    """Close every listening socket and drop TLS handshakes under way; the servers are
    returned so the caller can wait for them once the clients are gone."""
    servers = [server for x in listeners for server in x.servers]
    for server in servers:
        server.close()
    for listener in listeners:
        for task in [*listener.acceptors, *listener.handshakes]:
            task.cancel()
        if listener.acceptors:
            for sock in listener.sockets:
                sock.close()
    return servers


# AMQPS accepts through its own loop and `loop.connect_accepted_socket(ssl=...)`, not through
# `create_server(ssl=...)`: only then does a refused handshake (no client certificate, an
# unknown CA, an old TLS version, a timeout) come back as an exception, to be logged with its
# reason as RabbitMQ logs TLS alerts; the event loops drop those silently. Accepting is no hot
# path; once the handshake is done the connection is the same uvloop transport either way.
_ACCEPT_RETRY_DELAY_S = 1.0  # asyncio's own pause when accept() runs out of descriptors


async def _accept_tls(node: Node, listener: Listener, sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    while True:
        try:
            conn, address = await loop.sock_accept(sock)
        except OSError as exc:
            log.error("accept failed", listener=listener.protocol, error=str(exc))
            await asyncio.sleep(_ACCEPT_RETRY_DELAY_S)
            continue
        peer = f"{address[0]}:{address[1]}"
        task = loop.create_task(_tls_handshake(node, listener, conn, peer))
        listener.handshakes.add(task)
        task.add_done_callback(listener.handshakes.discard)


async def _tls_handshake(node: Node, listener: Listener, conn: socket.socket,
                         peer: str) -> None:
    """The Reader's connection_made comes once the handshake is done (uvloop's SSLProtocol
    calls it); a failure is one warning with the peer and OpenSSL's reason."""
    loop = asyncio.get_running_loop()
    try:
        await loop.connect_accepted_socket(
            lambda: Reader(node), conn, ssl=listener.tls,
            ssl_handshake_timeout=node.settings.ssl_handshake_timeout_s,
        )
    except asyncio.CancelledError:
        conn.close()
        raise
    except (OSError, ConnectionError, TimeoutError) as exc:  # ssl.SSLError is an OSError
        log.warning("TLS handshake failed", peer=peer, reason=_tls_reason(exc))
        conn.close()  # a no-op when the transport already has (it detaches the socket)


def _tls_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason  # e.g. PEER_DID_NOT_RETURN_A_CERTIFICATE, TLSV1_ALERT_UNKNOWN_CA
    return str(exc) or type(exc).__name__
