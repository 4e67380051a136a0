"""The inter-node link's frames, bytes in and out (no I/O here).

A frame is `length (u32) | kind (u8) | payload`, length counting kind and payload. Messages
travel in batches: one PUBLISH frame carries every message a channel routed to one remote
queue in one batch, one DELIVER frame every message a queue delivered to one remote consumer
in one wake-up, one LOG frame one batch of a quorum queue's replicated log (its leader's turn,
broker/queue/quorum_log.py) or a piece of a copy of the queue to a member. Control frames
(confirms, credit, subscriptions, acks, RPCs, log positions) are JSON: they come once per
batch, not per message."""

from __future__ import annotations

import json
import struct
from typing import Any

from broker.queue.quorum_log import OP_ACK, OP_COUNT, OP_PUB, Op

__all__ = [
    "CONTROL",
    "DELIVER",
    "HEADER",
    "LOG",
    "LOG_BATCH",
    "LOG_COPY",
    "LOG_COPY_BEGIN",
    "PUBLISH",
    "decode_deliver",
    "decode_log",
    "decode_publish",
    "encode_control",
    "encode_deliver",
    "encode_log",
    "encode_publish",
]

HEADER = struct.Struct(">IB")
PUBLISH = 1  # sender id, vhost, queue, [(seq, exchange, routing key, props, body)]
DELIVER = 2  # consumer id, [(queue seq, redelivered, exchange, routing key, props, body)]
CONTROL = 3  # a JSON object with "op"
LOG = 4  # epoch, position, kind, vhost, queue, [operation]: a quorum queue's log

# what a LOG frame is: a batch of the leader's, the first piece of a copy of the queue to a
# member (the member forgets its delivery states first), or a further piece
LOG_BATCH = 0
LOG_COPY_BEGIN = 1
LOG_COPY = 2

_PUB_HEAD = struct.Struct(">II")  # sender id, count
_PUB_ITEM = struct.Struct(">QII")  # seq, props length, body length
_DEL_HEAD = struct.Struct(">II")  # consumer id, count
_DEL_ITEM = struct.Struct(">Q?II")  # queue seq, redelivered, props length, body length

_LOG_HEAD = struct.Struct(">QQBI")  # epoch, position, kind, operation count
_OP_PUB = struct.Struct(">BQQQI")  # OP_PUB, seq, msg_id hi, msg_id lo, data length
_OP_LIST = struct.Struct(">BI")  # OP_ACK / OP_COUNT, count
_M64 = (1 << 64) - 1

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


def encode_log(epoch: int, pos: int, kind: int, vhost: str, queue: str,
               ops: list[Op]) -> list[bytes]:
    """One LOG frame: the operations of broker/queue/quorum_log.py, packed."""
    parts = [_LOG_HEAD.pack(epoch, pos, kind, len(ops)), _names(vhost, queue)]
    for op in ops:
        code = op[0]
        if code == OP_PUB:
            _, seq, msg_id, data = op
            parts += [_OP_PUB.pack(OP_PUB, seq, msg_id >> 64, msg_id & _M64, len(data)), data]
        elif code == OP_ACK:
            seqs = op[1]
            parts += [_OP_LIST.pack(OP_ACK, len(seqs)), struct.pack(f">{len(seqs)}Q", *seqs)]
        else:
            pairs = op[1]
            flat = [x for pair in pairs for x in pair]
            parts += [_OP_LIST.pack(OP_COUNT, len(pairs)),
                      struct.pack(">" + "QI" * len(pairs), *flat)]
    return _frame(LOG, parts)


def decode_log(payload: bytes) -> tuple[int, int, int, str, str, list[Op]]:
    """(epoch, position, kind, vhost, queue, operations) of a LOG frame."""
    buf = memoryview(payload)
    epoch, pos, kind, count = _LOG_HEAD.unpack_from(buf, 0)
    vhost, at = _read_name(buf, _LOG_HEAD.size)
    queue, at = _read_name(buf, at)
    ops: list[Op] = []
    for _ in range(count):
        code = buf[at]
        if code == OP_PUB:
            _, seq, hi, lo, size = _OP_PUB.unpack_from(buf, at)
            at += _OP_PUB.size
            ops.append((OP_PUB, seq, hi << 64 | lo, bytes(buf[at:at + size])))
            at += size
        elif code == OP_ACK:
            _, n = _OP_LIST.unpack_from(buf, at)
            at += _OP_LIST.size
            ops.append((OP_ACK, list(struct.unpack_from(f">{n}Q", buf, at))))
            at += 8 * n
        elif code == OP_COUNT:
            _, n = _OP_LIST.unpack_from(buf, at)
            at += _OP_LIST.size
            flat = struct.unpack_from(">" + "QI" * n, buf, at)
            ops.append((OP_COUNT, list(zip(flat[::2], flat[1::2], strict=True))))
            at += 12 * n
        else:
            raise ValueError(f"unknown log operation {code}")
    return epoch, pos, kind, vhost, queue, ops
