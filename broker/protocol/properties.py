"""Content-header properties as raw bytes, without recursion and in linear time.

A message keeps the property block its publisher sent (broker/message.py); these functions are
what reads and rewrites it:

- `check_properties` walks a whole block once and raises `MalformedProperties` for one that
  does not parse, `TableTooDeep` for field tables or arrays nested deeper than MAX_TABLE_DEPTH.
  The channel runs it on every publish that carries more than a delivery mode, so every message
  the broker stores can be decoded by every later path (dead-lettering, the headers exchange,
  CC/BCC, the management API): RabbitMQ decodes each publish's properties too.
- `decode_properties` / `decode_table` build pamqp's Properties and plain dicts with an explicit
  stack, so a table costs time in proportion to its size (pamqp's decoder slices the remaining
  buffer at each field: quadratic, 0.3 s for one 128 KiB table) and depth costs no Python stack.
- `rewrite_properties` gives a copy of a block with some header fields removed or added and some
  short-string properties set, copying every other byte as it came (dead-lettering's x-death,
  BCC removal, direct reply-to): what a client sent is never decoded and encoded again.

Field value types are pamqp's (RabbitMQ's plus 'L'), decoded to the same Python values."""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from pamqp import commands
from pamqp import encode as pamqp_encode

__all__ = [
    "MAX_TABLE_DEPTH",
    "MalformedProperties",
    "TableTooDeep",
    "append_header",
    "check_properties",
    "decode_properties",
    "decode_table",
    "encode_field_value",
    "rewrite_properties",
    "short_string",
]

MAX_TABLE_DEPTH = 64
"""Tables and arrays inside a headers table, counting the headers table itself."""


class MalformedProperties(ValueError):
    """The property block does not parse (a truncated field, an unknown type, bad lengths)."""


class TableTooDeep(ValueError):
    """Field tables or arrays nested deeper than the limit."""


# property flag bits in order, with the kind of each value: s shortstr, t table, o octet,
# q timestamp (8 bytes)
_PROPERTIES = (
    ("content_type", 0x8000, "s"),
    ("content_encoding", 0x4000, "s"),
    ("headers", 0x2000, "t"),
    ("delivery_mode", 0x1000, "o"),
    ("priority", 0x0800, "o"),
    ("correlation_id", 0x0400, "s"),
    ("reply_to", 0x0200, "s"),
    ("expiration", 0x0100, "s"),
    ("message_id", 0x0080, "s"),
    ("timestamp", 0x0040, "q"),
    ("message_type", 0x0020, "s"),
    ("user_id", 0x0010, "s"),
    ("app_id", 0x0008, "s"),
    ("cluster_id", 0x0004, "s"),
)
_HEADERS = 0x2000
_BY_NAME = {name: (bit, kind) for name, bit, kind in _PROPERTIES}

# fixed-size field values: type tag -> size
_FIXED = {
    ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4, ord("i"): 4,
    ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8, ord("D"): 5, ord("T"): 8, ord("V"): 0,
}
_S, _X, _A, _F = ord("S"), ord("x"), ord("A"), ord("F")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_UNPACK = {
    ord("b"): struct.Struct(">b").unpack_from, ord("B"): struct.Struct(">B").unpack_from,
    ord("s"): struct.Struct(">h").unpack_from, ord("u"): struct.Struct(">H").unpack_from,
    ord("I"): struct.Struct(">i").unpack_from, ord("i"): struct.Struct(">I").unpack_from,
    ord("l"): struct.Struct(">q").unpack_from, ord("L"): struct.Struct(">q").unpack_from,
    ord("f"): struct.Struct(">f").unpack_from, ord("d"): struct.Struct(">d").unpack_from,
}
_DECIMAL = struct.Struct(">Bi")
_TIMESTAMP = struct.Struct(">Q")


# -- the walk ----------------------------------------------------------------------------------
def _flags(props: bytes) -> tuple[int, int]:
    """The first flag word and where the property list starts. Continuation words (bit 0) carry
    no property in 0-9-1 and are skipped."""
    if len(props) < 2:
        raise MalformedProperties("property flags are truncated")
    flags = props[0] << 8 | props[1]
    pos = 2
    word = flags
    while word & 1:
        if len(props) < pos + 2:
            raise MalformedProperties("property flags are truncated")
        word = props[pos] << 8 | props[pos + 1]
        pos += 2
    return flags, pos


def _spans(props: bytes, max_depth: int) -> dict[int, tuple[int, int]]:
    """flag bit -> (start, end) of each property present; checks every byte on the way."""
    flags, pos = _flags(props)
    end = len(props)
    spans: dict[int, tuple[int, int]] = {}
    for _, bit, kind in _PROPERTIES:
        if not flags & bit:
            continue
        start = pos
        if kind == "s":
            if pos >= end:
                raise MalformedProperties("a short string property is truncated")
            pos += 1 + props[pos]
        elif kind == "o":
            pos += 1
        elif kind == "q":
            pos += 8
        else:
            pos = _skip_table(props, pos, end, max_depth)
        if pos > end:
            raise MalformedProperties("a property is truncated")
        spans[bit] = (start, pos)
    return spans


def _container_end(buf: bytes, pos: int, limit: int) -> int:
    if pos + 4 > limit:
        raise MalformedProperties("a table or array length is truncated")
    end = pos + 4 + _U32.unpack_from(buf, pos)[0]
    if end > limit:
        raise MalformedProperties("a table or array is longer than what holds it")
    return end


def _skip_table(buf: bytes, pos: int, limit: int, max_depth: int) -> int:
    """Check the field table at `pos` (its 4-byte length) and return the offset after it."""
    end = _container_end(buf, pos, limit)
    stack = [(end, True)]  # open containers: their end, and whether their fields have names
    pos += 4
    while stack:
        end, named = stack[-1]
        if pos == end:
            stack.pop()
            continue
        if named:
            pos += 1 + buf[pos]
            if pos >= end:
                raise MalformedProperties("a table field has no value")
        tag = buf[pos]
        pos += 1
        size = _FIXED.get(tag)
        if size is not None:
            pos += size
        elif tag in (_S, _X):
            pos = _container_end(buf, pos, end)
        elif tag in (_A, _F):
            if len(stack) >= max_depth:
                raise TableTooDeep(f"field tables nested deeper than {max_depth} levels")
            inner = _container_end(buf, pos, end)
            stack.append((inner, tag == _F))
            pos += 4
            continue
        else:
            raise MalformedProperties(f"unknown field type {bytes((tag,))!r}")
        if pos > end:
            raise MalformedProperties("a field value is truncated")
    return pos


def _checked_spans(props: bytes, max_depth: int = 1 << 30) -> dict[int, tuple[int, int]]:
    try:
        return _spans(props, max_depth)
    except IndexError as exc:  # a length byte past the end
        raise MalformedProperties("a property is truncated") from exc


def check_properties(props: bytes, max_depth: int = MAX_TABLE_DEPTH) -> None:
    """Raise MalformedProperties or TableTooDeep unless the block decodes."""
    _checked_spans(props, max_depth)


# -- decoding ----------------------------------------------------------------------------------
def _text(raw: bytes) -> str | bytes:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw  # as pamqp: a longstr that is not UTF-8 stays bytes


def _scalar(buf: bytes, tag: int, pos: int) -> tuple[Any, int]:
    unpack = _UNPACK.get(tag)
    if unpack is not None:
        return unpack(buf, pos)[0], pos + _FIXED[tag]
    if tag == ord("t"):
        return bool(buf[pos]), pos + 1
    if tag == ord("V"):
        return None, pos
    if tag == ord("D"):
        places, raw = _DECIMAL.unpack_from(buf, pos)
        return decimal.Decimal(raw) * (decimal.Decimal(10) ** -places), pos + 5
    if tag == ord("T"):
        ts: float = _TIMESTAMP.unpack_from(buf, pos)[0]
        if ts > 0xFFFFFFFF:  # as pamqp: likely milliseconds
            ts /= 1000.0
        return datetime.datetime.fromtimestamp(ts, tz=datetime.UTC), pos + 8
    end = pos + 4 + _U32.unpack_from(buf, pos)[0]
    if tag == _S:
        return _text(buf[pos + 4 : end]), end
    return bytearray(buf[pos + 4 : end]), end  # 'x'


def decode_table(buf: bytes, pos: int = 0) -> dict[str, Any]:
    """The field table at `pos` (its 4-byte length) as a dict; any depth, linear time. The
    table must have been checked (check_properties): this does not re-validate lengths."""
    end = pos + 4 + _U32.unpack_from(buf, pos)[0]
    root: dict[str, Any] = {}
    # open containers: (end, the dict or list being filled)
    stack: list[tuple[int, Any]] = [(end, root)]
    pos += 4
    while stack:
        end, into = stack[-1]
        if pos >= end:
            stack.pop()
            continue
        key = None
        if isinstance(into, dict):
            n = buf[pos]
            key = buf[pos + 1 : pos + 1 + n].decode(errors="surrogateescape")
            pos += 1 + n
        tag = buf[pos]
        pos += 1
        if tag in (_A, _F):
            value: Any = [] if tag == _A else {}
            stack.append((pos + 4 + _U32.unpack_from(buf, pos)[0], value))
            pos += 4
        else:
            value, pos = _scalar(buf, tag, pos)
        if key is None:
            into.append(value)
        else:
            into[key] = value
    return root


def decode_properties(props: bytes) -> commands.Basic.Properties:
    """pamqp's Properties for a checked block (without pamqp's validation, which refuses values
    RabbitMQ passes on, such as delivery_mode 3)."""
    p = commands.Basic.Properties()
    spans = _checked_spans(props)
    for name, bit, kind in _PROPERTIES:
        span = spans.get(bit)
        if span is None:
            continue
        start, end = span
        if kind == "s":
            value: Any = props[start + 1 : end].decode(errors="surrogateescape")
        elif kind == "o":
            value = props[start]
        elif kind == "q":
            value, _ = _scalar(props, ord("T"), start)
        else:
            value = decode_table(props, start)
        setattr(p, name, value)
    return p


def short_string(props: bytes, name: str) -> str | None:
    """One short-string property of a checked block (pamqp's name: "expiration", ...), without
    decoding the others."""
    bit, kind = _BY_NAME[name]
    if kind != "s":
        raise ValueError(f"{name} is not a short string property")
    span = _checked_spans(props).get(bit)
    if span is None:
        return None
    return props[span[0] + 1 : span[1]].decode(errors="surrogateescape")


# -- rewriting ---------------------------------------------------------------------------------
def encode_field_value(value: Any) -> bytes:
    """Type tag and bytes of one field value the broker itself makes (x-death and friends)."""
    return pamqp_encode.encode_table_value(value)


def _table_fields(props: bytes, start: int, end: int) -> list[tuple[bytes, int, int]]:
    """(raw name, start, end) of each field of the checked table at `start`."""
    fields = []
    pos = start + 4
    while pos < end:
        n = props[pos]
        value_end = _field_end(props, pos + 1 + n)
        fields.append((props[pos + 1 : pos + 1 + n], pos, value_end))
        pos = value_end
    return fields


def _field_end(buf: bytes, pos: int) -> int:
    """The end of the field value at `pos` (its type tag)."""
    tag = buf[pos]
    size = _FIXED.get(tag)
    if size is not None:
        return pos + 1 + size
    return pos + 1 + 4 + _U32.unpack_from(buf, pos + 1)[0]


def append_header(props: bytes, name: bytes, value: bytes) -> bytes:
    """`props` with the header field `name` (its shortstr bytes, without the length) set to
    `value` (encode_field_value bytes) at the end of the headers table: what a stream stamps
    on every message it appends (x-stream-offset). Without a continuation word or a field of
    that name already there, the block is spliced without being walked: a block with no
    headers gets a table after content_type and content_encoding, one with headers gets the
    field at the end of its table. Else rewrite_properties does it."""
    if len(props) < 2:
        props = b"\x00\x00"  # no property at all
    if props[1] & 1 or name in props:
        return rewrite_properties(props, add_headers={name.decode(): value})
    field = bytes((len(name),)) + name + value
    pos = 2
    if props[0] & 0x80:  # content_type
        pos += 1 + props[pos]
    if props[0] & 0x40:  # content_encoding
        pos += 1 + props[pos]
    if pos > len(props):
        raise MalformedProperties("a short string property is truncated")
    if not props[0] & 0x20:
        return b"".join((bytes((props[0] | 0x20, props[1])), props[2:pos],
                         _U32.pack(len(field)), field, props[pos:]))
    size = _U32.unpack_from(props, pos)[0]
    end = pos + 4 + size
    if end > len(props):
        raise MalformedProperties("the headers table is truncated")
    return b"".join((props[:pos], _U32.pack(size + len(field)), props[pos + 4:end], field,
                     props[end:]))


def rewrite_properties(
    props: bytes,
    *,
    drop_headers: Iterable[str] = (),
    add_headers: Mapping[str, bytes] | None = None,
    replace: Mapping[str, str | None] | None = None,
) -> bytes:
    """A copy of the checked block `props` whose headers table lacks the fields named in
    `drop_headers` and ends with those of `add_headers` (name -> encode_field_value bytes),
    and whose short-string properties named in `replace` (pamqp's names: reply_to,
    expiration, ...) are set to the given text, or removed for None. Every other byte is
    copied as it came."""
    add = add_headers or {}
    replace = replace or {}
    flags, body_start = _flags(props)
    spans = _checked_spans(props)
    new: dict[int, bytes] = {}
    if add or drop_headers:
        gone = {name.encode() for name in drop_headers} | {name.encode() for name in add}
        fields: list[bytes] = []
        if _HEADERS in spans:
            start, end = spans[_HEADERS]
            fields = [props[a:b] for name, a, b in _table_fields(props, start, end)
                      if name not in gone]
        for name, value in add.items():
            raw = name.encode()
            fields.append(bytes((len(raw),)) + raw + value)
        if fields or _HEADERS in spans:
            table = b"".join(fields)
            new[_HEADERS] = _U32.pack(len(table)) + table
            flags |= _HEADERS
    for name, text in replace.items():
        bit, kind = _BY_NAME[name]
        if kind != "s":
            raise ValueError(f"{name} is not a short string property")
        if text is None:
            flags &= ~bit
        else:
            raw = text.encode()
            if len(raw) > 255:
                raise ValueError(f"{name} longer than 255 bytes")
            new[bit] = bytes((len(raw),)) + raw
            flags |= bit
    out = [_U16.pack(flags), props[2:body_start]]  # continuation words as they were
    for _, bit, _kind in _PROPERTIES:
        if flags & bit:
            part = new.get(bit)
            if part is None:
                a, b = spans[bit]
                part = props[a:b]
            out.append(part)
    return b"".join(out)
