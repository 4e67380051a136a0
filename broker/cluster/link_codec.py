"""The inter-node link's frames, bytes in and out (no I/O here).

A frame is `length (u32) | kind (u8) | payload`, length counting kind and payload. Messages
travel in batches: one PUBLISH frame carries every message a channel routed to one remote
queue in one batch, one DELIVER frame every message a queue delivered to one remote consumer
in one wake-up. Control frames (confirms, credit, subscriptions, acks, RPCs) are JSON: they
come once per batch, not per message."""

from __future__ import annotations

import json
import struct
from typing import Any

__all__ = [
    "CONTROL",
    "DELIVER",
    "HEADER",
    "PUBLISH",
    "decode_deliver",
    "decode_publish",
    "encode_control",
    "encode_deliver",
    "encode_publish",
]

HEADER = struct.Struct(">IB")
PUBLISH = 1  # sender id, vhost, queue, [(seq, exchange, routing key, props, body)]
DELIVER = 2  # consumer id, [(queue seq, redelivered, exchange, routing key, props, body)]
CONTROL = 3  # a JSON object with "op"

_PUB_HEAD = struct.Struct(">II")  # sender id, count
_PUB_ITEM = struct.Struct(">QII")  # seq, props length, body length
_DEL_HEAD = struct.Struct(">II")  # consumer id, count
_DEL_ITEM = struct.Struct(">Q?II")  # queue seq, redelivered, props length, body length

Item = tuple[int, str, str, bytes, bytes]


def _names(*names: str) -> bytes:
    out = bytearray()
    for name in names:
        raw = name.encode()
        out += len(raw).to_bytes(2, "big") + raw
    return bytes(out)


def _read_name(buf: memoryview, pos: int) -> tuple[str, int]:
    n = int.from_bytes(buf[pos:pos + 2], "big")
    pos += 2
    return bytes(buf[pos:pos + n]).decode(), pos + n


def _frame(kind: int, parts: list[bytes]) -> list[bytes]:
    size = 1 + sum(len(p) for p in parts)
    return [HEADER.pack(size, kind), *parts]


def encode_publish(sender: int, vhost: str, queue: str, items: list[Item]) -> list[bytes]:
    parts = [_PUB_HEAD.pack(sender, len(items)), _names(vhost, queue)]
    for seq, exchange, routing_key, props, body in items:
        parts += [_PUB_ITEM.pack(seq, len(props), len(body)), _names(exchange, routing_key),
                  props, body]
    return _frame(PUBLISH, parts)


def decode_publish(payload: bytes) -> tuple[int, str, str, list[Item]]:
    buf = memoryview(payload)
    sender, count = _PUB_HEAD.unpack_from(buf, 0)
    vhost, pos = _read_name(buf, _PUB_HEAD.size)
    queue, pos = _read_name(buf, pos)
    items: list[Item] = []
    for _ in range(count):
        seq, props_len, body_len = _PUB_ITEM.unpack_from(buf, pos)
        exchange, pos = _read_name(buf, pos + _PUB_ITEM.size)
        routing_key, pos = _read_name(buf, pos)
        props = bytes(buf[pos:pos + props_len])
        pos += props_len
        body = bytes(buf[pos:pos + body_len])
        pos += body_len
        items.append((seq, exchange, routing_key, props, body))
    return sender, vhost, queue, items


DeliverItem = tuple[int, bool, str, str, bytes, bytes]


def encode_deliver(consumer: int, items: list[DeliverItem]) -> list[bytes]:
    parts = [_DEL_HEAD.pack(consumer, len(items))]
    for seq, redelivered, exchange, routing_key, props, body in items:
        parts += [_DEL_ITEM.pack(seq, redelivered, len(props), len(body)),
                  _names(exchange, routing_key), props, body]
    return _frame(DELIVER, parts)


def decode_deliver(payload: bytes) -> tuple[int, list[DeliverItem]]:
    buf = memoryview(payload)
    consumer, count = _DEL_HEAD.unpack_from(buf, 0)
    pos = _DEL_HEAD.size
    items: list[DeliverItem] = []
    for _ in range(count):
        seq, redelivered, props_len, body_len = _DEL_ITEM.unpack_from(buf, pos)
        exchange, pos = _read_name(buf, pos + _DEL_ITEM.size)
        routing_key, pos = _read_name(buf, pos)
        props = bytes(buf[pos:pos + props_len])
        pos += props_len
        body = bytes(buf[pos:pos + body_len])
        pos += body_len
        items.append((seq, redelivered, exchange, routing_key, props, body))
    return consumer, items


def encode_control(message: dict[str, Any]) -> list[bytes]:
    return _frame(CONTROL, [json.dumps(message, separators=(",", ":")).encode()])
