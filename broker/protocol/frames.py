"""Frame cutting and encoding. Bytes in, frames out; nothing here touches a socket.

The hot frames (basic.publish in, basic.deliver / basic.ack out) have hand-written codecs;
everything else goes through pamqp."""

from __future__ import annotations

import struct

from pamqp import base, commands
from pamqp import exceptions as pamqp_exceptions
from pamqp import frame as pamqp_frame

from broker.protocol.constants import (
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
)
from broker.protocol.errors import ConnectionError_

__all__ = [
    "HEARTBEAT_FRAME",
    "FrameCutter",
    "decode_ack",
    "decode_method",
    "decode_publish",
    "encode_basic_ack",
    "encode_content",
    "encode_deliver",
    "encode_get_ok",
    "encode_method",
    "encode_return",
    "shortstr",
]

_HDR = struct.Struct(">BHI")
_METHOD_HEAD = struct.Struct(">BHIHH")  # frame header + class id + method id
_CONTENT_HEAD = struct.Struct(">BHIHHQ")  # frame header + class, weight, body size
_BODY_HEAD = struct.Struct(">BHI")
# the previous frame's end octet and the next frame's header in one pack
_END_CONTENT_HEAD = struct.Struct(">BBHIHHQ")
_END_BODY_HEAD = struct.Struct(">BBHI")
_ACK = struct.Struct(">BHIHHQB")
_QB = struct.Struct(">QB")
_FRAME_END_BYTE = b"\xce"

HEARTBEAT_FRAME = bytes((FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END))

PUBLISH_ID = (60, 40)
ACK_ID = (60, 80)


class FrameCutter:
    """Cuts complete frames out of a growing buffer. `feed` returns the frames it could cut and
    keeps the incomplete tail; it checks the announced size against frame_max before waiting
    for (and so allocating) a payload. As RabbitMQ, a payload of frame_max bytes is let
    through (its ?FRAME_SIZE_FUDGE: clients that leave the 8 bytes of framing out of their
    sums); one byte more is 501."""

    __slots__ = ("buf", "frame_max")

    def __init__(self, frame_max: int) -> None:
        self.buf = b""  # the incomplete tail of the last chunk
        self.frame_max = frame_max

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        # immutable bytes: a payload is one slice, one copy (a bytearray slice would be two)
        buf = self.buf + data if self.buf else bytes(data)
        frames: list[tuple[int, int, bytes]] = []
        pos = 0
        end = len(buf)
        limit = self.frame_max
        unpack = _HDR.unpack_from
        while end - pos >= 7:  # a whole header: check its size before the payload
            ftype, channel, size = unpack(buf, pos)
            if size > limit:
                raise ConnectionError_(
                    FRAME_ERROR, f"frame payload of {size} bytes exceeds frame_max {limit}"
                )
            stop = pos + 7 + size
            if stop >= end:
                break
            if buf[stop] != FRAME_END:
                raise ConnectionError_(
                    FRAME_ERROR, f"invalid frame end octet {buf[stop]:#x} (expected 0xce)"
                )
            if ftype not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
                raise ConnectionError_(FRAME_ERROR, f"unknown frame type {ftype}")
            frames.append((ftype, channel, buf[pos + 7 : stop]))
            pos = stop + 1
        self.buf = buf[pos:] if pos < end else b""
        return frames


def shortstr(text: str) -> bytes:
    raw = text.encode()
    return bytes((len(raw),)) + raw


# -- methods --------------------------------------------------------------------------------
def decode_method(payload: bytes) -> base.Frame:
    """A method frame payload -> pamqp method. Malformed -> 501 FRAME_ERROR (RabbitMQ: "cannot
    decode"), unknown -> 540."""
    if len(payload) < 4:
        raise ConnectionError_(FRAME_ERROR, "method frame too short")
    index = int.from_bytes(payload[:4], "big")
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise ConnectionError_(
            540, f"unknown method {index >> 16}.{index & 0xFFFF}", (index >> 16, index & 0xFFFF)
        )
    method = cls()
    try:
        method.unmarshal(payload[4:])
    except (struct.error, ValueError, pamqp_exceptions.UnmarshalingException) as exc:
        raise ConnectionError_(
            FRAME_ERROR, f"cannot decode {cls.name}: {exc}", (index >> 16, index & 0xFFFF)
        ) from exc
    except RecursionError:  # pamqp decodes tables recursively: arguments some 400 levels deep
        raise ConnectionError_(
            FRAME_ERROR,
            f"cannot decode {cls.name}: field tables nested too deep",
            (index >> 16, index & 0xFFFF),
        ) from None
    return method


def encode_method(channel: int, method: base.Frame) -> bytes:
    return pamqp_frame.marshal(method, channel)


def decode_publish(payload: bytes) -> tuple[str, str, bool, bool, bytes]:
    """basic.publish args (payload starts after class+method ids): exchange, key, flags, and
    the exchange and key as the two shortstrs they arrived as (a delivery re-sends them)."""
    try:
        pos = 6  # class(2) method(2) ticket(2)
        n = payload[pos]
        exchange = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        n = payload[pos]
        routing_key = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        bits = payload[pos]
    except (IndexError, UnicodeDecodeError) as exc:
        raise ConnectionError_(FRAME_ERROR, "cannot decode basic.publish", PUBLISH_ID) from exc
    return exchange, routing_key, bool(bits & 1), bool(bits & 2), payload[6:pos]


def decode_ack(payload: bytes) -> tuple[int, bool]:
    try:
        tag, bits = _QB.unpack_from(payload, 4)
    except struct.error as exc:
        raise ConnectionError_(FRAME_ERROR, "cannot decode basic.ack", ACK_ID) from exc
    return tag, bool(bits & 1)


# -- content --------------------------------------------------------------------------------
def encode_content(channel: int, props: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """Content header + body frames for raw property bytes and a body."""
    parts = [
        _CONTENT_HEAD.pack(FRAME_HEADER, channel, 12 + len(props), 60, 0, len(body)),
        props,
        _FRAME_END_BYTE,
    ]
    chunk = frame_max - 8
    size = len(body)
    if size <= chunk:
        if size:
            parts += (_BODY_HEAD.pack(FRAME_BODY, channel, size), body, _FRAME_END_BYTE)
        return parts
    view = memoryview(body)
    for start in range(0, size, chunk):
        piece = view[start : start + chunk]
        parts += (_BODY_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, _FRAME_END_BYTE)
    return parts


def encode_deliver(
    channel: int,
    ctag: bytes,
    delivery_tag: int,
    redelivered: bool,
    address: bytes,
    props: bytes,
    body: bytes,
    frame_max: int,
) -> list[bytes]:
    """basic.deliver + content. `ctag` is the consumer tag and `address` the exchange and
    routing key, already as shortstrs (Message.address): nothing is encoded per delivery but
    the tag."""
    tag = _QB.pack(delivery_tag, 1 if redelivered else 0)
    head = _METHOD_HEAD.pack(FRAME_METHOD, channel, 13 + len(ctag) + len(address), 60, 60)
    size = len(body)
    if 0 < size <= frame_max - 8:  # the usual case: one body frame, three packs in all
        return [
            head, ctag, tag, address,
            _END_CONTENT_HEAD.pack(FRAME_END, FRAME_HEADER, channel, 12 + len(props), 60, 0, size),
            props,
            _END_BODY_HEAD.pack(FRAME_END, FRAME_BODY, channel, size),
            body,
            _FRAME_END_BYTE,
        ]
    return [head, ctag, tag, address, _FRAME_END_BYTE,
            *encode_content(channel, props, body, frame_max)]


def encode_get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    message_count: int,
    props: bytes,
    body: bytes,
    frame_max: int,
) -> list[bytes]:
    method = commands.Basic.GetOk(
        delivery_tag=delivery_tag,
        redelivered=redelivered,
        exchange=exchange,
        routing_key=routing_key,
        message_count=message_count,
    )
    return [encode_method(channel, method), *encode_content(channel, props, body, frame_max)]


def encode_return(
    channel: int,
    code: int,
    text: str,
    exchange: str,
    routing_key: str,
    props: bytes,
    body: bytes,
    frame_max: int,
) -> list[bytes]:
    method = commands.Basic.Return(
        reply_code=code, reply_text=text, exchange=exchange, routing_key=routing_key
    )
    return [encode_method(channel, method), *encode_content(channel, props, body, frame_max)]


def encode_basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0) + (
        _FRAME_END_BYTE
    )


def encode_basic_nack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    # bits: multiple(1), requeue(2); a publisher nack never asks to requeue
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 120, delivery_tag, 1 if multiple else 0) + (
        _FRAME_END_BYTE
    )
