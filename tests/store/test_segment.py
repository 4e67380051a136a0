"""The segment file format: headers, records, and what a scan makes of damage."""

from __future__ import annotations

import pytest

from broker.store.segment import (
    FILE_HEADER_SIZE,
    RECORD_HEADER_SIZE,
    BadHeader,
    CorruptRecord,
    decode_record,
    encode_file_header,
    encode_record_header,
    parse_file_header,
    scan_records,
)

BIG_ID = (1 << 127) | 12345  # ids are 128-bit


def record(msg_id: int, payload: bytes) -> bytes:
    return encode_record_header(msg_id, payload) + payload


def image(*records: bytes) -> bytes:
    return encode_file_header(7) + b"".join(records)


def test_record_roundtrip_with_128_bit_id() -> None:
    rec = record(BIG_ID, b"hello")
    assert len(rec) == RECORD_HEADER_SIZE + 5
    assert decode_record(rec, BIG_ID) == b"hello"


def test_decode_rejects_flipped_payload_wrong_id_and_short_read() -> None:
    rec = bytearray(record(1, b"payload"))
    rec[-1] ^= 0xFF
    with pytest.raises(CorruptRecord, match="checksum"):
        decode_record(bytes(rec), 1)
    with pytest.raises(CorruptRecord, match="another message"):
        decode_record(record(1, b"x"), 2)
    with pytest.raises(CorruptRecord, match="short"):
        decode_record(b"\x00" * 3, 1)


def test_file_header_roundtrip_and_rejects_foreign_files() -> None:
    assert parse_file_header(encode_file_header(42)) == (0, 42)
    with pytest.raises(BadHeader, match="magic"):
        parse_file_header(b"NOPE" + bytes(12))
    with pytest.raises(BadHeader, match="shorter"):
        parse_file_header(b"HSEG")
    bad_version = bytearray(encode_file_header(1))
    bad_version[5] = 99
    with pytest.raises(BadHeader, match="version"):
        parse_file_header(bytes(bad_version))


def test_scan_finds_every_record_with_offsets() -> None:
    a, b = record(1, b"a" * 10), record(BIG_ID, b"b" * 20)
    res = scan_records(image(a, b))
    assert res.records == [(1, FILE_HEADER_SIZE, len(a)),
                           (BIG_ID, FILE_HEADER_SIZE + len(a), len(b))]
    assert res.good_end == FILE_HEADER_SIZE + len(a) + len(b)
    assert res.torn_bytes == 0 and res.corrupt == []


def test_scan_treats_a_cut_last_record_as_torn_tail() -> None:
    a, b = record(1, b"a" * 100), record(2, b"b" * 100)
    data = image(a, b)[:-30]
    res = scan_records(data)
    assert [r[0] for r in res.records] == [1]
    assert res.good_end == FILE_HEADER_SIZE + len(a)
    assert res.torn_bytes == len(b) - 30


def test_scan_skips_a_corrupt_record_in_the_middle() -> None:
    recs = [record(i, bytes([i]) * 50) for i in range(1, 4)]
    data = bytearray(image(*recs))
    data[FILE_HEADER_SIZE + len(recs[0]) + RECORD_HEADER_SIZE + 10] ^= 0x55  # record 2 body
    res = scan_records(bytes(data))
    assert [r[0] for r in res.records] == [1, 3]
    assert res.corrupt == [(FILE_HEADER_SIZE + len(recs[0]), len(recs[1]))]
    assert res.torn_bytes == 0


def test_scan_resyncs_past_a_damaged_length_field() -> None:
    recs = [record(i, bytes([i + 100]) * 50) for i in range(1, 4)]
    data = bytearray(image(*recs))
    data[FILE_HEADER_SIZE + len(recs[0]) + 5] ^= 0x7F  # record 2's length
    res = scan_records(bytes(data))
    assert [r[0] for r in res.records] == [1, 3]
    assert len(res.corrupt) == 1


def test_zero_filled_hole_is_not_a_message() -> None:
    data = image(record(1, b"x" * 10)) + bytes(4096)
    res = scan_records(data)
    assert [r[0] for r in res.records] == [1]
    assert res.torn_bytes == 4096
