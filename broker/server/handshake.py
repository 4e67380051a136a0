"""The connection handshake's steps for one Reader (RabbitMQ's rabbit_reader before
`running`): protocol header -> connection.start; start-ok (SASL login, perhaps an auth backend
asked over the network) -> tune; tune-ok -> the negotiated limits; open (vhost, the user's and
the vhost's connection limits counted over the whole broker by broker/server/limits.py,
permissions) -> open-ok and heartbeats; and the handshake timeout. What is allowed and the
errors' texts are broker/protocol/handshake.py's plain rules; this module sends, keeps the
reader's state and waits for auth backends and other nodes. The reader calls it for channel-0
methods only, never on the publish path."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import TYPE_CHECKING, Any

import structlog
from pamqp import commands

from broker import __version__
from broker.access import (
    LoginRefused,
    MechanismError,
    Pending,
    Principal,
    offered,
    parse_response,
)
from broker.protocol.connection_state import ConnectionState
from broker.protocol.constants import NOT_ALLOWED, PROTOCOL_HEADER
from broker.protocol.errors import ConnectionError_
from broker.protocol.handshake import (
    HeaderVerdict,
    Tune,
    client_name,
    connection_start,
    login_refused,
    negotiate_tune,
    protocol_header,
    unsupported_mechanism,
    whole_publishes_fit,
)
from broker.server.heartbeat import Heartbeat
from broker.server.limits import NO_COUNTS, Counts, local_counts, peer_counts

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from broker.server.reader import Reader

__all__ = ["Handshake"]

log = structlog.get_logger("hare.connection")

CLOSING = ConnectionState.CLOSING
OPENED = ConnectionState.OPENED


class Handshake:
    """One connection's handshake, from the first byte to connection.open-ok."""

    __slots__ = ("_asked_cluster", "_header_buf", "reader")

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self._header_buf = b""
        self._asked_cluster = False

    def header(self, data: bytes) -> bytes:
        """The first bytes read: the protocol header, then connection.start. Returns the
        bytes that follow the header (frames, if the client did not wait)."""
        r = self.reader
        verdict, rest = protocol_header(self._header_buf + data)
        if verdict is HeaderVerdict.INCOMPLETE:
            self._header_buf = rest
            return b""
        self._header_buf = b""
        if verdict is HeaderVerdict.REFUSED:
            log.warning("bad protocol header", peer=r._peer(), header=rest)
            assert r.transport is not None
            r.transport.write(PROTOCOL_HEADER)
            r.state = ConnectionState.CLOSED
            r.transport.close()
            return b""
        r.state = ConnectionState.AWAIT_START_OK
        r._send0(connection_start(
            __version__, r.node.server, offered(r.node.auth.mechanisms, r.tls is not None)))
        return rest

    def start_ok(self, m: commands.Connection.StartOk) -> None:
        r = self.reader
        r.client_properties = m.client_properties or {}
        auth = r.node.auth
        if m.mechanism not in offered(auth.mechanisms, r.tls is not None):
            raise unsupported_mechanism(m.mechanism)
        try:
            credentials = parse_response(m.mechanism, m.response, tls=r.tls,
                                         cert_login_from=auth.cert_login_from)
        except MechanismError as exc:
            refused = auth.refused_before_login("", str(exc), m.mechanism, r._peer())
            raise _login_refused(m.mechanism, refused) from None
        try:
            result = auth.login(credentials, mechanism=m.mechanism, peer=r._peer(),
                                loopback=self._is_loopback())
        except LoginRefused as exc:
            answer = _login_refused(m.mechanism, exc)
            if self._again_when_caught_up(lambda: self.start_ok(m), answer):
                return
            raise answer from None
        if isinstance(result, Principal):
            self._logged_in(result)
        else:
            self.pause_for(result, self._logged_in, m.mechanism)

    def _logged_in(self, principal: Principal) -> None:
        r = self.reader
        r.principal = principal
        r.user = principal.name
        r.state = ConnectionState.AWAIT_TUNE_OK
        r._send0(
            commands.Connection.Tune(
                channel_max=r.channel_max,
                frame_max=r.frame_max,
                heartbeat=r.heartbeat,
            )
        )

    def _again_when_caught_up(self, retry: Callable[[], None],
                              refused: ConnectionError_) -> bool:
        """A user, vhost or permission this node does not know may have been made through
        another worker or node a moment ago (a script's PUT, then its connection, landing on
        two workers): once per connection the node catches up with the cluster's store and,
        if that brought anything, `retry` runs; otherwise `refused` is the answer. False: not
        clustered or asked already, refuse now."""
        node = self.reader.node
        if not node.cluster.clustered or self._asked_cluster:
            return False
        self._asked_cluster = True

        def then(moved: bool) -> None:
            if not moved:
                raise refused
            retry()

        self.pause_for(node.cluster.caught_up(), then)
        return True

    def pause_for(self, awaitable: Awaitable[Any], then: Callable[[Any], None],
                  mechanism: str = "") -> None:
        """Ask over the network (an auth backend, the other nodes' counts for a limit)
        without blocking the loop: reading pauses until the answer is in (the backend's or
        the link's timeout bounds the wait), then `then` runs with it and the frames that
        were held back are processed."""
        r = self.reader

        async def ask() -> Any:
            return await awaitable

        assert r.transport is not None
        r.transport.pause_reading()
        task = r._waiting = r.loop.create_task(ask(), name=f"wait:{r.name}")

        def done(_: asyncio.Task[Any]) -> None:
            if r._waiting is not task:  # the connection went meanwhile
                return
            r._waiting = None
            try:
                then(task.result())
            except LoginRefused as exc:
                r.connection_error(_login_refused(mechanism, exc))
            except ConnectionError_ as exc:
                r.connection_error(exc)
            if r._waiting is not None:  # `then` waits for something more: so do the frames
                return
            held, r._held_for_auth = r._held_for_auth, []
            if r.state >= CLOSING:
                r._closing_frames(held, 0)  # a close that crossed ours still gets close-ok
                # and what follows is read (close-ok, or dropped): left unread, the socket's
                # close would reset the connection instead of ending it
                if r.transport is not None and not r.transport.is_closing():
                    r.transport.resume_reading()
                return
            if held:
                r._frames(held)
            if r._waiting is None and not r._paused_reading and r.transport:
                r.transport.resume_reading()

        task.add_done_callback(done)

    def tune_ok(self, m: commands.Connection.TuneOk) -> None:
        r = self.reader
        tune = negotiate_tune(
            Tune(r.channel_max, r.frame_max, r.heartbeat),
            Tune(m.channel_max, m.frame_max, m.heartbeat),
        )
        r.channel_max, r.frame_max, r.heartbeat = tune.channel_max, tune.frame_max, tune.heartbeat
        r.cutter.frame_max = r.frame_max
        if not whole_publishes_fit(r.max_message_size, r.frame_max):
            # every publish goes through the assembler, which refuses a body over the limit
            r.whole_publishes = False

    def open(self, m: commands.Connection.Open, peers: Counts | None = None) -> None:
        """connection.open: the vhost, the limits (counted over the whole broker: `peers` is
        the other nodes' part, asked first when a limit is set), the user's access."""
        try:
            self._open(m, peers)
        except BaseException:
            self.reader.opening = None
            raise

    def _open(self, m: commands.Connection.Open, peers: Counts | None) -> None:
        r = self.reader
        node = r.node
        vhost = node.vhosts.get(m.virtual_host)
        if vhost is None:
            refused = ConnectionError_(NOT_ALLOWED, f"vhost {m.virtual_host} not found",
                                       (10, 40))
            if self._again_when_caught_up(lambda: self._open(m, peers), refused):
                return
            raise refused
        limit = node.users.limit(r.user, "max-connections")
        if peers is None:
            if node.cluster.clustered and (
                    limit >= 0 or vhost.params.limits.get("max-connections", -1) >= 0):
                r.opening = vhost.name  # counted by the other nodes while they are asked
                self.pause_for(peer_counts(node, r.user, vhost.name),
                               lambda counts: self.open(m, counts))
                return
            peers = NO_COUNTS
        counts = local_counts(node, r.user, vhost.name, besides=r) + peers
        if limit >= 0 and counts.user_connections >= limit:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"connection refused for user '{r.user}': user connection limit ({limit}) "
                "is reached",
                (10, 40),
            )
        assert r.principal is not None
        try:
            allowed = node.auth.vhost_allowed(r.principal, m.virtual_host, r.peer[0])
        except Pending as pending:
            self.pause_for(pending.wait(), lambda _: self.open(m, peers))
            return
        if not allowed:
            refused = ConnectionError_(
                NOT_ALLOWED,
                f"access to vhost '{m.virtual_host}' refused for user '{r.user}'",
                (10, 40),
            )
            if self._again_when_caught_up(lambda: self._open(m, peers), refused):
                return
            raise refused
        vhost.params.check_new_connection(r.user, counts.vhost_connections)
        r.opening = None
        r.vhost = vhost
        r.state = OPENED
        r.placing = node.handover is not None and r.tls is None  # broker/server/placement.py
        r.opened_at = r.loop.time()
        r._send0(commands.Connection.OpenOk())
        if r._timer is not None:
            r._timer.cancel()
            r._timer = None
        if r.heartbeat:
            Heartbeat(r).start()
        if node.blocking_alarms():
            r.on_alarm(node.blocking_alarms())
        log.info("connection opened", conn=r.name, peer=r._peer(), user=r.user,
                 vhost=vhost.name, client=client_name(r.client_properties))

    def timeout(self) -> None:
        """The handshake timer: a connection not open by now is closed without a word."""
        r = self.reader
        r._timer = None
        if r.state < OPENED:
            log.warning("handshake timeout", peer=r._peer(), state=r.state)
            r._close_transport()

    def _is_loopback(self) -> bool:
        peer = self.reader.peer[0]
        try:
            return ipaddress.ip_address(peer.split("%")[0]).is_loopback
        except ValueError:
            return peer in ("", "localhost")  # a unix socket has no IP


def _login_refused(mechanism: str, exc: LoginRefused) -> ConnectionError_:
    return login_refused(mechanism, exc.username, loopback_only=exc.loopback_only)
