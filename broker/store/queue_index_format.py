"""The on-disk format of queue index segment files. Pure functions: bytes in, entries out.

A queue index directory holds one file per segment of `segment_entries` seq ids, named
``<segment number>.hqi``. Each file is a 20-byte header followed by records::

    file header : magic "HQIX" | version u16 | reserved u16 | segment_entries u32 | number u64
    record      : crc32 u32 | body length u32 | type u8 | body
      PUB_REF   1 : seq_id u64 | msg_id u128 | flags u8            (body in the msg_store)
      PUB_EMBED 2 : seq_id u64 | msg_id u128 | flags u8 | payload  (Message.encode() bytes)
      DELIVER   3 : n x offset-in-segment u32
      ACK       4 : n x offset-in-segment u32

flags bit 0 is "delivered" (a publish delivered before it was flushed costs one record). The CRC
covers length, type and body, so a scan tells a torn tail (a short or failing last record) from a
damaged record in the middle, after which it re-synchronises on the next record that checks out.
Records only ever describe seq ids of their own segment: a record that does not is damage."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

__all__ = [
    "FILE_HEADER_SIZE",
    "FORMAT_VERSION",
    "PUB_RECORD_SIZE",
    "REC_ACK",
    "REC_DELIVER",
    "REC_PUB_EMBED",
    "REC_PUB_REF",
    "SEGMENT_MAGIC",
    "SEGMENT_SUFFIX",
    "BadHeader",
    "SegmentScan",
    "encode_header",
    "encode_offsets",
    "encode_pub",
    "parse_header",
    "pub_at",
    "record_size",
    "scan_segment",
    "segment_file_name",
    "segment_file_number",
]

SEGMENT_SUFFIX = ".hqi"
SEGMENT_MAGIC = b"HQIX"
FORMAT_VERSION = 1

REC_PUB_REF = 1
REC_PUB_EMBED = 2
REC_DELIVER = 3
REC_ACK = 4
_TYPE_BYTES = (b"\x01", b"\x02", b"\x03", b"\x04")

FLAG_DELIVERED = 1

_HEADER = struct.Struct(">4sHHIQ")
FILE_HEADER_SIZE = _HEADER.size  # 20
PUB_RECORD_SIZE = 9 + 25  # a PUB record without payload
_CRC = struct.Struct(">I")
_REC_HEAD = struct.Struct(">IIB")  # crc, body length, type
_REC_HEAD_SIZE = _REC_HEAD.size  # 9
_PUB = struct.Struct(">IBQQQB")  # body length, type, seq_id, msg_id hi, msg_id lo, flags
_PUB_BODY = struct.Struct(">QQQB")
_PUB_BODY_SIZE = _PUB_BODY.size  # 25
_M64 = (1 << 64) - 1
_TYPE_AT = _CRC.size + 4  # offset of the type byte inside a record


class BadHeader(ValueError):
    """A file whose header is not a queue index segment header we can read."""


def segment_file_name(number: int) -> str:
    return f"{number:010d}{SEGMENT_SUFFIX}"


def segment_file_number(name: str) -> int | None:
    """The segment number of a segment file name, None for anything else."""
    stem, dot, suffix = name.partition(".")
    if not dot or "." + suffix != SEGMENT_SUFFIX or not stem.isdigit():
        return None
    return int(stem)


def encode_header(number: int, segment_entries: int) -> bytes:
    return _HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0, segment_entries, number)


def parse_header(buf: bytes) -> tuple[int, int]:
    """(segment number, segment_entries) from a file header; BadHeader if it is not ours."""
    if len(buf) < FILE_HEADER_SIZE:
        raise BadHeader(f"file shorter than its header ({len(buf)} bytes)")
    magic, version, _, entries, number = _HEADER.unpack_from(buf)
    if magic != SEGMENT_MAGIC:
        raise BadHeader(f"bad magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise BadHeader(f"unknown format version {version}")
    if entries <= 0:
        raise BadHeader(f"bad segment_entries {entries}")
    return number, entries


def encode_pub(
    out: bytearray, seq_id: int, msg_id: int, payload: bytes | None, delivered: bool
) -> None:
    """Append one publish record to `out`."""
    flags = FLAG_DELIVERED if delivered else 0
    if payload is None:
        tail = _PUB.pack(_PUB_BODY_SIZE, REC_PUB_REF, seq_id, msg_id >> 64, msg_id & _M64, flags)
        out += _CRC.pack(zlib.crc32(tail))
        out += tail
    else:
        tail = _PUB.pack(
            _PUB_BODY_SIZE + len(payload),
            REC_PUB_EMBED,
            seq_id,
            msg_id >> 64,
            msg_id & _M64,
            flags,
        )
        out += _CRC.pack(zlib.crc32(payload, zlib.crc32(tail)))
        out += tail
        out += payload


def encode_offsets(out: bytearray, rtype: int, offsets: list[int]) -> None:
    """Append one DELIVER or ACK record covering `offsets` (positions within the segment)."""
    body = struct.pack(f">{len(offsets)}I", *offsets)
    tail = struct.pack(">IB", len(body), rtype)
    out += _CRC.pack(zlib.crc32(body, zlib.crc32(tail)))
    out += tail
    out += body


@dataclass(slots=True)
class SegmentScan:
    """What one segment file holds once its records are replayed."""

    number: int
    segment_entries: int
    entries: dict[int, tuple[int, bytes | None]] = field(default_factory=dict)  # offset -> ids
    delivered: set[int] = field(default_factory=set)  # offsets of live delivered entries
    positions: dict[int, int] = field(default_factory=dict)  # offset -> file position of its PUB
    max_seq: int = -1  # highest seq_id published in this file, acked or not
    good_end: int = FILE_HEADER_SIZE  # end of the last good record: where a torn tail is cut
    torn_bytes: int = 0  # bytes after the last good record that form no record
    corrupt: list[tuple[int, int]] = field(default_factory=list)  # (offset, length) skipped


def _record_at(buf: bytes, pos: int, n: int, base: int, entries: int) -> tuple[int, int] | None:
    """(type, end) if a record that checks out starts at pos, else None."""
    if n - pos < _REC_HEAD_SIZE:
        return None
    crc, length, rtype = _REC_HEAD.unpack_from(buf, pos)
    end = pos + _REC_HEAD_SIZE + length
    if end > n or not REC_PUB_REF <= rtype <= REC_ACK:
        return None
    if rtype == REC_PUB_REF and length != _PUB_BODY_SIZE:
        return None
    if rtype == REC_PUB_EMBED and length < _PUB_BODY_SIZE:
        return None
    if rtype >= REC_DELIVER and length % 4:
        return None
    if zlib.crc32(buf[pos + _CRC.size : end]) != crc:
        return None
    if rtype <= REC_PUB_EMBED:
        seq = struct.unpack_from(">Q", buf, pos + _REC_HEAD_SIZE)[0]
        if not base <= seq < base + entries:
            return None
    return rtype, end


def _resync(buf: bytes, pos: int, n: int, base: int, entries: int) -> int:
    """The offset of the next record at or after pos that checks out, -1 if there is none."""
    probe = pos + _TYPE_AT
    while True:
        hits = [i for i in (buf.find(t, probe) for t in _TYPE_BYTES) if i >= 0]
        if not hits:
            return -1
        cand = min(hits) - _TYPE_AT
        if _record_at(buf, cand, n, base, entries) is not None:
            return cand
        probe = cand + _TYPE_AT + 1


def scan_segment(buf: bytes) -> SegmentScan:
    """Replay a segment file image. A failing record followed by good ones is skipped and
    reported as corrupt (trying its own length first, then searching); failing bytes with no
    good record after them are the torn tail. Raises BadHeader for a header that is not ours."""
    number, seg_entries = parse_header(buf)
    scan = SegmentScan(number, seg_entries)
    base = number * seg_entries
    entries, delivered, positions = scan.entries, scan.delivered, scan.positions
    n = len(buf)
    pos = FILE_HEADER_SIZE
    unpack_pub = _PUB_BODY.unpack_from
    while pos < n:
        rec = _record_at(buf, pos, n, base, seg_entries)
        if rec is None:
            nxt = _skip_damage(buf, pos, n, base, seg_entries)
            if nxt < 0:
                break
            scan.corrupt.append((pos, nxt - pos))
            pos = nxt
            continue
        rtype, end = rec
        body = pos + _REC_HEAD_SIZE
        if rtype <= REC_PUB_EMBED:
            seq, hi, lo, flags = unpack_pub(buf, body)
            rel = seq - base
            payload = buf[body + _PUB_BODY_SIZE : end] if rtype == REC_PUB_EMBED else None
            entries[rel] = (hi << 64 | lo, payload)
            positions[rel] = pos
            if flags & FLAG_DELIVERED:
                delivered.add(rel)
            else:
                delivered.discard(rel)
            if seq > scan.max_seq:
                scan.max_seq = seq
        else:
            count = (end - body) // 4
            offsets = struct.unpack_from(f">{count}I", buf, body)
            if rtype == REC_DELIVER:
                delivered.update(o for o in offsets if o in entries)
            else:
                for o in offsets:
                    entries.pop(o, None)
                    positions.pop(o, None)
                    delivered.discard(o)
        pos = scan.good_end = end
    scan.torn_bytes = n - pos if pos < n else 0
    return scan


def _skip_damage(buf: bytes, pos: int, n: int, base: int, entries: int) -> int:
    """Where good records resume after a failing one at pos, -1 if none follows (torn tail)."""
    if n - pos >= _REC_HEAD_SIZE:  # trust the length field first (damage inside a body)
        length: int = _CRC.unpack_from(buf, pos + _CRC.size)[0]
        skip = pos + _REC_HEAD_SIZE + length
        if skip < n and _record_at(buf, skip, n, base, entries) is not None:
            return skip
    return _resync(buf, pos + 1, n, base, entries)


def pub_at(buf: bytes, pos: int, base: int, entries: int) -> tuple[int, int, bytes | None] | None:
    """(seq_id, msg_id, payload) of the PUB record at `pos` of a segment image (`buf` may be a
    piece that starts at the record), or None if no PUB record that checks out is there."""
    n = len(buf)
    rec = _record_at(buf, pos, n, base, entries)
    if rec is None or rec[0] > REC_PUB_EMBED:
        return None
    rtype, end = rec
    body = pos + _REC_HEAD_SIZE
    seq, hi, lo, _ = _PUB_BODY.unpack_from(buf, body)
    payload = buf[body + _PUB_BODY_SIZE : end] if rtype == REC_PUB_EMBED else None
    return seq, hi << 64 | lo, payload


def record_size(head: bytes) -> int:
    """The whole size of the record whose first 9 bytes (or more) are `head`."""
    length: int = _CRC.unpack_from(head, _CRC.size)[0]
    return _REC_HEAD_SIZE + length
