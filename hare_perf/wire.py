"""Encoding for hare-perf: slow-path methods through pamqp, and the publish fast path as a
template of N pre-encoded messages (basic.publish + content header + body) built once, into
which only the send timestamps are patched before each write. Bytes only; no asyncio."""

from __future__ import annotations

import ssl
import struct
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from pamqp import base, commands
from pamqp import frame as pamqp_frame

from hare_perf.scanner import TIMESTAMP

__all__ = [
    "PROTOCOL_HEADER",
    "BrokerUrl",
    "PublishBatch",
    "decode_method",
    "encode_ack",
    "encode_method",
    "encode_publish",
    "parse_url",
]

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_FRAME_END = b"\xce"
_METHOD_HEAD = struct.Struct(">BHIHH")
_CONTENT_HEAD = struct.Struct(">BHIHHQ")
_BODY_HEAD = struct.Struct(">BHI")
_ACK = struct.Struct(">BHIHHQBB")  # method frame with basic.ack args and the end octet


@dataclass(frozen=True, slots=True)
class BrokerUrl:
    host: str
    port: int
    user: str
    password: str
    vhost: str
    tls: bool = False  # amqps://
    cacertfile: str = ""  # trust these CAs and check the broker's certificate
    certfile: str = ""  # present this client certificate (keyfile: its key)
    keyfile: str = ""

    def redacted(self) -> str:
        vhost = "" if self.vhost == "/" else self.vhost
        scheme = "amqps" if self.tls else "amqp"
        return f"{scheme}://{self.user}@{self.host}:{self.port}/{vhost}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client side of TLS for amqps://, None for amqp://. Without cacertfile the
        broker's certificate is not checked (a load generator measures, it does not trust)."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.cacertfile or None)
        if not self.cacertfile:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.certfile:
            ctx.load_cert_chain(self.certfile, self.keyfile or None)
        return ctx


_TLS_QUERY = ("cacertfile", "certfile", "keyfile")


def parse_url(url: str) -> BrokerUrl:
    """amqp://user:pass@host:port/vhost or amqps://...?cacertfile=&certfile=&keyfile= (the
    RabbitMQ URI query keys); an empty path means vhost "/" (RabbitMQ's rule)."""
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise ValueError(f"only amqp:// and amqps:// URLs are supported, got {url!r}")
    tls = parts.scheme == "amqps"
    query = dict(parse_qsl(parts.query))
    unknown = sorted(set(query) - set(_TLS_QUERY))
    if unknown or (query and not tls):
        raise ValueError(f"unsupported URL query {parts.query!r}: amqps:// takes "
                         f"{', '.join(_TLS_QUERY)}")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return BrokerUrl(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or (5671 if tls else 5672),
        user=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        vhost=unquote(path) if path else "/",
        tls=tls,
        **query,
    )


def encode_method(channel: int, method: base.Frame) -> bytes:
    return pamqp_frame.marshal(method, channel)


def decode_method(payload: bytes) -> base.Frame:
    index = int.from_bytes(payload[:4], "big")
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise ValueError(f"unknown method {index >> 16}.{index & 0xFFFF}")
    method = cls()
    method.unmarshal(payload[4:])
    return method


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _ACK.pack(1, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0, 0xCE)


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"shortstr too long: {text[:40]!r}...")
    return bytes((len(raw),)) + raw


def _properties(persistent: bool) -> bytes:
    # property flags: bit 12 (0x1000) = delivery-mode; the only property we send
    if persistent:
        return struct.pack(">HB", 0x1000, 2)
    return struct.pack(">H", 0)


def encode_publish(
    channel: int, exchange: str, routing_key: str, body: bytes, persistent: bool, frame_max: int
) -> tuple[bytes, int]:
    """One message as bytes, and the offset of its body's first byte in them."""
    args = b"\x00\x00" + _shortstr(exchange) + _shortstr(routing_key) + b"\x00"
    head = _METHOD_HEAD.pack(1, channel, 4 + len(args), 60, 40) + args + _FRAME_END
    props = _properties(persistent)
    head += _CONTENT_HEAD.pack(2, channel, 12 + len(props), 60, 0, len(body)) + props + _FRAME_END
    body_offset = len(head) + 7
    chunk = frame_max - 8
    parts = [head]
    for start in range(0, len(body), chunk):
        piece = body[start : start + chunk]
        parts += (_BODY_HEAD.pack(3, channel, len(piece)), piece, _FRAME_END)
    return b"".join(parts), body_offset


class PublishBatch:
    """`size` messages laid end to end; message i goes to routing_keys[i % len(keys)]. Only the
    8-byte timestamp at each body's head changes between writes, so a batch is one bytearray
    patched in place and written with a single call."""

    __slots__ = ("_ends", "_offsets", "size", "template")

    def __init__(
        self,
        channel: int,
        exchange: str,
        routing_keys: list[str],
        body_size: int,
        persistent: bool,
        frame_max: int,
        batch_bytes: int = 65536,
    ) -> None:
        body = bytes(max(body_size, TIMESTAMP.size))
        encoded = [
            encode_publish(channel, exchange, key, body, persistent, frame_max)
            for key in routing_keys
        ]
        per_round = sum(len(msg) for msg, _ in encoded)
        rounds = max(1, batch_bytes // per_round)
        template = bytearray()
        offsets: list[int] = []
        ends: list[int] = []
        for _ in range(rounds):
            for msg, body_offset in encoded:
                offsets.append(len(template) + body_offset)
                template += msg
                ends.append(len(template))
        self.template = template
        self._offsets = offsets
        self._ends = ends
        self.size = len(offsets)

    def stamp(self, count: int, now_ns: int) -> bytes:
        """The first `count` messages stamped with `now_ns`, as bytes ready to write."""
        template = self.template
        pack_into = TIMESTAMP.pack_into
        for offset in self._offsets[:count]:
            pack_into(template, offset, now_ns)
        return bytes(template[: self._ends[count - 1]])
