"""The channel life-cycle table, without a loop: every (state, input) pair and its outcome."""

from __future__ import annotations

import pytest

from broker.protocol.channel_state import (
    TRANSITIONS,
    ChannelAction,
    ChannelInput,
    ChannelState,
    channel_step,
)
from broker.protocol.errors import ConnectionError_

S, In, A = ChannelState, ChannelInput, ChannelAction


def run(*inputs: ChannelInput) -> tuple[list[ChannelAction], ChannelState]:
    state, actions = S.OPEN, []
    for event in inputs:
        action, state = channel_step(state, event)
        actions.append(action)
    return actions, state


def test_client_close_of_an_open_channel_is_accepted_at_once():
    assert run(In.COMMAND, In.CLOSE) == ([A.HANDLE, A.ACCEPT_CLOSE], S.CLOSED)


def test_server_close_waits_for_close_ok_and_drops_the_rest():
    assert run(In.ERROR, In.COMMAND, In.COMMAND, In.CLOSE_OK) == (
        [A.SEND_CLOSE, A.DROP, A.DROP, A.FINISH],
        S.CLOSED,
    )


@pytest.mark.parametrize("between", [0, 1, 3])
def test_crossing_close_gets_close_ok_and_still_waits_for_ours(between):
    inputs = [In.ERROR] + [In.COMMAND] * between + [In.CLOSE, In.COMMAND, In.CLOSE_OK]
    actions, state = run(*inputs)
    assert actions[0] is A.SEND_CLOSE
    assert actions[1 + between] is A.ANSWER_CLOSE
    assert actions[-1] is A.FINISH and state is S.CLOSED


def test_a_second_error_while_closing_sends_nothing():
    assert run(In.ERROR, In.ERROR) == ([A.SEND_CLOSE, A.DROP], S.CLOSING)


def test_what_reaches_a_closed_channel_is_dropped():
    for event in (In.CLOSE_OK, In.COMMAND, In.ERROR):
        assert channel_step(S.CLOSED, event) == (A.DROP, S.CLOSED)


def test_a_second_close_gets_a_second_close_ok():
    """close, close in one write: RabbitMQ answers both."""
    assert run(In.CLOSE, In.CLOSE) == ([A.ACCEPT_CLOSE, A.ANSWER_CLOSE], S.CLOSED)


def test_close_ok_on_an_open_channel_is_503():
    with pytest.raises(ConnectionError_) as err:
        channel_step(S.OPEN, In.CLOSE_OK)
    assert err.value.code == 503 and err.value.method == (20, 41)


@pytest.mark.parametrize("state", list(ChannelState))
def test_channel_open_on_a_number_in_use_is_504_in_every_state(state):
    with pytest.raises(ConnectionError_) as err:
        channel_step(state, In.OPEN)
    assert err.value.code == 504 and "second 'channel.open'" in err.value.text


def test_every_pair_is_decided():
    """A pair is in the table or refused with a hard error: nothing falls through."""
    for state in ChannelState:
        for event in ChannelInput:
            if (state, event) in TRANSITIONS:
                continue
            with pytest.raises(ConnectionError_):
                channel_step(state, event)
