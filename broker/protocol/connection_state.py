"""The connection's life cycle as a table (in the manner of h11's _state.py): which methods
channel 0 takes in each state, what the reader does with them and the state that follows.
No I/O here: the reader asks `connection_step`, then acts.

    AWAIT_HEADER -> AWAIT_START_OK -> AWAIT_TUNE_OK -> AWAIT_OPEN -> OPENED
    OPENED --client close--> CLOSED                  (close-ok sent)
    any --hard error--> CLOSING                      (connection.close sent)
    CLOSING --client close-ok--> CLOSED --> socket closed
    CLOSING/CLOSED --client close--> same state      (a crossing close gets close-ok)

In CLOSING and CLOSED every other frame is read and discarded, as RabbitMQ does: the socket is
not closed under a client that is still writing (that would reset the connection and could
lose the close frames on the way to it). In CLOSED the client closes its socket, or the reader
does after a short linger."""

from __future__ import annotations

import enum

from pamqp import base, commands

from broker.protocol.constants import CHANNEL_ERROR
from broker.protocol.errors import ConnectionError_

__all__ = ["ConnectionAction", "ConnectionState", "connection_step"]


class ConnectionState(enum.IntEnum):
    AWAIT_HEADER = 0
    AWAIT_START_OK = 1
    AWAIT_TUNE_OK = 2
    AWAIT_OPEN = 3
    OPENED = 4
    CLOSING = 5  # we sent connection.close and wait for close-ok
    CLOSED = 6  # the close handshake is over: read and discard until the socket goes


class ConnectionAction(enum.Enum):
    START_OK = "start-ok"  # authenticate, send tune
    TUNE_OK = "tune-ok"  # check and take the client's limits
    OPEN = "open"  # vhost and permissions, send open-ok
    CLOSE = "close"  # the client closes: stop the channels, send close-ok
    UPDATE_SECRET = "update-secret"
    ANSWER_CLOSE = "answer-close"  # a close while closing: close-ok, nothing else changes
    FINISH = "finish"  # close-ok after the close handshake: close the socket
    IGNORE = "ignore"


_S, _A, _C = ConnectionState, ConnectionAction, commands.Connection

_Step = tuple[ConnectionAction, ConnectionState]

TRANSITIONS: dict[tuple[ConnectionState, type[base.Frame]], _Step] = {
    (_S.AWAIT_START_OK, _C.StartOk): (_A.START_OK, _S.AWAIT_TUNE_OK),
    (_S.AWAIT_TUNE_OK, _C.TuneOk): (_A.TUNE_OK, _S.AWAIT_OPEN),
    (_S.AWAIT_OPEN, _C.Open): (_A.OPEN, _S.OPENED),
    (_S.OPENED, _C.Close): (_A.CLOSE, _S.CLOSED),
    (_S.OPENED, _C.CloseOk): (_A.IGNORE, _S.OPENED),
    (_S.OPENED, _C.UpdateSecret): (_A.UPDATE_SECRET, _S.OPENED),
    (_S.OPENED, _C.Blocked): (_A.IGNORE, _S.OPENED),
    (_S.OPENED, _C.Unblocked): (_A.IGNORE, _S.OPENED),
    (_S.CLOSING, _C.Close): (_A.ANSWER_CLOSE, _S.CLOSING),
    (_S.CLOSING, _C.CloseOk): (_A.FINISH, _S.CLOSED),
    (_S.CLOSED, _C.Close): (_A.ANSWER_CLOSE, _S.CLOSED),
    (_S.CLOSED, _C.CloseOk): (_A.FINISH, _S.CLOSED),
}


def connection_step(
    state: ConnectionState, method: base.Frame
) -> tuple[ConnectionAction, ConnectionState]:
    """The action and the next state for a method on channel 0. While closing, what the table
    lacks is ignored; otherwise it is 504 CHANNEL_ERROR, RabbitMQ's "unexpected method in
    connection state ..." (RabbitMQ says nothing at all before tune-ok: see
    docs/CONFORMANCE.md)."""
    step = TRANSITIONS.get((state, type(method)))
    if step is not None:
        return step
    if state >= _S.CLOSING:
        return _A.IGNORE, state
    index = method.index
    raise ConnectionError_(
        CHANNEL_ERROR,
        f"unexpected method {method.name} in connection state {state.name.lower()}",
        (index >> 16, index & 0xFFFF),
    )
