"""The node: one broker process. Owns the settings, vhosts, users, the open connections, the
alarms and the listeners, and shuts them down in a fixed order. Plugins (the management API)
are registered on it and fed its events (broker/node/plugin.py); it names none of them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from broker.access import AccessControl, Backend, InternalBackend, UserDB
from broker.cluster import make_cluster
from broker.config import Settings
from broker.flow.alarm import Alarms
from broker.flow.content_budget import ContentBudget
from broker.flow.disk_monitor import DiskMonitor
from broker.flow.memory_monitor import MemoryMonitor
from broker.flow.memory_pressure import QueueLoad, ram_targets
from broker.node.durable import Durable
from broker.node.plugin import NodeEvents, ParameterComponent, Plugin
from broker.queue.amqqueue import AMQQueue
from broker.server import limits
from broker.server.direct_reply import ReplyRegistry
from broker.server.handover import Handover, Siblings
from broker.server.listener import (
    Listener,
    adopt,
    bind,
    close_all,
    listen_all,
    serve_amqp,
    stop_accepting,
)
from broker.server.tls import tls_context
from broker.vhost import VHost

if TYPE_CHECKING:
    from broker.server.reader import Reader

__all__ = ["Node", "StartAborted", "bind_listeners"]

log = structlog.get_logger("hare.node")


class StartAborted(Exception):
    """Node.start saw its `abort` event set (SIGTERM while starting) and undid what it did."""


class Node:
    def __init__(self, settings: Settings, inherited: dict[str, list[int]] | None = None,
                 siblings: Siblings | None = None) -> None:
        self.settings = settings
        # a worker's connection placement: moves connections to the worker of their queues
        # (broker/server/handover.py); started with the AMQP listeners
        self.handover: Handover | None = None
        self._siblings = siblings if settings.connection_placement else None
        # a worker's listening sockets, bound by its parent (broker/node/supervisor.py)
        self.inherited = inherited or {}
        self.name = settings.node_name or f"hare@{socket.gethostname()}"
        # the hare-server this node is part of: its own, or a multi-worker server's (whose
        # workers share one machine and disk: docs/CLUSTER.md, "Servers")
        self.server = settings.cluster_server or self.name
        self.users = UserDB()
        self.auth = AccessControl(
            self.users,
            _backends(settings, self.users),
            settings.loopback_users,
            mechanisms=settings.auth_mechanisms,
            cert_login_from=settings.ssl_cert_login_from,
        )
        self.vhosts: dict[str, VHost] = {}
        self.connections: set[Reader] = set()
        self.listeners: list[Listener] = []  # AMQP first, then HTTP, AMQPS, HTTPS when on
        self.reply_registry = ReplyRegistry(self.name)  # direct reply-to names, across connections
        self.alarms = Alarms()
        self.peer_alarms: frozenset[str] = frozenset()  # raised on other nodes (workers)
        self.alarms.subscribe(self._alarm_changed)
        self.memory_monitor = MemoryMonitor(
            self.alarms,
            settings.vm_memory_high_watermark,
            interval=settings.memory_monitor_interval_s,
            paging_ratio=settings.vm_memory_high_watermark_paging_ratio,
            on_memory_pressure=self._memory_pressure,
        )
        # bodies of messages still arriving, all connections (see flow/content_budget.py)
        self.content_budget = ContentBudget(
            max(1, int(self.memory_monitor.limit * settings.partial_content_ratio)),
            settings.max_message_size,
        )
        self.disk_monitor = DiskMonitor(
            self.alarms, settings.data_dir, limit=settings.disk_free_limit
        )
        self.durable: Durable | None = None
        self.port = settings.port
        self.events = NodeEvents()  # what the broker's parts report to plugins
        self.plugins: list[Plugin] = []  # started in this order, stopped in the reverse
        # runtime parameter components plugins own ("shovel"), served by the management API
        self.parameter_components: dict[str, ParameterComponent] = {}
        # calls a peer node may make over the link (`cluster.ask_peers`), by op: plugins
        # answer with their part of a cluster-wide view (the management API's lists), the
        # server its connections and channels for the limits
        self.peer_handlers: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            limits.OP: partial(limits.answer, self),
        }
        self.cluster = make_cluster(self)  # this node alone, or a member of an etcd cluster

    # -- set-up -----------------------------------------------------------------------------
    def add_plugin(self, plugin: Plugin) -> None:
        """Before start: `plugin` starts once the node serves AMQP and stops first."""
        self.plugins.append(plugin)

    def add_vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = VHost(name, self)
            vhost.on_change = self.changed
            self.changed(None, "put_vhost", name)
        return vhost

    def remove_vhost(self, name: str) -> None:
        """Close its connections (320), delete its queues, drop it and its permissions."""
        vhost = self.vhosts[name]
        self.close_connections(vhost=name, reason=f"vhost '{name}' is deleted")
        for q in list(vhost.queues.values()):
            vhost.delete_queue(q)
        vhost.stop()
        del self.vhosts[name]
        self.users.vhost_deleted(name)
        self.changed(None, "delete_vhost", name)

    def changed(self, vhost: str | None, what: str, obj: object) -> None:
        """A definition changed (VHost, VHostParams and the management API report here):
        the definitions database keeps what survives a restart, the cluster tells the other
        nodes (a single node's cluster does nothing)."""
        if self.durable is not None:
            self.durable.changed(vhost, what, obj)
        self.cluster.changed(vhost, what, obj)
        self.events.definition_changed.notify((vhost, what, obj))

    async def start(self, abort: Callable[[], bool] | None = None) -> None:
        """Bind every listener (TLS files read first), recover, listen on all, then serve
        them all: a port that is taken or a certificate that cannot be read stops start-up
        before any connection is accepted (ListenerError, TlsError). `abort()` true (SIGTERM
        while starting) stops it at the next step between the phases, none of which is cut
        short (a recovery half done must not be stopped as if whole): what it did is undone
        - stores closed, membership left - and StartAborted raised."""
        def checkpoint() -> None:
            if abort is not None and abort():
                raise StartAborted("stop requested while starting")

        listeners = self._bind_listeners()
        joined = recovered = False
        started: list[Plugin] = []
        try:
            checkpoint()
            await self.cluster.start()  # a name already taken stops start-up here
            joined = True
            checkpoint()
            self.durable = Durable(self)
            await self.durable.start()
            recovered = True
            for plugin in self.plugins:  # their own definitions (shovels), before the cluster's
                plugin.restore(self)
            checkpoint()
            await self.cluster.sync()  # the cluster's definitions over what the disk kept
            checkpoint()
            self.memory_monitor.start()
            self.disk_monitor.start()
            listen_all(listeners)
            if self._siblings is not None and len(self._siblings.names) > 1:
                handover = Handover(self, self._siblings)
                try:
                    await handover.start()
                    self.handover = handover
                except OSError as exc:  # its name taken: the connections stay where accepted
                    log.warning("connection placement off", error=str(exc))
            for listener in listeners:
                if listener.protocol in ("amqp", "amqp/ssl"):
                    await serve_amqp(self, listener)
            for plugin in self.plugins:  # each serves its own listeners (management: HTTP(S))
                await plugin.start(self, [x for x in listeners if x.protocol in plugin.listens])
                started.append(plugin)
        except BaseException:
            for plugin in reversed(started):
                await plugin.stop()
            await self._stop_handover()
            close_all(listeners)
            self.listeners = []
            if recovered:  # the stores flushed as at a stop: the next start is a clean one
                for vhost in self.vhosts.values():
                    vhost.stop()
                assert self.durable is not None
                await self.durable.stop()
            if joined:
                await self.cluster.stop()
            raise
        self.listeners = listeners
        log.info("broker started", node=self.name,
                 listeners={x.protocol: x.port for x in listeners}, host=self.settings.host or "*")

    def _bind_listeners(self) -> list[Listener]:
        listeners = bind_listeners(self.settings, self.inherited)
        self.port = listeners[0].port
        self.listeners = listeners  # bound, not yet listening: the cluster card shows them
        return listeners

    def management_port(self) -> int | None:
        for x in self.listeners:
            if x.protocol == "http":
                return x.port
        return None

    async def stop(self, reason: str = "broker shutdown") -> None:
        """Stop accepting, close clients with 320, stop queues; the stores flush last."""
        for plugin in reversed(self.plugins):  # the HTTP API stops first
            await plugin.stop()
        servers = stop_accepting(self.listeners)
        await self._stop_handover()
        await self.memory_monitor.stop()
        await self.disk_monitor.stop()
        for conn in list(self.connections):
            conn.force_close(reason)
        if self.connections:
            await asyncio.sleep(0.2)  # let close frames go out; close-ok is not awaited long
        for conn in list(self.connections):
            conn._close_transport()
        for server in servers:
            await server.wait_closed()
        for vhost in self.vhosts.values():
            vhost.stop()
        if self.durable is not None:
            await self.durable.stop()
        await self.auth.close()
        await self.cluster.stop()
        log.info("broker stopped", node=self.name)

    async def _stop_handover(self) -> None:
        if self.handover is not None:
            await self.handover.stop()
            self.handover = None

    # -- connections ------------------------------------------------------------------------
    def connection_opened(self, conn: Reader) -> None:
        self.connections.add(conn)

    def connection_closed(self, conn: Reader) -> None:
        self.connections.discard(conn)

    def close_connections(self, *, user: str | None = None, vhost: str | None = None,
                          reason: str) -> int:
        """Revocation: 320 CONNECTION_FORCED to every open connection of the user or in the
        vhost (a deleted user or vhost), as RabbitMQ. Returns how many were closed."""
        closed = 0
        for conn in list(self.connections):
            if conn.vhost is None:
                continue  # still in the handshake: its connection.open is checked anew
            if (user is None or conn.user == user) and (vhost is None
                                                        or conn.vhost.name == vhost):
                conn.force_close(reason)
                closed += 1
        if closed:
            log.info("connections closed", user=user, vhost=vhost, reason=reason,
                     count=closed)
        return closed

    # -- alarms -----------------------------------------------------------------------------
    def alarms_active(self) -> frozenset[str]:
        """This node's own resource alarms (its card, its API)."""
        return self.alarms.active()

    def blocking_alarms(self) -> frozenset[str]:
        """What blocks this node's publishers: its alarms and the other nodes' (cluster)."""
        return self.alarms.active() | self.peer_alarms

    def set_peer_alarms(self, raised: frozenset[str]) -> None:
        if raised != self.peer_alarms:
            self.peer_alarms = raised
            self._alarm_changed("", bool(raised))

    def _alarm_changed(self, resource: str, raised: bool) -> None:
        active = self.blocking_alarms()
        for conn in list(self.connections):
            conn.on_alarm(active)

    def _memory_pressure(self, fraction: float) -> None:
        """The memory monitor's share of RAM messages to keep (1.0: all), turned into a RAM
        target per queue, shared by message rate (rabbit_memory_monitor's job)."""
        queues = [q for v in self.vhosts.values() for q in v.queues.values()
                  if isinstance(q, AMQQueue) and q.bq is not None]
        loads = {q: QueueLoad(q.bq.ram_msg_count, q.rate()) for q in queues}
        for q, target in ram_targets(loads, fraction).items():
            q.set_ram_target(target)



def bind_listeners(s: Settings, inherited: dict[str, list[int]] | None = None
                   ) -> list[Listener]:
    """Every listener the settings ask for (TLS files read first), bound, not listening: AMQP,
    management HTTP, AMQPS, management HTTPS. A protocol in `inherited` takes the sockets a
    supervisor bound for this worker instead (their file descriptors)."""
    amqps = tls_context(s, "ssl")
    https = tls_context(s, "management_ssl")
    wanted = [("amqp", s.host, s.port, None)]
    if s.management_port:
        wanted.append(("http", s.management_host, s.management_port, None))
    if amqps is not None:
        wanted.append(("amqp/ssl", s.host, s.ssl_port, amqps))
    if https is not None:
        wanted.append(("https", s.management_host, s.management_ssl_port, https))
    listeners: list[Listener] = []
    try:
        for protocol, host, port, tls in wanted:
            fds = (inherited or {}).get(protocol)
            listeners.append(adopt(protocol, host, fds, tls) if fds
                             else bind(protocol, host, port, tls))
    except BaseException:
        close_all(listeners)
        raise
    return listeners


def _backends(settings: Settings, users: UserDB) -> list[Backend]:
    """The auth backends, in the order `auth_backends` names them."""
    made: list[Backend] = []
    for name in settings.auth_backends:
        if name == "internal":
            made.append(InternalBackend(users))
        else:
            # imported only when configured: aiohttp's client costs start-up time
            from broker.access.http_backend import HttpBackend

            made.append(HttpBackend(
                user_path=settings.auth_http_user_path,
                vhost_path=settings.auth_http_vhost_path,
                resource_path=settings.auth_http_resource_path,
                topic_path=settings.auth_http_topic_path,
                method=str(settings.auth_http_method),
                timeout_s=settings.auth_http_timeout_s,
                cache_ttl_s=settings.auth_http_cache_ttl_s,
            ))
    return made
