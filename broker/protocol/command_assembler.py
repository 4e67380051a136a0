"""Assembles method, content-header and body frames of one channel into commands, as RabbitMQ's
rabbit_command_assembler. Out-of-order frames are connection errors (505 UNEXPECTED_FRAME).

A content header announcing more than `max_size` bytes is refused there, before any body is kept
(RabbitMQ checks max_message_size once the body is complete; by then a client has made the broker
hold it): the assembler returns an ("error", ChannelError 406) command and counts the body frames
that follow without keeping them; a method frame ends that body early (the client stops sending
it once it has the channel.close)."""

from __future__ import annotations

import struct

from broker.protocol.constants import (
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_METHOD,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
)
from broker.protocol.errors import ChannelError, ConnectionError_

__all__ = ["ACK_INDEX", "EXPECT_METHOD", "PUBLISH_INDEX", "CommandAssembler"]

PUBLISH_INDEX = 0x003C0028
ACK_INDEX = 0x003C0050
_HEADER = struct.Struct(">HHQ")

EXPECT_METHOD = 0  # idle: between commands (the reader's fast path tests it inline)
_EXPECT_HEADER = 1
_EXPECT_BODY = 2
_SKIP_BODY = 3  # the body of a refused message: counted, not kept

DEFAULT_MAX_SIZE = 128 * 1024 * 1024  # RabbitMQ's max_message_size


class CommandAssembler:
    """Feed frames of one channel; `frame` returns a complete command or None.

    Commands: ("method", payload) for a method without content,
    ("content", method_payload, props, body) once a content-bearing method's body is complete, or
    ("error", ChannelError) for a content header announcing more than `max_size` bytes.
    Only basic.publish carries content from a client."""

    __slots__ = (
        "body_size", "chunks", "held", "max_size", "method", "props", "received", "state",
    )

    def __init__(self, max_size: int = DEFAULT_MAX_SIZE) -> None:
        self.state = EXPECT_METHOD
        self.method = b""
        self.props = b""
        self.body_size = 0
        self.received = 0
        self.chunks: list[bytes] = []
        self.held = 0  # body bytes kept for the message in progress
        self.max_size = max_size

    @property
    def idle(self) -> bool:
        return self.state == EXPECT_METHOD

    def frame(self, ftype: int, payload: bytes) -> tuple | None:
        state = self.state
        if ftype == FRAME_METHOD:
            if state == _SKIP_BODY:
                # the client saw the channel.close for its refused message and gave up the
                # body (its close-ok, most likely): that body is owed to no one
                state = self.state = EXPECT_METHOD
            if state != EXPECT_METHOD:
                raise _unexpected(state)
            if payload[:4] == b"\x00\x3c\x00\x28":  # basic.publish
                self.method = payload
                self.state = _EXPECT_HEADER
                return None
            return ("method", payload)
        if ftype == FRAME_HEADER:
            if state != _EXPECT_HEADER:
                raise _unexpected(state)
            if len(payload) < 14:
                raise ConnectionError_(FRAME_ERROR, "malformed content header frame")
            class_id, _weight, size = _HEADER.unpack_from(payload)
            if class_id != 60:
                raise ConnectionError_(
                    UNEXPECTED_FRAME,
                    f"expected content header for class 60, got one for class {class_id} "
                    "instead",
                    _PUBLISH_IDS,
                )
            self.props = payload[12:]
            if size == 0:
                self.state = EXPECT_METHOD
                return ("content", self.method, self.props, b"")
            self.body_size = size
            self.received = 0
            self.chunks = []
            if size > self.max_size:
                self.state = _SKIP_BODY
                return (
                    "error",
                    ChannelError(
                        PRECONDITION_FAILED,
                        f"message size {size} is larger than configured max size "
                        f"{self.max_size}",
                        _PUBLISH_IDS,
                    ),
                )
            self.state = _EXPECT_BODY
            return None
        if ftype == FRAME_BODY:
            if state != _EXPECT_BODY:
                if state == _SKIP_BODY:
                    return self._skip(len(payload))
                raise _unexpected(state)
            self.received += len(payload)
            if self.received > self.body_size:
                raise ConnectionError_(
                    UNEXPECTED_FRAME,
                    f"content body exceeds the announced {self.body_size} bytes",
                    _PUBLISH_IDS,
                )
            if self.received == self.body_size and not self.chunks:
                self.state = EXPECT_METHOD
                return ("content", self.method, self.props, payload)
            self.chunks.append(payload)
            if self.received == self.body_size:
                self.state = EXPECT_METHOD
                self.held = 0
                body = b"".join(self.chunks)
                self.chunks = []
                return ("content", self.method, self.props, body)
            self.held = self.received
            return None
        raise ConnectionError_(UNEXPECTED_FRAME, f"unexpected frame type {ftype} on a channel")

    def _skip(self, n: int) -> None:
        self.received += n
        if self.received > self.body_size:
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                f"content body exceeds the announced {self.body_size} bytes",
                _PUBLISH_IDS,
            )
        if self.received == self.body_size:
            self.state = EXPECT_METHOD


_PUBLISH_IDS = (60, 40)


def _unexpected(state: int) -> ConnectionError_:
    """A frame of the wrong type for the assembler's state, in RabbitMQ's words; while a
    publish's content is awaited the error names basic.publish."""
    if state == EXPECT_METHOD:
        return ConnectionError_(
            UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
        )
    if state == _EXPECT_HEADER:
        text = "expected content header for class 60, got non content header frame instead"
    else:
        text = "expected content body, got non content body frame instead"
    return ConnectionError_(UNEXPECTED_FRAME, text, _PUBLISH_IDS)
