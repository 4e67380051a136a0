"""The consumer-side fast path: cut AMQP frames out of a byte stream and decode only what a
load generator needs. Bytes in, counters out; no asyncio here, so it is tested on hand-built
byte strings fed in odd chunks.

Per frame it reads the 7-byte header; it then decodes only
  basic.deliver  -> the delivery tag (the consumer tag is skipped by its length octet),
  basic.ack/nack -> tag + multiple (publisher confirms),
  the first body frame after a deliver -> the 8-byte send timestamp (latency).
Content headers and the rest of bodies are skipped unread. Every other method frame is kept
as (channel, payload) for the slow path (pamqp) to decode: handshake replies, declare-ok,
connection.blocked, channel.close and so on are rare."""

from __future__ import annotations

import struct
import time
from array import array

__all__ = [
    "TIMESTAMP",
    "ConfirmTracker",
    "FrameError",
    "FrameScanner",
]

_HEADER = struct.Struct(">BHI")  # type, channel, payload size
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_TAG_BITS = struct.Struct(">QB")
TIMESTAMP = _U64  # how a publisher embeds its send time (monotonic ns) in the body's head

_FRAME_METHOD = 1
_FRAME_HEADER = 2
_FRAME_BODY = 3
_FRAME_HEARTBEAT = 8
_FRAME_END = 0xCE

# class id << 16 | method id, read as one big-endian u32 from the payload's head
_DELIVER = (60 << 16) | 60
_ACK = (60 << 16) | 80
_NACK = (60 << 16) | 120


class FrameError(Exception):
    """The stream is not AMQP framing we can follow (bad end octet, oversized frame)."""


class ConfirmTracker:
    """Counts publisher confirms exactly even when acks arrive out of order: every tag up to
    `low` is settled, and `singles` holds settled tags above it (usually empty, since a broker
    confirms a single queue in order)."""

    __slots__ = ("low", "nacked", "singles")

    def __init__(self) -> None:
        self.low = 0
        self.singles: set[int] = set()
        self.nacked = 0

    @property
    def settled(self) -> int:
        return self.low + len(self.singles)

    def settle(self, tag: int, multiple: bool, nack: bool = False) -> None:
        low = self.low
        if tag <= low:
            return
        if multiple:
            singles = self.singles
            if singles:
                below = {t for t in singles if t <= tag}
                count = tag - low - len(below)
                singles -= below
            else:
                count = tag - low
            self.low = tag
            # singles just above the new watermark join it, keeping `singles` small
            while singles and self.low + 1 in singles:
                self.low += 1
                singles.discard(self.low)
        elif tag == low + 1:
            count = 1
            self.low = tag
            singles = self.singles
            while singles and self.low + 1 in singles:
                self.low += 1
                singles.discard(self.low)
        elif tag in self.singles:
            return
        else:
            count = 1
            self.singles.add(tag)
        if nack:
            self.nacked += count


class FrameScanner:
    """Feed it whatever the socket returned; read the counters after each `feed`.

    `delivered` counts basic.deliver frames; `last_tag[channel]` is the newest delivery tag on
    each channel (what a multiple ack acknowledges); `latencies_ns` gets one entry per
    delivered body that carries a timestamp, measured against the clock read once per feed
    (the moment the bytes arrived)."""

    __slots__ = (
        "_buf",
        "_want_ts",
        "confirms",
        "delivered",
        "frame_max",
        "heartbeats",
        "last_tag",
        "latencies_ns",
        "methods",
        "timestamps",
    )

    def __init__(self, frame_max: int = 131072, timestamps: bool = True) -> None:
        self._buf = bytearray()
        self._want_ts = False
        self.frame_max = frame_max
        self.timestamps = timestamps
        self.delivered = 0
        self.last_tag: dict[int, int] = {}
        self.latencies_ns = array("q")
        self.confirms = ConfirmTracker()
        self.methods: list[tuple[int, bytes]] = []
        self.heartbeats = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._buf:
            self._buf += data
            buf: bytes | bytearray | memoryview = self._buf
        else:
            buf = data
        end = len(buf)
        pos = 0
        unpack_header = _HEADER.unpack_from
        unpack_u32 = _U32.unpack_from
        unpack_u64 = _U64.unpack_from
        max_payload = self.frame_max - 8
        want_ts = self._want_ts
        stamp = self.timestamps
        now = time.monotonic_ns() if stamp else 0
        lat_append = self.latencies_ns.append
        last_tag = self.last_tag
        delivered = self.delivered
        try:
            while end - pos >= 7:
                ftype, channel, size = unpack_header(buf, pos)
                if size > max_payload:
                    raise FrameError(f"frame of {size} bytes exceeds frame_max {self.frame_max}")
                stop = pos + 7 + size  # the frame-end octet
                if stop >= end:
                    break
                if buf[stop] != _FRAME_END:
                    raise FrameError(f"bad frame end {buf[stop]:#x} at offset {stop}")
                if ftype == _FRAME_BODY:
                    if want_ts:
                        want_ts = False
                        if stamp and size >= 8:
                            lat_append(now - unpack_u64(buf, pos + 7)[0])
                elif ftype == _FRAME_METHOD:
                    (index,) = unpack_u32(buf, pos + 7)
                    if index == _DELIVER:
                        # consumer-tag shortstr, then the delivery tag
                        (tag,) = unpack_u64(buf, pos + 12 + buf[pos + 11])
                        last_tag[channel] = tag
                        delivered += 1
                        want_ts = True
                    elif index in (_ACK, _NACK):
                        tag, bits = _TAG_BITS.unpack_from(buf, pos + 11)
                        self.confirms.settle(tag, bool(bits & 1), index == _NACK)
                    else:
                        want_ts = False
                        self.methods.append((channel, bytes(buf[pos + 7 : stop])))
                elif ftype == _FRAME_HEADER:
                    pass
                elif ftype == _FRAME_HEARTBEAT:
                    self.heartbeats += 1
                else:
                    raise FrameError(f"unknown frame type {ftype}")
                pos = stop + 1
        finally:
            self.delivered = delivered
            self._want_ts = want_ts
            if buf is self._buf:
                if pos:
                    del self._buf[:pos]
            elif pos < end:
                self._buf += buf[pos:]

    def take_methods(self) -> list[tuple[int, bytes]]:
        methods, self.methods = self.methods, []
        return methods
