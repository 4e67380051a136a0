"""The message as it travels publish -> route -> queue -> store -> deliver.

A message keeps its content-header properties as the raw bytes the publisher sent (flags +
property list): a delivery re-sends them verbatim, so the hot path never decodes or re-encodes
properties. They are decoded lazily, only by what needs them (headers exchange, TTL,
dead-lettering, management)."""

from __future__ import annotations

import itertools
import os
import struct
from typing import Any, Final

from pamqp import commands

from broker.protocol.properties import decode_properties

__all__ = [
    "Message", "encode_properties", "next_msg_id", "parse_delivery_mode", "parse_priority",
]

# Unique across restarts without coordination: a random 64-bit boot prefix and a counter.
# Final: compiled, they are C statics instead of a lookup in the module's dict per message.
_BOOT: Final = int.from_bytes(os.urandom(8), "big") << 64
_counter: Final = itertools.count(1)

_FLAG_CONTENT_TYPE = 0x8000
_FLAG_CONTENT_ENCODING = 0x4000
_FLAG_HEADERS = 0x2000
_FLAG_DELIVERY_MODE = 0x1000
_FLAG_PRIORITY = 0x0800
_ENC_HEAD = struct.Struct(">BBIQ")


def next_msg_id() -> int:
    """A 128-bit id for a message body, unique across broker restarts."""
    return _BOOT | next(_counter)


def parse_delivery_mode(props: bytes) -> int:
    """delivery_mode from raw property bytes without decoding the rest (0 when absent)."""
    if len(props) < 2:
        return 0
    flags = (props[0] << 8) | props[1]
    if not flags & _FLAG_DELIVERY_MODE:
        return 0
    return props[_after_headers(props, flags)]


def parse_priority(props: bytes) -> int:
    """priority from raw property bytes without decoding the rest (0 when absent)."""
    if len(props) < 2:
        return 0
    flags = (props[0] << 8) | props[1]
    if not flags & _FLAG_PRIORITY:
        return 0
    pos = _after_headers(props, flags)
    if flags & _FLAG_DELIVERY_MODE:
        pos += 1
    return props[pos]


def _after_headers(props: bytes, flags: int) -> int:
    """Where the property list's delivery_mode (or what follows the headers) starts."""
    pos = 2
    if flags & 1:  # continuation flag words: skip them (no such properties in 0-9-1)
        while (props[pos - 2] << 8 | props[pos - 1]) & 1:
            pos += 2
    if flags & _FLAG_CONTENT_TYPE:
        pos += 1 + props[pos]
    if flags & _FLAG_CONTENT_ENCODING:
        pos += 1 + props[pos]
    if flags & _FLAG_HEADERS:
        pos += 4 + int.from_bytes(props[pos : pos + 4], "big")
    return pos


def encode_properties(properties: commands.Basic.Properties) -> bytes:
    """Raw property bytes (flags + list) for a pamqp Properties object."""
    return properties.marshal()


class Message:
    """One published message. `props` is the raw property block; `body` the assembled body."""

    __slots__ = (
        "_address",
        "body",
        "decoded",
        "exchange",
        "msg_id",
        "persistent",
        "props",
        "routing_key",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        props: bytes,
        body: bytes,
        msg_id: int = 0,
        address: bytes | None = None,
    ) -> None:
        self.msg_id = msg_id or _BOOT | next(_counter)  # next_msg_id(), without the call
        self._address = address
        self.exchange = exchange
        self.routing_key = routing_key
        self.props = props
        self.body = body
        # the delivery-mode flag bit first: most transient publishes set no property at all
        self.persistent = (
            len(props) >= 2 and props[0] & 0x10 != 0 and parse_delivery_mode(props) == 2
        )
        # the decoded properties, kept while a publish is routed; the channel drops them
        # before the message is queued (a 128 KiB headers table decodes to some MiB)
        self.decoded: commands.Basic.Properties | None = None

    @property
    def address(self) -> bytes:
        """Exchange and routing key as two AMQP shortstrs, as basic.deliver carries them."""
        address = self._address
        if address is None:
            ex, rk = self.exchange.encode(), self.routing_key.encode()
            address = self._address = bytes((len(ex),)) + ex + bytes((len(rk),)) + rk
        return address

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def properties(self) -> commands.Basic.Properties:
        """Decoded properties (pamqp's class, broker/protocol/properties.py's linear
        decoder), cached in `decoded`. Raises ValueError on a malformed block."""
        if self.decoded is None:
            self.decoded = decode_properties(self.props)
        return self.decoded

    @property
    def has_expiration(self) -> bool:
        return len(self.props) >= 2 and bool(self.props[0] & 0x01)  # expiration flag (0x0100)

    @property
    def headers(self) -> dict[str, Any]:
        if not (len(self.props) >= 2 and self.props[0] & 0x20):  # headers flag (0x2000)
            return {}
        return self.properties.headers or {}

    def with_props(self, props: bytes) -> Message:
        """A copy with another raw property block (BCC removal, direct reply-to); same body."""
        return Message(self.exchange, self.routing_key, props, self.body)

    # -- the on-disk form, used by the message stores and the queue index -------------------
    def encode(self) -> bytes:
        ex = self.exchange.encode()
        rk = self.routing_key.encode()
        head = _ENC_HEAD.pack(len(ex), len(rk), len(self.props), 0)
        return b"".join((head, ex, rk, self.props, self.body))

    @classmethod
    def decode(cls, data: bytes, msg_id: int, start: int = 0, end: int | None = None
               ) -> Message:
        """The message encoded in data[start:end] (a stream chunk holds many)."""
        lex, lrk, lprops, _ = _ENC_HEAD.unpack_from(data, start)
        pos = start + _ENC_HEAD.size
        ex = data[pos : pos + lex].decode()
        pos += lex
        rk = data[pos : pos + lrk].decode()
        pos += lrk
        props = bytes(data[pos : pos + lprops])
        pos += lprops
        return cls(ex, rk, props, bytes(data[pos:end]), msg_id)

    def __repr__(self) -> str:
        return f"<Message {self.msg_id:x} {self.exchange!r}/{self.routing_key!r} {self.size}B>"
