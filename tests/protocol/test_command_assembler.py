"""CommandAssembler, no sockets: content assembly, the body bytes it holds, and max_size refused
at the content header."""

from __future__ import annotations

import struct

import pytest

from broker.protocol.command_assembler import CommandAssembler
from broker.protocol.constants import FRAME_BODY, FRAME_HEADER, FRAME_METHOD
from broker.protocol.errors import ChannelError, ConnectionError_

PUBLISH = b"\x00\x3c\x00\x28" + b"\x00\x00\x00\x01q\x00"
ACK = b"\x00\x3c\x00\x50" + bytes(9)


def header(size: int) -> bytes:
    return struct.pack(">HHQ", 60, 0, size) + b"\x00\x00"


def test_body_in_pieces_is_held_until_complete():
    a = CommandAssembler()
    assert a.frame(FRAME_METHOD, PUBLISH) is None
    assert a.frame(FRAME_HEADER, header(10)) is None
    assert a.held == 0
    assert a.frame(FRAME_BODY, b"abcd") is None
    assert a.held == 4
    cmd = a.frame(FRAME_BODY, b"efghij")
    assert cmd == ("content", PUBLISH, b"\x00\x00", b"abcdefghij")
    assert a.held == 0 and a.idle


def test_header_above_max_size_is_refused_before_any_body():
    a = CommandAssembler(max_size=100)
    a.frame(FRAME_METHOD, PUBLISH)
    kind, err = a.frame(FRAME_HEADER, header(1 << 62))
    assert kind == "error" and isinstance(err, ChannelError)
    assert (err.code, err.text, err.method) == (
        406, "message size 4611686018427387904 is larger than configured max size 100", (60, 40))
    # what follows of that body is counted, not kept
    assert a.frame(FRAME_BODY, bytes(64)) is None
    assert a.held == 0
    # a method frame ends the refused body (the client gave it up on our channel.close)
    assert a.frame(FRAME_METHOD, ACK) == ("method", ACK)


def test_exactly_max_size_is_accepted_and_a_refused_body_may_complete():
    a = CommandAssembler(max_size=8)
    a.frame(FRAME_METHOD, PUBLISH)
    a.frame(FRAME_HEADER, header(8))
    assert a.frame(FRAME_BODY, bytes(8))[0] == "content"
    a.frame(FRAME_METHOD, PUBLISH)
    assert a.frame(FRAME_HEADER, header(9))[0] == "error"
    assert a.frame(FRAME_BODY, bytes(9)) is None
    assert a.idle
    with pytest.raises(ConnectionError_):  # a refused body still may not overrun
        a.frame(FRAME_METHOD, PUBLISH)
        a.frame(FRAME_HEADER, header(9))
        a.frame(FRAME_BODY, bytes(10))
