"""The connection life-cycle table (channel 0), without a loop."""

from __future__ import annotations

import pytest
from pamqp import commands

from broker.protocol.connection_state import ConnectionAction, ConnectionState, connection_step
from broker.protocol.errors import ConnectionError_

S, A, C = ConnectionState, ConnectionAction, commands.Connection
CLOSE = C.Close(reply_code=200, reply_text="", class_id=0, method_id=0)


def test_handshake_in_order():
    steps = [
        (S.AWAIT_START_OK, C.StartOk(), A.START_OK, S.AWAIT_TUNE_OK),
        (S.AWAIT_TUNE_OK, C.TuneOk(), A.TUNE_OK, S.AWAIT_OPEN),
        (S.AWAIT_OPEN, C.Open(), A.OPEN, S.OPENED),
    ]
    for state, method, action, after in steps:
        assert connection_step(state, method) == (action, after)


@pytest.mark.parametrize(
    ("state", "method"),
    [
        (S.AWAIT_START_OK, C.Open()),
        (S.AWAIT_START_OK, C.TuneOk()),
        (S.AWAIT_TUNE_OK, C.StartOk()),
        (S.AWAIT_OPEN, C.TuneOk()),
        (S.AWAIT_OPEN, CLOSE),
    ],
)
def test_handshake_out_of_order_is_504(state, method):
    """RabbitMQ's "unexpected method in connection state ..." is 504 CHANNEL_ERROR."""
    with pytest.raises(ConnectionError_) as err:
        connection_step(state, method)
    assert err.value.code == 504


@pytest.mark.parametrize("method", [C.StartOk(), C.TuneOk(), C.Open()])
def test_handshake_methods_once_open_are_504(method):
    with pytest.raises(ConnectionError_) as err:
        connection_step(S.OPENED, method)
    assert err.value.code == 504


def test_client_close_ends_in_closed():
    assert connection_step(S.OPENED, CLOSE) == (A.CLOSE, S.CLOSED)


@pytest.mark.parametrize("state", [S.CLOSING, S.CLOSED])
def test_crossing_and_repeated_closes_get_close_ok(state):
    assert connection_step(state, CLOSE) == (A.ANSWER_CLOSE, state)


@pytest.mark.parametrize("state", [S.CLOSING, S.CLOSED])
def test_close_ok_after_the_close_handshake_finishes(state):
    assert connection_step(state, C.CloseOk()) == (A.FINISH, S.CLOSED)


@pytest.mark.parametrize("state", [S.CLOSING, S.CLOSED])
@pytest.mark.parametrize("method", [C.Open(), C.StartOk(), C.UpdateSecret(), C.Blocked()])
def test_anything_else_while_closing_is_ignored(state, method):
    assert connection_step(state, method) == (A.IGNORE, state)
