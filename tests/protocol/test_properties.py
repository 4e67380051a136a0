"""broker.protocol.properties: the publish-time check, the linear decoder (against pamqp's) and
header rewriting that copies what it does not change."""

from __future__ import annotations

import datetime
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from broker.protocol.properties import (
    MAX_TABLE_DEPTH,
    MalformedProperties,
    TableTooDeep,
    append_header,
    check_properties,
    decode_properties,
    decode_table,
    encode_field_value,
    rewrite_properties,
)


def nested(depth: int, arrays: bool = False) -> bytes:
    """A headers table whose single field holds tables (or arrays) `depth` levels deep in all,
    counting the headers table."""
    inner = b""
    for _ in range(depth - 1):
        if arrays:
            inner = b"A" + struct.pack(">I", len(inner)) + inner
        else:
            inner = b"F" + struct.pack(">I", len(inner) + 2 if inner else 0) + (
                b"\x01a" + inner if inner else b"")
    field = b"\x01a" + (inner or b"V")
    return struct.pack(">I", len(field)) + field


def with_headers(table: bytes) -> bytes:
    return b"\x20\x00" + table


scalars = st.one_of(
    st.booleans(), st.integers(-(2**31), 2**31 - 1), st.text(max_size=20), st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.datetimes(min_value=datetime.datetime(1971, 1, 1), max_value=datetime.datetime(2100, 1, 1),
                 timezones=st.just(datetime.UTC)).map(lambda d: d.replace(microsecond=0)),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(
    headers=st.dictionaries(st.text(max_size=10), values, max_size=6),
    content_type=st.none() | st.text(max_size=10),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    expiration=st.none() | st.from_regex(r"[0-9]{1,6}", fullmatch=True),
)
def test_decodes_what_pamqp_encodes_as_pamqp_does(headers, content_type, delivery_mode,
                                                   expiration):
    p = commands.Basic.Properties(headers=headers or None, content_type=content_type,
                                  delivery_mode=delivery_mode, expiration=expiration,
                                  message_id="m-1", timestamp=datetime.datetime(
                                      2024, 5, 1, tzinfo=datetime.UTC))
    raw = p.marshal()
    check_properties(raw)
    ours = decode_properties(raw)
    theirs = commands.Basic.Properties()
    theirs.unmarshal(int.from_bytes(raw[:2], "big"), raw[2:])
    for name in theirs.__slots__:
        assert getattr(ours, name) == getattr(theirs, name), name


def test_depth_limit_counts_the_headers_table():
    check_properties(with_headers(nested(MAX_TABLE_DEPTH)))
    check_properties(with_headers(nested(MAX_TABLE_DEPTH, arrays=True)))
    with pytest.raises(TableTooDeep):
        check_properties(with_headers(nested(MAX_TABLE_DEPTH + 1)))
    with pytest.raises(TableTooDeep):
        check_properties(with_headers(nested(MAX_TABLE_DEPTH + 1, arrays=True)))


def test_any_depth_decodes_without_recursion():
    table = nested(14000)
    got = decode_table(table)
    depth = 0
    while isinstance(got, dict):
        depth += 1
        if not got:
            break
        got = got["a"]
    assert depth == 14000


@pytest.mark.parametrize("props", [
    b"\x20",  # flags cut
    b"\x20\x00\x00\x00\x00\x09\x01a",  # table longer than the block
    b"\x20\x00\x00\x00\x00\x03\x01aZ",  # unknown type tag
    b"\x20\x00\x00\x00\x00\x04\x01aS\x00",  # longstr length cut
    b"\x80\x00",  # content_type flag, no string
    b"\x80\x00\x05abc",  # short string cut
    b"\x00\x40\x00\x00",  # timestamp cut
    b"\x20\x00\x00\x00\x00\x02\x05a",  # field name longer than its table
])
def test_malformed_blocks_are_refused(props):
    with pytest.raises(MalformedProperties):
        check_properties(props)


def test_decoding_a_max_size_table_is_linear():
    """26,000 fields in 128 KiB: pamqp's slicing decoder takes about 0.3 s for it."""
    fields = b"".join(b"\x03" + bytes((48 + i % 64, 48 + i // 64 % 64, 48 + i // 4096))
                      + b"V" for i in range(26000))
    table = struct.pack(">I", len(fields)) + fields
    t0 = time.process_time()
    got = decode_table(table)
    assert len(got) == 26000
    assert time.process_time() - t0 < 0.25  # generous: about 20 ms here


def test_rewrite_copies_everything_else_byte_for_byte():
    p = commands.Basic.Properties(
        content_type="text/plain", headers={"keep": "me", "BCC": ["x"], "n": 5},
        delivery_mode=2, expiration="100", app_id="app")
    raw = p.marshal()
    out = rewrite_properties(raw, drop_headers={"BCC"}, add_headers={
        "x-new": encode_field_value(1)}, replace={"expiration": None, "reply_to": "r.1"})
    got = decode_properties(out)
    assert got.headers == {"keep": "me", "n": 5, "x-new": 1}
    assert (got.content_type, got.delivery_mode, got.expiration, got.app_id, got.reply_to) == (
        "text/plain", 2, None, "app", "r.1")
    # a field the broker does not touch keeps its encoding (a 'b' byte stays a 'b' byte)
    odd = with_headers(struct.pack(">I", 4) + b"\x01kb\x07")
    assert rewrite_properties(odd, add_headers={"z": encode_field_value("y")}).startswith(
        b"\x20\x00" + struct.pack(">I", 4 + 1 + 1 + 5 + 1) + b"\x01kb\x07")


def test_rewrite_adds_a_table_where_there_was_none():
    raw = commands.Basic.Properties(delivery_mode=1).marshal()
    out = rewrite_properties(raw, add_headers={"x-death": encode_field_value([{"count": 1}])})
    assert decode_properties(out).headers == {"x-death": [{"count": 1}]}
    assert decode_properties(out).delivery_mode == 1


@settings(max_examples=150, deadline=None)
@given(
    headers=st.none() | st.dictionaries(st.text(max_size=10), values, max_size=4),
    content_type=st.none() | st.text(max_size=10),
    content_encoding=st.none() | st.text(max_size=5),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    offset=st.integers(0, 2**63 - 1),
)
def test_append_header_is_rewrite_without_the_walk(headers, content_type, content_encoding,
                                                   delivery_mode, offset):
    """A stream's x-stream-offset stamp: the same block rewrite_properties gives, field last."""
    raw = commands.Basic.Properties(headers=headers, content_type=content_type,
                                    content_encoding=content_encoding,
                                    delivery_mode=delivery_mode, message_id="m").marshal()
    value = b"L" + struct.pack(">q", offset)
    out = append_header(raw, b"x-stream-offset", value)
    assert out == rewrite_properties(raw, add_headers={"x-stream-offset": value})
    got, before = decode_properties(out), decode_properties(raw)
    assert list(got.headers)[-1] == "x-stream-offset" and got.headers["x-stream-offset"] == offset
    for name in ("content_type", "content_encoding", "delivery_mode", "message_id"):
        assert getattr(got, name) == getattr(before, name)


def test_append_header_replaces_a_field_of_that_name():
    raw = commands.Basic.Properties(headers={"x-stream-offset": "forged", "a": 1}).marshal()
    out = append_header(raw, b"x-stream-offset", b"L" + struct.pack(">q", 7))
    assert decode_properties(out).headers == {"a": 1, "x-stream-offset": 7}
    assert append_header(b"", b"k", b"t\x01") == b"\x20\x00" + struct.pack(">I", 4) + b"\x01kt\x01"
