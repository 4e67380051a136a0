"""Connection placement's rules, as plain functions (no I/O): which worker a connection
belongs on, judged from the frame that is about to be handled, and whether the connection is
simple enough at this moment to be handed over to it (docs/ARCHITECTURE.md, "Where
connections live"). broker/server/handover.py moves it; the reader only asks.

A wrong verdict costs speed, never correctness: a connection that stays where it was accepted
reaches every queue over the link as before."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from broker.message import Message
from broker.protocol import frames
from broker.protocol.connection_state import ConnectionState
from broker.protocol.constants import FRAME_METHOD
from broker.server.direct_reply import REPLY_QUEUE

if TYPE_CHECKING:
    from collections.abc import Iterable

    from broker.server.reader import Reader
    from broker.vhost import VHost

__all__ = ["Verdict", "movable", "target"]

_PUBLISH = (0x003C0000 | 40).to_bytes(4, "big")
_CONSUME = (0x003C0000 | 20).to_bytes(4, "big")
# exchange types whose routing is a pure lookup (x-delayed-message keeps what it routes, a
# plugin's type may do anything): others decide nothing, the connection stays
_PURE = frozenset({"direct", "fanout", "topic", "headers"})


class Verdict(enum.Enum):
    UNDECIDED = "undecided"  # not a publish or consume, or one that reaches no queue yet
    STAY = "stay"  # this worker's queues, several workers', another server's: decided
    MOVE = "move"  # every queue it reaches lives on one other worker of this server


def target(ftype: int, payload: Any, vhost: VHost, last_queue: str, here: str,
           siblings: Iterable[str]) -> tuple[Verdict, str]:
    """The verdict on the frame the reader is about to handle, and the worker to move to.
    `payload` is the cutter's: a whole publish's ("content", method, props, body) for
    FRAME_PUBLISH, a method's bytes for FRAME_METHOD; `last_queue` is what an empty queue
    name means on its channel; `siblings` are the other workers' node names."""
    if ftype == frames.FRAME_PUBLISH:
        method, props, body = payload[1], payload[2], payload[3]
    elif ftype == FRAME_METHOD:
        method, props, body = payload, b"\x00\x00", b""  # the content has not come yet
    else:
        return Verdict.UNDECIDED, ""
    head = method[:4]
    if head == _PUBLISH:
        try:
            exchange, key, _, _, address = frames.decode_publish(method)
        except Exception:  # the channel reports it
            return Verdict.UNDECIDED, ""
        ex = vhost.exchanges.get(exchange)
        if ex is None:
            return Verdict.UNDECIDED, ""
        if ex is not vhost.default_exchange and ex.type not in _PURE:
            return Verdict.STAY, ""
        homes = {q.home for q in vhost.route(ex, Message(exchange, key, props, body, 0,
                                                         address))}
    elif head == _CONSUME:
        try:
            consume = frames.decode_method(method)
        except Exception:
            return Verdict.UNDECIDED, ""
        name = getattr(consume, "queue", "") or last_queue
        if name == REPLY_QUEUE:
            return Verdict.STAY, ""
        q = vhost.queues.get(name)
        if q is None:
            return Verdict.UNDECIDED, ""
        homes = {q.home}
    else:
        return Verdict.UNDECIDED, ""
    if not homes:
        return Verdict.UNDECIDED, ""
    if len(homes) == 1:
        home = homes.pop()
        if home != here and home in siblings:
            return Verdict.MOVE, home
    return Verdict.STAY, ""


def movable(r: Reader) -> str | None:
    """Why the connection cannot be handed over now (None: it can). Only a simple one moves:
    plain TCP, open, nothing owned here that a handover would have to carry (consumers,
    unacked deliveries, transactions, exclusive queues, a direct reply-to name), nothing
    unconfirmed, nothing on its way in or out (channel mailboxes, the writer, a content being
    assembled), not blocked (by credit, or by an alarm it published under)."""
    if r.tls is not None:
        return "tls"
    if r.state != ConnectionState.OPENED or r.transport is None or r.transport.is_closing():
        return "not open"
    # an alarm holds only a connection that published under it: a consumer's moves, and the
    # worker it goes to blocks it as this one would (one alarm state for the process tree)
    if r.held_by_alarm or r.blocked_by_credit or r.content_held or r.channels_opening:
        return "blocked"
    if r.writer.pending or r.transport.get_write_buffer_size():
        return "writing"
    for number, ch in r.channels.items():
        reason = ch.busy()
        if reason is not None:
            return reason
        if not r.assemblers[number].idle:
            return "content"
    if any(q.exclusive_owner is r for q in r.vhost.queues.values()):
        return "exclusive queue"
    return None
