"""A channel's life cycle as a table (in the manner of h11's _state.py): what a channel does
with each input in each state. No I/O here: the channel task asks `channel_step`, then acts.

    OPEN --client close--> CLOSED           (close-ok sent; the number is free at once)
    OPEN --soft error--> CLOSING            (channel.close sent)
    CLOSING --client close-ok--> CLOSED
    CLOSING --client close--> CLOSING       (crossing closes: the client's gets close-ok, and
                                             the channel still waits for its own close-ok)

While CLOSING everything else is dropped (AMQP 0-9-1 section 2.2.4, RabbitMQ's closing state
in rabbit_channel), except a channel.open: in any state that is a second open, a hard error.
 The inputs reach the channel in the order the client sent them, whatever
order the two sides decided to close in: that is what makes crossing closes safe."""

from __future__ import annotations

import enum

from broker.protocol.constants import CHANNEL_ERROR, COMMAND_INVALID
from broker.protocol.errors import ConnectionError_

__all__ = ["ChannelAction", "ChannelInput", "ChannelState", "channel_step"]


class ChannelState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"  # we sent channel.close and wait for the client's close-ok
    CLOSED = "closed"


class ChannelInput(enum.Enum):
    CLOSE = "channel.close"  # from the client
    CLOSE_OK = "channel.close-ok"  # from the client
    OPEN = "channel.open"  # from the client, on a number that has a channel
    COMMAND = "command"  # any other method, or a whole publish
    ERROR = "error"  # the server fails the channel (a soft error)


class ChannelAction(enum.Enum):
    HANDLE = "handle"  # run the command
    ACCEPT_CLOSE = "accept-close"  # release everything, free the number, send close-ok
    SEND_CLOSE = "send-close"  # release everything, send channel.close
    ANSWER_CLOSE = "answer-close"  # a crossing close: send close-ok, keep waiting for ours
    FINISH = "finish"  # our close is acknowledged: the channel is gone
    DROP = "drop"


_S, _I, _A = ChannelState, ChannelInput, ChannelAction

TRANSITIONS: dict[tuple[ChannelState, ChannelInput], tuple[ChannelAction, ChannelState]] = {
    (_S.OPEN, _I.COMMAND): (_A.HANDLE, _S.OPEN),
    (_S.OPEN, _I.CLOSE): (_A.ACCEPT_CLOSE, _S.CLOSED),
    (_S.OPEN, _I.ERROR): (_A.SEND_CLOSE, _S.CLOSING),
    (_S.CLOSING, _I.CLOSE): (_A.ANSWER_CLOSE, _S.CLOSING),
    (_S.CLOSING, _I.CLOSE_OK): (_A.FINISH, _S.CLOSED),
    (_S.CLOSING, _I.COMMAND): (_A.DROP, _S.CLOSING),
    (_S.CLOSING, _I.ERROR): (_A.DROP, _S.CLOSING),  # already closing: one close is enough
    # a closed channel's mailbox may still hold what the client sent after its close; a
    # second close gets a second close-ok (RabbitMQ runs the close handshake again)
    (_S.CLOSED, _I.CLOSE): (_A.ANSWER_CLOSE, _S.CLOSED),
    (_S.CLOSED, _I.CLOSE_OK): (_A.DROP, _S.CLOSED),
    (_S.CLOSED, _I.COMMAND): (_A.DROP, _S.CLOSED),
    (_S.CLOSED, _I.ERROR): (_A.DROP, _S.CLOSED),
}


# Pairs the table lacks are hard errors, as RabbitMQ answers them.
_REFUSED: dict[ChannelInput, tuple[int, str, tuple[int, int]]] = {
    _I.OPEN: (CHANNEL_ERROR, "second 'channel.open' seen", (20, 10)),
    _I.CLOSE_OK: (COMMAND_INVALID, "channel.close-ok but no channel.close was sent", (20, 41)),
}


def channel_step(
    state: ChannelState, event: ChannelInput
) -> tuple[ChannelAction, ChannelState]:
    """The action and the next state; a pair the table lacks raises its hard error."""
    step = TRANSITIONS.get((state, event))
    if step is None:
        code, text, method = _REFUSED[event]
        raise ConnectionError_(code, text, method)
    return step
