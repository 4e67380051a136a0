"""Frame cutting and encoding. Bytes in, frames out; nothing here touches a socket.

The hot frames (basic.publish in, basic.deliver / basic.ack out) have hand-written codecs;
everything else goes through pamqp."""

from __future__ import annotations

import struct
from typing import Any

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
    "DELIVER_TAG",
    "FRAME_END_BYTE",
    "FRAME_PUBLISH",
    "HEARTBEAT_FRAME",
    "FrameCutter",
    "decode_ack",
    "decode_method",
    "decode_publish",
    "deliver_head",
    "deliver_middle",
    "encode_basic_ack",
    "encode_content",
    "encode_deliver",
    "encode_frames",
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
DELIVER_TAG = struct.Struct(">QB")  # a delivery tag and one octet of bits (redelivered, multiple)
_BODY_SIZE = struct.Struct(">Q")
FRAME_END_BYTE = b"\xce"

HEARTBEAT_FRAME = bytes((FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END))

PUBLISH_ID = (60, 40)
ACK_ID = (60, 80)


FRAME_PUBLISH = 0x100
"""Not a wire frame type: what a FrameCutter with `publishes=True` returns for a whole publish
(basic.publish, its content header and one body frame, consecutive on one channel), as
(FRAME_PUBLISH, channel, ("content", method payload, property bytes, body))."""

_PUBLISH_HEAD = b"\x00\x3c\x00\x28"  # basic.publish's class and method ids
_CONTENT_CLASS = b"\x00\x3c"


class FrameCutter:
    """Cuts complete frames out of a growing buffer. `feed` returns the frames it could cut and
    keeps the incomplete tail; it checks the announced size against frame_max before waiting
    for (and so allocating) a payload. As RabbitMQ, a payload of frame_max bytes is let
    through (its ?FRAME_SIZE_FUDGE: clients that leave the 8 bytes of framing out of their
    sums); one byte more is 501.

    With `publishes=True` (the reader's), a basic.publish whose header and single body frame
    follow it in the same buffer comes out as one FRAME_PUBLISH entry, already shaped as the
    channel's "content" command: the commonest three frames of a publisher's stream cost one
    pass and no re-checking. Anything unusual about them (another channel between, a body in
    several frames, a size that does not add up, a bad end octet) is left to the frame-by-
    frame path, which judges it as before."""

    __slots__ = ("buf", "frame_max", "last", "publishes")

    def __init__(self, frame_max: int, publishes: bool = False) -> None:
        self.buf = b""  # the incomplete tail of the last chunk
        self.frame_max = frame_max
        self.publishes = publishes
        # the last whole publish cut the long way: (its bytes from the method frame to the
        # body frame's header, frame_max then, channel, method payload, properties, body size).
        # A publisher repeats exchange, key, properties and size: the next publish whose
        # bytes start the same passed every check but the body's end octet already, and it
        # shares the method and property objects (the channel compares them by identity).
        self.last: tuple[bytes, int, int, bytes, bytes, int] | None = None

    def feed(self, data: bytes) -> list[tuple[int, int, Any]]:
        # immutable bytes: a payload is one slice, one copy (a bytearray slice would be two)
        buf = self.buf + data if self.buf else bytes(data)
        frames: list[tuple[int, int, Any]] = []
        append = frames.append
        pos = 0
        end = len(buf)
        limit = self.frame_max
        unpack = _HDR.unpack_from
        fuse = self.publishes
        last = self.last
        if last is not None and last[1] != limit:
            last = self.last = None
        if last is not None:
            prefix, _, last_channel, last_method, last_props, last_size = last
            skip = len(prefix)
        while end - pos >= 7:  # a whole header: check its size before the payload
            # a slice and a compare: bytes.startswith parses its arguments from a tuple,
            # which costs more than copying the few dozen bytes
            if last is not None and buf[pos : pos + skip] == prefix:
                bstop = pos + skip + last_size
                if bstop < end and buf[bstop] == FRAME_END:
                    append((FRAME_PUBLISH, last_channel, (
                        "content", last_method, last_props, buf[pos + skip : bstop],
                    )))
                    pos = bstop + 1
                    continue
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
            if fuse and ftype == FRAME_METHOD and channel and buf.startswith(
                _PUBLISH_HEAD, pos + 7
            ):
                h = stop + 1  # the content header frame
                if end - h >= 21:  # its frame header, class, weight and body size
                    htype, hch, hsize = unpack(buf, h)
                    b = h + 8 + hsize  # the body frame
                    if (
                        htype == FRAME_HEADER
                        and hch == channel
                        and 14 <= hsize <= limit
                        and end - b >= 7
                        and buf[b - 1] == FRAME_END
                        and buf.startswith(_CONTENT_CLASS, h + 7)
                    ):
                        btype, bch, bsize = unpack(buf, b)
                        bstop = b + 7 + bsize
                        if (
                            btype == FRAME_BODY
                            and bch == channel
                            and bsize <= limit
                            and bstop < end
                            and buf[bstop] == FRAME_END
                            and bsize
                            and _BODY_SIZE.unpack_from(buf, h + 11)[0] == bsize
                        ):
                            method = buf[pos + 7 : stop]
                            props = buf[h + 19 : b - 1]
                            append((FRAME_PUBLISH, channel, (
                                "content", method, props, buf[b + 7 : bstop],
                            )))
                            last = self.last = (
                                buf[pos : b + 7], limit, channel, method, props, bsize
                            )
                            prefix, last_channel, last_method, last_props, last_size = (
                                last[0], channel, method, props, bsize
                            )
                            skip = len(prefix)
                            pos = bstop + 1
                            continue
            elif ftype not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
                raise ConnectionError_(FRAME_ERROR, f"unknown frame type {ftype}")
            append((ftype, channel, buf[pos + 7 : stop]))
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
        tag, bits = DELIVER_TAG.unpack_from(payload, 4)
    except struct.error as exc:
        raise ConnectionError_(FRAME_ERROR, "cannot decode basic.ack", ACK_ID) from exc
    return tag, bool(bits & 1)


# -- content --------------------------------------------------------------------------------
def encode_content(channel: int, props: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """Content header + body frames for raw property bytes and a body."""
    parts = [
        _CONTENT_HEAD.pack(FRAME_HEADER, channel, 12 + len(props), 60, 0, len(body)),
        props,
        FRAME_END_BYTE,
    ]
    chunk = frame_max - 8
    size = len(body)
    if size <= chunk:
        if size:
            parts += (_BODY_HEAD.pack(FRAME_BODY, channel, size), body, FRAME_END_BYTE)
        return parts
    view = memoryview(body)
    for start in range(0, size, chunk):
        piece = view[start : start + chunk]
        parts += (_BODY_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, FRAME_END_BYTE)
    return parts


def encode_frames(batch: list[tuple[int, int, Any]], frame_max: int) -> bytes:
    """Frames a FrameCutter cut, back to bytes a FrameCutter cuts to the same commands (a
    connection handed to another process replays what it had read and not yet handled). A
    whole publish is its method, header and body frames again (a body over frame_max in
    several)."""
    parts: list[bytes] = []
    for ftype, channel, payload in batch:
        if ftype == FRAME_PUBLISH:
            _, method, props, body = payload
            parts += (_BODY_HEAD.pack(FRAME_METHOD, channel, len(method)), method, FRAME_END_BYTE)
            parts += encode_content(channel, props, body, frame_max)
        else:
            parts += (_BODY_HEAD.pack(ftype, channel, len(payload)), payload, FRAME_END_BYTE)
    return b"".join(parts)


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
    tag = DELIVER_TAG.pack(delivery_tag, 1 if redelivered else 0)
    head = _METHOD_HEAD.pack(FRAME_METHOD, channel, 13 + len(ctag) + len(address), 60, 60)
    size = len(body)
    if 0 < size <= frame_max - 8:  # the usual case: one body frame, three packs in all
        return [
            head, ctag, tag, address,
            _END_CONTENT_HEAD.pack(FRAME_END, FRAME_HEADER, channel, 12 + len(props), 60, 0, size),
            props,
            _END_BODY_HEAD.pack(FRAME_END, FRAME_BODY, channel, size),
            body,
            FRAME_END_BYTE,
        ]
    return [head, ctag, tag, address, FRAME_END_BYTE,
            *encode_content(channel, props, body, frame_max)]


def deliver_head(channel: int, ctag: bytes, address_size: int) -> bytes:
    """basic.deliver's frame header, class and method ids and consumer tag (a shortstr): the
    start of every delivery to one consumer of messages with one exchange and key size."""
    return _METHOD_HEAD.pack(FRAME_METHOD, channel, 13 + len(ctag) + address_size, 60, 60) + ctag


def deliver_middle(channel: int, props: bytes, size: int) -> bytes:
    """Between a one-body-frame delivery's address and its body: the method frame's end, the
    content header frame with `props`, and the body frame's header (0 < size <= frame_max
    - 8). What the deliveries of one publisher's messages of one size repeat."""
    return (
        _END_CONTENT_HEAD.pack(FRAME_END, FRAME_HEADER, channel, 12 + len(props), 60, 0, size)
        + props
        + _END_BODY_HEAD.pack(FRAME_END, FRAME_BODY, channel, size)
    )


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
        FRAME_END_BYTE
    )


def encode_basic_nack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    # bits: multiple(1), requeue(2); a publisher nack never asks to requeue
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 120, delivery_tag, 1 if multiple else 0) + (
        FRAME_END_BYTE
    )
