"""The frame scanner on hand-built byte strings, fed whole, byte by byte and in odd chunks."""

from __future__ import annotations

import random
import struct
import time

import pytest
from pamqp import commands
from pamqp import frame as pamqp_frame

from hare_perf.scanner import ConfirmTracker, FrameError, FrameScanner

CHUNKS = [1, 2, 3, 5, 7, 11, 13, 64, 333, 4096, 1 << 20]


def method(channel: int, class_id: int, method_id: int, args: bytes) -> bytes:
    return struct.pack(">BHIHH", 1, channel, 4 + len(args), class_id, method_id) + args + b"\xce"


def deliver(channel: int, tag: int, ctag: bytes = b"perf", exchange: bytes = b"") -> bytes:
    args = bytes([len(ctag)]) + ctag + struct.pack(">QB", tag, 0)
    args += bytes([len(exchange)]) + exchange + b"\x01q"
    return method(channel, 60, 60, args)


def header(channel: int, body_size: int) -> bytes:
    return struct.pack(">BHIHHQH", 2, channel, 14, 60, 0, body_size, 0) + b"\xce"


def body(channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", 3, channel, len(payload)) + payload + b"\xce"


def message(channel: int, tag: int, sent_ns: int, size: int = 64, frame_max: int = 0) -> bytes:
    payload = struct.pack(">Q", sent_ns) + bytes(size - 8)
    out = deliver(channel, tag) + header(channel, len(payload))
    step = (frame_max - 8) if frame_max else len(payload)
    for start in range(0, len(payload), step):
        out += body(channel, payload[start : start + step])
    return out


def ack(channel: int, tag: int, multiple: bool, nack: bool = False) -> bytes:
    bits = 1 if multiple else 0
    return method(channel, 60, 120 if nack else 80, struct.pack(">QB", tag, bits))


def feed_in_chunks(scanner: FrameScanner, data: bytes, size: int) -> None:
    for start in range(0, len(data), size):
        scanner.feed(data[start : start + size])


@pytest.mark.parametrize("chunk", CHUNKS)
def test_deliveries_counted_and_tags_kept_in_any_chunking(chunk: int) -> None:
    sent = time.monotonic_ns() - 5_000_000  # sent 5 ms ago
    data = b"".join(message(1, tag, sent) for tag in range(1, 101))
    data += b"".join(message(2, tag, sent, size=8) for tag in range(1, 4))
    scanner = FrameScanner()
    feed_in_chunks(scanner, data, chunk)
    assert scanner.delivered == 103
    assert scanner.last_tag == {1: 100, 2: 3}
    assert len(scanner.latencies_ns) == 103
    assert all(lat >= 5_000_000 for lat in scanner.latencies_ns)
    assert scanner.methods == []
    assert not scanner._buf  # nothing left over


@pytest.mark.parametrize("chunk", [1, 7, 100, 1 << 20])
def test_split_body_gives_one_timestamp_and_empty_body_none(chunk: int) -> None:
    sent = time.monotonic_ns()
    data = message(1, 1, sent, size=1000, frame_max=108)  # ten body frames
    data += deliver(1, 2) + header(1, 0)  # an empty body: no body frame at all
    data += message(1, 3, sent)
    scanner = FrameScanner(frame_max=4096)
    feed_in_chunks(scanner, data, chunk)
    assert scanner.delivered == 3
    assert len(scanner.latencies_ns) == 2
    assert scanner.last_tag[1] == 3


def test_timestamps_off_records_nothing() -> None:
    scanner = FrameScanner(timestamps=False)
    scanner.feed(message(1, 1, 123))
    assert scanner.delivered == 1
    assert len(scanner.latencies_ns) == 0


def test_long_consumer_tag_and_exchange_are_skipped_by_length() -> None:
    data = deliver(1, 0x0102030405060708, ctag=b"x" * 255, exchange=b"amq.topic")
    scanner = FrameScanner()
    feed_in_chunks(scanner, data + header(1, 0), 3)
    assert scanner.last_tag[1] == 0x0102030405060708


@pytest.mark.parametrize("chunk", CHUNKS)
def test_acks_and_nacks_settle_confirms(chunk: int) -> None:
    data = ack(1, 1, False) + ack(1, 5, True) + ack(1, 7, False) + ack(1, 6, False)
    data += ack(1, 10, True, nack=True) + ack(1, 11, False)
    scanner = FrameScanner()
    feed_in_chunks(scanner, data, chunk)
    assert scanner.confirms.settled == 11
    assert scanner.confirms.nacked == 3  # 8, 9, 10


def test_other_methods_set_aside_for_the_slow_path() -> None:
    blocked = pamqp_frame.marshal(commands.Connection.Blocked(reason="low on memory"), 0)
    ok = pamqp_frame.marshal(commands.Queue.DeclareOk("q", 5, 0), 1)
    heartbeat = bytes((8, 0, 0, 0, 0, 0, 0, 0xCE))
    data = blocked + message(1, 1, 0) + heartbeat + ok
    scanner = FrameScanner()
    feed_in_chunks(scanner, data, 5)
    methods = scanner.take_methods()
    assert [ch for ch, _ in methods] == [0, 1]
    assert methods[0][1] == blocked[7:-1]
    assert methods[1][1] == ok[7:-1]
    assert scanner.methods == []
    assert scanner.heartbeats == 1
    assert scanner.delivered == 1


def test_random_chunking_matches_whole_feed() -> None:
    rng = random.Random(7)
    parts = []
    for tag in range(1, 500):
        parts.append(message(1 + tag % 3, tag, tag, size=rng.randint(8, 300)))
        if tag % 17 == 0:
            parts.append(ack(1, tag, True))
    data = b"".join(parts)
    whole = FrameScanner(timestamps=False)
    whole.feed(data)
    chunked = FrameScanner(timestamps=False)
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 700)
        chunked.feed(data[pos : pos + step])
        pos += step
    assert chunked.delivered == whole.delivered == 499
    assert chunked.last_tag == whole.last_tag
    assert chunked.confirms.settled == whole.confirms.settled == 493


def test_bad_frame_end_raises() -> None:
    data = bytearray(message(1, 1, 0))
    data[-1] = 0x00
    with pytest.raises(FrameError):
        FrameScanner().feed(bytes(data))


def test_oversized_frame_raises_before_its_payload_arrives() -> None:
    scanner = FrameScanner(frame_max=4096)
    with pytest.raises(FrameError):
        scanner.feed(struct.pack(">BHI", 3, 1, 1 << 30))


def test_confirm_tracker_out_of_order() -> None:
    tracker = ConfirmTracker()
    for tag in (3, 5, 2):
        tracker.settle(tag, False)
    assert tracker.settled == 3
    tracker.settle(1, False)  # 1..3 now contiguous, 5 still single
    assert (tracker.low, tracker.singles) == (3, {5})
    tracker.settle(4, True)
    assert (tracker.low, tracker.singles, tracker.settled) == (5, set(), 5)
    tracker.settle(5, False)  # a repeat changes nothing
    tracker.settle(2, True)
    assert tracker.settled == 5
