"""The reader (RabbitMQ's rabbit_reader): one asyncio Protocol per client connection.

It cuts frames from the socket in bulk, assembles content per channel and posts commands to
channel tasks; channel-0 methods of the handshake go to its Handshake (broker/server/handshake.py,
whose rules are broker/protocol/handshake.py's). It is also where back-pressure ends: it pauses
reading its socket when credit towards a channel runs out, when an alarm blocks publishers (even
in the middle of a message, as RabbitMQ's reader), and when the bodies of its incomplete messages
are over their share of the node's content budget (broker/flow/content_budget.py)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import ssl
import struct
from typing import TYPE_CHECKING, Any

import structlog
from pamqp import commands
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from broker.access import Principal
from broker.flow.alarm import blocked_reason
from broker.flow.credit_flow import CreditFlow
from broker.protocol import frames
from broker.protocol.command_assembler import EXPECT_METHOD as ASSEMBLER_IDLE
from broker.protocol.command_assembler import CommandAssembler
from broker.protocol.connection_state import ConnectionAction, ConnectionState, connection_step
from broker.protocol.constants import (
    CHANNEL_ERROR,
    CONNECTION_FORCED,
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    NOT_ALLOWED,
    UNEXPECTED_FRAME,
)
from broker.protocol.errors import AMQPError, ChannelError, ConnectionError_
from broker.protocol.handshake import check_channel_count, client_capability, whole_publishes_fit
from broker.server import placement
from broker.server.channel import Channel
from broker.server.handshake import Handshake
from broker.server.heartbeat import Heartbeat
from broker.server.limits import NO_COUNTS, Counts, local_counts, peer_counts
from broker.server.writer import Writer

if TYPE_CHECKING:
    from broker.node import Node
    from broker.vhost import VHost

__all__ = ["Reader"]

log = structlog.get_logger("hare.connection")

_CHANNEL_OPEN = (0x00140000 | 10).to_bytes(4, "big")
_CHANNEL_CLOSE_OK = (0x00140000 | 41).to_bytes(4, "big")
_ACK = (0x003C0000 | 80).to_bytes(4, "big")
_PUBLISH = (0x003C0000 | 40).to_bytes(4, "big")
_CONTENT_HEAD = struct.Struct(">HHQ")  # class, weight, body size
FRAME_PUBLISH = frames.FRAME_PUBLISH

_ids = itertools.count(1)
# the process in every connection's name: the workers of a multi-worker server share one
# management API, whose /api/connections/{name} must not find another worker's namesake
_NAME_PREFIX = f"conn-{os.getpid()}-"

# Bytes a connection may read in bulk reads (a read of BULK_READ or more: the socket had more
# waiting) before it waits for the next loop iteration: libuv reads a ready socket up to 32 times
# per iteration, so a client streaming at line rate (even frames the broker only drops) would
# otherwise make every other connection wait behind it. A read smaller than BULK_READ ends the
# burst: counting costs one comparison per read.
READ_BURST = 1 << 20
BULK_READ = 1 << 16
# A read that brought at most this many publishes for an idle channel is handled at once
# (Channel.publish_now): the publisher is not outrunning us, and each loop iteration saved is
# latency. A bigger one goes through the channel task as before, so the reader -> channel
# credit (400, more after 200) still paces a publisher that sends faster than we route.
INLINE_PUBLISHES = 64
# Publishes that routed nowhere (yet) a connection's placement looks at before it stops
# looking: each costs a second routing, so a publisher to an unbound exchange pays it a while
PLACE_TRIES = 64

AWAIT_HEADER = ConnectionState.AWAIT_HEADER
OPENED = ConnectionState.OPENED
CLOSING = ConnectionState.CLOSING
CLOSED = ConnectionState.CLOSED

# After the close handshake, how long a client that keeps its socket open is waited for.
CLOSE_LINGER_S = 1.0
# How long connection.close / close-ok wait for the channel tasks to end, at most.
CHANNELS_END_S = 5.0


class Reader(asyncio.Protocol):
    def __init__(self, node: Node) -> None:
        self.node = node
        self.settings = node.settings
        self.content_budget = node.content_budget
        self.content_held = 0  # body bytes of incomplete messages, all channels
        self.max_message_size = node.settings.max_message_size
        self.loop = asyncio.get_running_loop()
        self.name = f"{_NAME_PREFIX}{next(_ids)}"
        self.state: ConnectionState = AWAIT_HEADER
        self.handshake = Handshake(self)  # channel 0 until connection.open-ok
        self._stream_lost = False  # a framing error: what follows cannot be parsed
        self.transport: asyncio.Transport | None = None
        self.writer: Writer = None  # type: ignore[assignment]  # set in connection_made
        self.peer = ("?", 0)
        self.tls: ssl.SSLObject | None = None  # an AMQPS connection's TLS session
        self.user = ""
        self.principal: Principal | None = None  # who logged in, and who answers for them
        self.vhost: VHost = None  # type: ignore[assignment]
        # an auth backend is being asked over the network: reading is paused and frames
        # already cut wait in _held_for_auth until the answer is in
        self._waiting: asyncio.Task[Any] | None = None
        self._held_for_auth: list[tuple[int, int, Any]] = []
        # counted by the limits while the other nodes are asked (broker/server/limits.py):
        # the vhost of a connection.open being checked, channel.opens being checked
        self.opening: str | None = None
        self.channels_opening = 0
        self.client_properties: dict[str, Any] = {}
        self.channel_max = node.settings.channel_max
        self.frame_max = node.settings.frame_max
        self.heartbeat = node.settings.heartbeat_s
        self.cutter = frames.FrameCutter(FRAME_MIN_SIZE, publishes=True)
        # False once tune-ok allows a body frame over max_message_size: then every publish
        # goes through the assembler, which refuses it
        self.whole_publishes = True
        self.channels: dict[int, Channel] = {}
        self.assemblers: dict[int, CommandAssembler] = {}
        self._live: set[Channel] = set()  # channels whose task has not ended, numbered or not
        # while closing: channel-0 frames held until every channel task has ended, and what
        # to do then (see _stop_channels)
        self._held: list[bytes] | None = None
        self._linger_s = 0.0
        self._half_close = False
        # channels given commands in this chunk, and the publishes among them: credit is spent
        # and each channel woken once per chunk
        self._touched: dict[Channel, int] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._recv_activity = True
        self._paused_reading = False
        self.blocked_by_credit = False
        self.flow_pauses = 0  # times credit flow paused this socket (the "flow" state)
        self._blocked_timer: asyncio.TimerHandle | None = None
        self.alarm_blocked = False  # an alarm is raised: stop reading after the next publish
        self._blocked_sent = False  # connection.blocked told (to a publisher, once an alarm)
        self.budget_pauses = 0  # times the content budget paused this socket
        self.unroutable_nack = node.settings.unroutable == "nack"
        self.credit_flow = CreditFlow(
            self,
            node.settings.credit_flow_initial_credit,
            node.settings.credit_flow_more_credit_after,
        )
        self.credit_flow.on_unblocked = self._maybe_resume
        self.opened_at = 0.0
        self.bytes_in = 0
        # connection placement (broker/server/placement.py): True while this connection's
        # first publish or consume may still hand it to the worker of its queues
        self.placing = False
        self._place_tries = PLACE_TRIES
        # handed over to us (state, bytes to replay): restored when the transport is made
        self._adopted: tuple[dict[str, Any], bytes] | None = None
        self._burst = 0  # bytes read in bulk reads in a row (READ_BURST)

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.writer = Writer(transport, self.loop)
        self.writer.on_resume = self._on_writer_resume
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = (peer[0], peer[1])
        self.tls = transport.get_extra_info("ssl_object")
        self.node.connection_opened(self)
        if self._adopted is not None:
            self._resume_adopted(*self._adopted)
            return
        self._timer = self.loop.call_later(
            self.settings.handshake_timeout_s, self.handshake.timeout
        )

    def data_received(self, data: bytes) -> None:
        self._recv_activity = True
        size = len(data)
        self.bytes_in += size
        self._burst = self._burst + size if size >= BULK_READ else 0
        state = self.state
        if state >= CLOSING:
            self._discard(data)
            return
        if state == AWAIT_HEADER:
            data = self.handshake.header(data)
            if not data:
                return
        try:
            batch = self.cutter.feed(data)
        except ConnectionError_ as exc:
            self._fatal_frame_error(exc)
            return
        if self._waiting is not None:
            self._held_for_auth.extend(batch)
            return
        self._frames(batch)

    def _frames(self, batch: list[tuple[int, int, Any]]) -> None:
        touched = self._touched
        channels = self.channels
        assemblers = self.assemblers
        i = 0
        try:
            n = len(batch)
            while i < n:
                ftype, channel, payload = batch[i]
                if channel == 0:
                    self._connection_frame(ftype, payload)
                    if self._waiting is not None:  # the rest waits for the auth backend
                        self._held_for_auth = batch[i + 1:]
                        return
                elif self.placing and self._place(batch, i):
                    return  # this frame and the rest wait: handed over with the socket
                elif ftype == FRAME_PUBLISH:
                    # the fast path, inline as it runs for every publish: a publish the cutter
                    # found whole, on an idle open channel, goes to the channel as it is,
                    # without three trips through the assembler
                    ch = channels.get(channel)
                    if (
                        ch is not None
                        and self.state == OPENED
                        and self.whole_publishes
                        and assemblers[channel].state == ASSEMBLER_IDLE
                    ):
                        if self.alarm_blocked:
                            ch.published_since_alarm = True
                        # this publish and the whole ones right behind it on this channel,
                        # in one compiled call; credit is spent at the chunk's end
                        end = ch.put_publishes(batch, i)
                        touched[ch] = touched.get(ch, 0) + end - i
                        i = end  # put_quiet changes no state: nothing to check below
                        continue
                    else:
                        self._split_publish(channel, payload)
                else:
                    self._channel_frame(ftype, channel, payload)
                    if self._waiting is not None:  # a channel.open checks a limit first
                        self._held_for_auth = batch[i + 1:]
                        return
                i += 1
                if self.state >= CLOSING:
                    self._closing_frames(batch, i)
                    return
        except ConnectionError_ as exc:
            self.connection_error(exc)
            # the rest of this read is judged as if it came later: a crossing close gets
            # its close-ok however TCP cut the bytes
            self._closing_frames(batch, i + 1)
            return
        finally:
            if touched:  # one wake-up per channel for everything this chunk carried
                send_many = self.credit_flow.send_many
                idle: list[Channel] = []
                for ch, publishes in touched.items():
                    send_many(ch, publishes)
                    mailbox = ch.mailbox
                    if (publishes <= INLINE_PUBLISHES and mailbox.idle
                            and len(mailbox) == publishes):  # nothing else came
                        idle.append(ch)
                    else:
                        mailbox.notify()
                touched.clear()
                if idle:
                    if self.alarm_blocked:  # connection.blocked before their deliveries, as
                        self._throttle()  # RabbitMQ's reader sends it before its channels act
                    for ch in idle:
                        ch.publish_now()
        self._throttle()

    def pause_writing(self) -> None:
        self.writer.pause()

    def resume_writing(self) -> None:
        self.writer.resume()

    def connection_lost(self, exc: Exception | None) -> None:
        prev = self.state
        self.state = CLOSED
        if self.writer is not None:
            self.writer.abandon()  # channels waiting for it to drain go on to their end
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiting is not None:
            self._waiting.cancel()
            self._waiting = None
        for ch in self.channels.values():
            ch.stop()
        self.channels.clear()
        self.assemblers.clear()
        self.content_budget.forget(self)
        if self.vhost is not None:
            self.vhost.drop_exclusive(self)
        self.node.connection_closed(self)
        if prev == OPENED:
            log.info(
                "connection closed abruptly", conn=self.name, peer=self._peer(), user=self.user
            )

    # -- channel 0 --------------------------------------------------------------------------
    def _connection_frame(self, ftype: int, payload: bytes) -> None:
        if ftype == FRAME_HEARTBEAT:
            if payload:
                raise ConnectionError_(FRAME_ERROR, "heartbeat frame with a payload")
            return
        if ftype != FRAME_METHOD:
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"unexpected frame type {ftype} on channel 0"
            )
        method = frames.decode_method(payload)
        state = self.state
        action, after = connection_step(state, method)
        if action is ConnectionAction.START_OK:
            self.handshake.start_ok(method)
        elif action is ConnectionAction.TUNE_OK:
            self.handshake.tune_ok(method)
        elif action is ConnectionAction.OPEN:
            self.handshake.open(method)
        elif action is ConnectionAction.CLOSE:
            self._client_close(method)
        elif action is ConnectionAction.UPDATE_SECRET:
            self._send0(commands.Connection.UpdateSecretOk())
        # an action that failed has moved it to CLOSING already; one waiting for an auth
        # backend moves it itself when the answer is in
        if self.state == state and self._waiting is None:
            self.state = after

    def _closing_frames(self, batch: list[tuple[int, int, Any]], start: int) -> None:
        """Frames read after the close handshake began: a close gets close-ok, a close-ok
        ends the connection, everything else is discarded (RabbitMQ's closing and closed
        states). Nothing here raises: there is no one left to tell."""
        for ftype, channel, payload in itertools.islice(batch, start, None):
            if channel or ftype != FRAME_METHOD:
                continue
            try:
                method = frames.decode_method(payload)
            except ConnectionError_:
                continue
            action, self.state = connection_step(self.state, method)
            if action is ConnectionAction.ANSWER_CLOSE:
                self._send0(commands.Connection.CloseOk())
            elif action is ConnectionAction.FINISH:
                self._close_transport()
                return

    def _discard(self, data: bytes) -> None:
        """Bytes that arrive while closing: cut into frames for `_closing_frames` as long as
        the stream is in step, otherwise dropped."""
        if self._stream_lost or self.transport is None or self.transport.is_closing():
            return
        try:
            batch = self.cutter.feed(data)
        except ConnectionError_:
            self._stream_lost = True
            return
        self._closing_frames(batch, 0)

    # -- channels ---------------------------------------------------------------------------
    def _channel_frame(self, ftype: int, number: int, payload: bytes) -> None:
        if self.state != OPENED:
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"frame on channel {number} before connection.open"
            )
        if ftype == FRAME_HEARTBEAT:
            raise ConnectionError_(
                FRAME_ERROR if payload else UNEXPECTED_FRAME,
                f"heartbeat frame on channel {number}",
            )
        ch = self.channels.get(number)
        if ch is None:
            self._unopened_channel_frame(ftype, number, payload)
            return
        asm = self.assemblers[number]
        if ftype == FRAME_METHOD:
            cmd = asm.frame(ftype, payload)
        else:
            # content: under an alarm, part of a message stops the reading too (as RabbitMQ's
            # reader); kept body bytes count toward the node's content budget
            if self.alarm_blocked:
                ch.published_since_alarm = True
            held = asm.held
            cmd = asm.frame(ftype, payload)
            if asm.held != held:
                self.content_budget.add(self, asm.held - held)
        if cmd is None:
            return
        if cmd[0] == "content":
            self._post_publish(ch, cmd)
            return
        if payload[:4] == _ACK and ch.ack_now(cmd):
            return
        ch.mailbox.put_quiet(cmd)
        self._touched.setdefault(ch, 0)
        if payload[:4] == _CHANNEL_CLOSE_OK:
            # RabbitMQ's post_process_frame: after the client's close-ok the number is free,
            # whatever the channel makes of it (a close-ok on an open channel is its error).
            # A client channel.close is different: the channel frees the number when it takes
            # it, since only the channel knows whether it is closing already.
            self.channel_closed(ch)

    def _unopened_channel_frame(self, ftype: int, number: int, payload: bytes) -> None:
        if ftype != FRAME_METHOD:  # what a new channel's assembler says (RabbitMQ)
            raise ConnectionError_(
                UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        if payload[:4] == _CHANNEL_OPEN:
            self._open_channel(number)
            return
        ids = (0, 0)
        if len(payload) >= 4:
            ids = (int.from_bytes(payload[:2], "big"), int.from_bytes(payload[2:4], "big"))
        raise ConnectionError_(CHANNEL_ERROR, f"expected 'channel.open' on channel {number}", ids)

    def _post_publish(self, ch: Channel, cmd: tuple[Any, ...]) -> None:
        """A whole publish for a channel: one credit spent and the channel woken, both at the
        end of the chunk."""
        if self.alarm_blocked:
            ch.published_since_alarm = True
        ch.mailbox.put_quiet(cmd)
        touched = self._touched
        touched[ch] = touched.get(ch, 0) + 1

    def _split_publish(self, number: int, cmd: tuple[str, bytes, bytes, bytes]) -> None:
        """A whole publish the fast path (in _frames) declined goes frame by frame, to be judged (or
        refused) as any other frames are."""
        _, method, props, body = cmd
        self._channel_frame(FRAME_METHOD, number, method)
        if self.state >= CLOSING:
            return
        header = _CONTENT_HEAD.pack(60, 0, len(body)) + props
        self._channel_frame(FRAME_HEADER, number, header)
        if self.state >= CLOSING:
            return
        self._channel_frame(FRAME_BODY, number, body)

    # -- placement: handed to the worker of its queues (broker/server/handover.py) ----------
    def _place(self, batch: list[tuple[int, int, Any]], i: int) -> bool:
        """Before the frame at batch[i] is handled: is it this connection's first publish or
        consume, for queues of one other worker? Then reading pauses, the frame and the rest
        are held, and the connection is handed over once quiet (True); if that cannot be, they
        are handled here after all. A connection is placed once, by its first such frame."""
        ftype, number, payload = batch[i]
        ch = self.channels.get(number)
        handover = self.node.handover
        if ch is None or handover is None or self.state != OPENED:
            return False
        verdict, home = placement.target(ftype, payload, self.vhost, ch.last_queue,
                                         self.node.name, handover.siblings.names)
        if verdict is placement.Verdict.UNDECIDED:
            if ftype == FRAME_PUBLISH or payload[:4] == _PUBLISH:
                # routed nowhere yet: asked again, a few times only
                self._place_tries -= 1
                self.placing = self._place_tries > 0
            return False
        self.placing = False
        if verdict is placement.Verdict.STAY:
            return False
        self._held_for_auth = batch[i:]
        self.handshake.pause_for(handover.move(self, home), self._placed)
        return True

    def _placed(self, moved: bool) -> None:
        if moved:  # handed over: nothing read here is ours to handle
            self._held_for_auth = []

    def unhandled(self) -> bytes:
        """The bytes read and not yet handled, as the client sent them (in frames): what
        the held frames were cut from, then the cutter's incomplete tail."""
        return frames.encode_frames(self._held_for_auth, self.frame_max) + self.cutter.buf

    def handover_state(self) -> dict[str, Any]:
        """What the worker this connection is handed to needs to serve it as if it had been
        there from the start (JSON)."""
        assert self.principal is not None
        return {
            "name": self.name, "user": self.user, "tags": list(self.principal.tags),
            "backend": self.principal.backend.name, "vhost": self.vhost.name,
            "client_properties": base64.b64encode(
                pamqp_encode.field_table(self.client_properties)).decode(),
            "frame_max": self.frame_max, "channel_max": self.channel_max,
            "heartbeat": self.heartbeat, "opened_at": self.opened_at,
            "bytes_in": self.bytes_in, "bytes_out": self.writer.bytes_out,
            "flow_pauses": self.flow_pauses,
            "channels": [ch.handover_state() for ch in self.channels.values()],
        }

    def moved_in(self, state: dict[str, Any], held: bytes) -> None:
        """A connection handed over to this worker: its open state, before the transport is
        made (connection_made then opens its channels and replays `held`, what it had read
        and not handled). Raises KeyError for a vhost, StopIteration for an auth backend
        this worker does not have."""
        node = self.node
        backend = next(b for b in node.auth.backends if b.name == state["backend"])
        self.vhost = node.vhosts[state["vhost"]]
        self.name = state["name"]
        self.user = state["user"]
        self.principal = Principal(self.user, tuple(state["tags"]), backend)
        self.client_properties = pamqp_decode.field_table(
            base64.b64decode(state["client_properties"]))[1]
        self.frame_max = self.cutter.frame_max = int(state["frame_max"])
        self.whole_publishes = whole_publishes_fit(self.max_message_size, self.frame_max)
        self.channel_max = int(state["channel_max"])
        self.heartbeat = int(state["heartbeat"])
        self.opened_at = float(state["opened_at"])
        self.flow_pauses = int(state["flow_pauses"])
        self.state = OPENED
        self._adopted = (state, held)

    def _resume_adopted(self, state: dict[str, Any], held: bytes) -> None:
        self._adopted = None
        for c in state["channels"]:
            self._add_channel(int(c["number"])).restore(c)
        self.writer.bytes_out = int(state["bytes_out"])
        if self.heartbeat:
            Heartbeat(self).start()
        if self.node.blocking_alarms():
            self.on_alarm(self.node.blocking_alarms())
        if held:
            self.data_received(held)
        self.bytes_in = int(state["bytes_in"])

    def handed_over(self) -> None:
        """The other worker has the socket now: this side ends without a word to the client
        (no close frame, no shutdown: the TCP connection lives on over there)."""
        self.state = CLOSED
        self._held_for_auth = []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.node.connection_closed(self)  # counted once: over there from now on
        for ch in self.channels.values():
            ch.stop()
        self.channels.clear()
        self.assemblers.clear()
        if self.transport is not None:
            self.transport.close()  # our descriptor only; nothing is buffered (movable)

    def _open_channel(self, number: int, peers: Counts | None = None) -> None:
        check_channel_count(len(self.channels), self.channel_max)
        limit = self.node.users.limit(self.user, "max-channels")
        if limit >= 0:
            if peers is None and self.node.cluster.clustered:
                self._ask_channel_counts(number)
                return
            counts = local_counts(self.node, self.user, self.vhost.name) + (peers or NO_COUNTS)
            if counts.user_channels >= limit:
                raise ConnectionError_(
                    NOT_ALLOWED,
                    f"number of channels opened for user '{self.user}' has reached the "
                    f"maximum allowed user limit of ({limit})",
                    (20, 10),
                )
        self._add_channel(number)
        self.writer.send(frames.encode_method(number, commands.Channel.OpenOk()))

    def _add_channel(self, number: int) -> Channel:
        ch = Channel(number, self)
        self.channels[number] = ch
        self._live.add(ch)
        self.assemblers[number] = CommandAssembler(self.max_message_size)
        ch.start()
        return ch

    def _ask_channel_counts(self, number: int) -> None:
        """The user's channels on the other nodes count too: asked with reading paused, the
        channel counted here meanwhile (broker/server/limits.py), then opened or refused."""
        self.channels_opening += 1

        def then(counts: Counts) -> None:
            self.channels_opening -= 1
            if self.state == OPENED:  # not closed meanwhile (forced, an error)
                self._open_channel(number, counts)

        self.handshake.pause_for(peer_counts(self.node, self.user, self.vhost.name), then)

    def channel_closed(self, ch: Channel) -> None:
        """The client's channel.close or close-ok: the number is free for a new channel."""
        if self.channels.get(ch.number) is ch:
            del self.channels[ch.number]
            self._drop_assembler(ch.number)
        ch.stop()

    def _drop_assembler(self, number: int) -> None:
        asm = self.assemblers.pop(number, None)
        if asm is not None and asm.held:
            self.content_budget.add(self, -asm.held)

    def channel_terminated(self, ch: Channel) -> None:
        """A channel is gone for good: it can no longer hold our credit."""
        self.credit_flow.peer_down(ch)
        self._live.discard(ch)
        if not self._live and self._held is not None:
            self._release_held()

    # -- back-pressure ----------------------------------------------------------------------
    def _throttle(self) -> None:
        """Pause the socket when a channel has used its credit, an alarm blocks us, our
        incomplete messages are over their share of the content budget, or we have read a
        burst's worth in this loop iteration."""
        if self._paused_reading or self.transport is None:
            return
        blocked = (
            self.state == OPENED
            and (self.alarm_blocked or self.content_held or self.credit_flow.blocked())
            and self._blocked()
        )
        if blocked or self._burst > READ_BURST:
            self._paused_reading = True
            self.transport.pause_reading()
            if self._burst > READ_BURST:
                self.loop.call_soon(self._end_burst)

    def _blocked(self) -> bool:
        """Must the socket wait (for credit, the end of an alarm, content budget)?"""
        blocked = self.held_by_alarm
        if blocked and not self._blocked_sent:
            # RabbitMQ's publish_received: only a connection that publishes under the alarm
            # is blocked and told so; a consumer's connection never is
            self._blocked_sent = True
            if self.client_capability("connection.blocked"):
                self._send0(
                    commands.Connection.Blocked(reason=blocked_reason(self.node.blocking_alarms()))
                )
        if blocked and self._blocked_timer is None and self.settings.blocked_timeout_s > 0:
            self._blocked_timer = self.loop.call_later(
                self.settings.blocked_timeout_s, self._blocked_too_long
            )
        if self.credit_flow.blocked():
            if not self.blocked_by_credit:
                self.blocked_by_credit = True
                self.flow_pauses += 1
            blocked = True
        if self.content_held and self.content_budget.over(self):
            if self.content_budget.wait(self):
                self.budget_pauses += 1
            blocked = True
        return blocked

    def _end_burst(self) -> None:
        """The next loop iteration: the connection may read its share again."""
        self._burst = 0
        self._maybe_resume()

    def _blocked_too_long(self) -> None:
        self._blocked_timer = None
        if self.alarm_blocked:
            self.connection_error(
                ConnectionError_(
                    CONNECTION_FORCED,
                    f"connection blocked ({blocked_reason(self.node.blocking_alarms())}) "
                    f"for longer than blocked_timeout_s={self.settings.blocked_timeout_s}",
                )
            )

    def _maybe_resume(self) -> None:
        if not self._paused_reading or self.transport is None or self.state >= CLOSING:
            return
        if self._burst > READ_BURST:
            return  # _end_burst comes next
        if self.state == OPENED and self._blocked():
            return
        self._paused_reading = False
        self.blocked_by_credit = False
        self.transport.resume_reading()

    def content_budget_freed(self) -> None:
        self._maybe_resume()

    @property
    def held_by_alarm(self) -> bool:
        """An alarm blocks it (or will at its next read): it published while one is raised.
        A connection that only consumes is never held (RabbitMQ's publish_received)."""
        return self.alarm_blocked and self._published_since_alarm

    @property
    def _published_since_alarm(self) -> bool:
        return any(ch.published_since_alarm for ch in self.channels.values())

    def on_alarm(self, resources: frozenset[str]) -> None:
        """The node's alarm set changed. A connection is blocked, and told so, at its first
        publish under the alarm (`_blocked`); told connection.unblocked here if it was."""
        if self.state != OPENED:
            return
        blocked = bool(resources)
        if blocked == self.alarm_blocked:
            return
        self.alarm_blocked = blocked
        if not blocked and self._blocked_timer is not None:
            self._blocked_timer.cancel()
            self._blocked_timer = None
        for ch in self.channels.values():
            ch.published_since_alarm = False
        if not blocked:
            if self._blocked_sent and self.client_capability("connection.blocked"):
                self._send0(commands.Connection.Unblocked())
            self._blocked_sent = False
            self._maybe_resume()

    def _on_writer_resume(self) -> None:
        for ch in self.channels.values():
            ch.wake_queues()

    # -- closing ----------------------------------------------------------------------------
    def _client_close(self, m: commands.Connection.Close) -> None:
        log.info(
            "connection closed",
            conn=self.name,
            peer=self._peer(),
            user=self.user,
            code=m.reply_code,
            text=m.reply_text,
        )
        # The client closes the socket once it has close-ok; closing ours first would reset a
        # connection that another of its threads may still be writing to (and with unread
        # bytes in our buffer the kernel answers with a reset). Read and discard until then.
        self._stop_channels(commands.Connection.CloseOk(), CLOSE_LINGER_S)

    def connection_error(self, exc: AMQPError) -> None:
        """A hard error (or a forced close): connection.close, then wait for close-ok."""
        if self.state >= CLOSING:
            return
        if isinstance(exc, ChannelError):
            exc = ConnectionError_(exc.code, exc.text, exc.method)
        log.warning(
            "connection error",
            conn=self.name,
            peer=self._peer(),
            user=self.user,
            code=exc.code,
            text=exc.text,
        )
        was_open = self.state == OPENED
        self.state = CLOSING
        close = commands.Connection.Close(
            reply_code=exc.code,
            reply_text=exc.reply_text[:255],
            class_id=exc.method[0],
            method_id=exc.method[1],
        )
        # a client that never answers close-ok is dropped (RabbitMQ waits a few seconds)
        self._stop_channels(close, CLOSE_LINGER_S if was_open else 0.1)

    def _fatal_frame_error(self, exc: ConnectionError_) -> None:
        """The byte stream is out of step: nothing after this can be parsed. connection.close
        goes out, then our half of the socket closes so the client sees the end at once; its
        bytes are read and dropped until it closes too (RabbitMQ's fatal_frame_error)."""
        self._half_close = True
        self._stream_lost = True
        self.connection_error(exc)

    def _stop_channels(self, method: Any, linger_s: float) -> None:
        """Stop every channel and send `method` (connection.close or close-ok) once each has
        finished what it had been sent: nothing of a channel's may follow it (RabbitMQ's
        terminate_channels). Channel-0 frames sent meanwhile (close-ok for a crossing close)
        are held until then too; then the socket lingers for at most `linger_s`."""
        for ch in self.channels.values():
            ch.stop()
        self.channels.clear()
        self.assemblers.clear()
        self.writer.abandon()  # a channel waiting for the writer to drain waits no more
        self._held = [frames.encode_method(0, method)]
        self._linger_s = linger_s
        if self._timer is not None:  # no heartbeat or handshake timer from here on
            self._timer.cancel()
        # channel tasks end within a loop iteration or two; this only bounds a bug's harm
        self._timer = self.loop.call_later(CHANNELS_END_S, self._close_transport)
        if not self._live:
            self._release_held()

    def _release_held(self) -> None:
        held, self._held = self._held or [], None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        self.writer.send_many(held)
        if self._half_close:
            self.writer.shutdown()
        else:
            self.writer.flush()
        self._timer = self.loop.call_later(self._linger_s, self._close_transport)
        if self._paused_reading:
            self._paused_reading = False
            self.transport.resume_reading()

    def force_close(self, text: str = "broker forced connection closure") -> None:
        self.connection_error(ConnectionError_(CONNECTION_FORCED, text))

    def _close_transport(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.writer.flush()
            self.transport.close()
        self.state = CLOSED

    def _send0(self, method: Any) -> None:
        data = frames.encode_method(0, method)
        if self._held is not None:
            self._held.append(data)
        else:
            self.writer.send(data)

    # -- helpers ----------------------------------------------------------------------------
    def client_capability(self, name: str) -> bool:
        return client_capability(self.client_properties, name)

    def _peer(self) -> str:
        return f"{self.peer[0]}:{self.peer[1]}"

    def _state_name(self) -> str:
        """RabbitMQ's: flow (credit), blocked (not read), blocking (an alarm is on and the
        connection has not published since: it will be blocked at its next publish)."""
        if self.blocked_by_credit:
            return "flow"
        if self._paused_reading:
            return "blocked"
        return "blocking" if self.alarm_blocked else "running"

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "peer_host": self.peer[0],
            "peer_port": self.peer[1],
            "user": self.user,
            "vhost": self.vhost.name if self.vhost else None,
            "channels": len(self.channels),
            "state": self._state_name(),
            "flow_pauses": self.flow_pauses,
            "content_held": self.content_held,
            "content_budget_pauses": self.budget_pauses,
            "frame_max": self.frame_max,
            "channel_max": self.channel_max,
            "heartbeat": self.heartbeat,
            "client_properties": _printable(self.client_properties),
            "recv_oct": self.bytes_in,
            "send_oct": self.writer.bytes_out if self.writer else 0,
        }


def _printable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _printable(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value

