"""The frame cutter on hand-built bytes, whole and in odd chunks: frames by frame, and with
`publishes=True` a whole publish as one FRAME_PUBLISH command."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands

from broker.protocol import frames
from broker.protocol.errors import ConnectionError_

FRAME_MAX = 131072


def _publish(channel: int, body: bytes, props: bytes = b"\x00\x00", key: str = "q") -> bytes:
    return b"".join([
        frames.encode_method(channel, commands.Basic.Publish(exchange="", routing_key=key)),
        *frames.encode_content(channel, props, body, FRAME_MAX),
    ])


def _cut(data: bytes, step: int, publishes: bool) -> list[tuple[int, int, object]]:
    cutter = frames.FrameCutter(FRAME_MAX, publishes=publishes)
    out = []
    for start in range(0, len(data), step):
        out += cutter.feed(data[start : start + step])
    assert cutter.buf == b""
    return out


def _commands(cut: list[tuple[int, int, object]]) -> list[tuple[int, object]]:
    """What the frames amount to per channel: a whole publish's three frames as its command."""
    out: list[tuple[int, object]] = []
    pending: dict[int, list[bytes]] = {}
    for ftype, channel, payload in cut:
        if ftype == frames.FRAME_PUBLISH:
            out.append((channel, payload))
            continue
        assert isinstance(payload, bytes)
        parts = pending.setdefault(channel, [])
        parts.append(payload)
        if ftype == 3:  # the one body frame of these messages
            method, header, body = parts
            out.append((channel, ("content", method, header[12:], body)))
            del pending[channel]
    return out


@pytest.mark.parametrize("step", [1, 7, 13, 300, 1 << 20])
def test_fused_publishes_are_the_commands_frame_by_frame_makes(step: int) -> None:
    data = (_publish(1, b"a" * 300) + _publish(2, b"b" * 10, b"\x10\x00\x02")
            + frames.HEARTBEAT_FRAME + _publish(1, b"c"))
    plain = _cut(data, step, publishes=False)
    fused = _cut(data, step, publishes=True)
    assert all(f[0] != frames.FRAME_PUBLISH for f in plain)
    assert _commands(fused) == _commands(plain)
    assert [c for c, _ in _commands(fused)] == [1, 2, 1]
    if step > len(data):  # all in one read: every publish comes out whole
        assert [f[0] for f in fused] == [frames.FRAME_PUBLISH, frames.FRAME_PUBLISH, 8,
                                         frames.FRAME_PUBLISH]


def _frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"


def test_unusual_publishes_come_out_frame_by_frame() -> None:
    method = frames.encode_method(1, commands.Basic.Publish(exchange="", routing_key="q"))
    header = struct.pack(">HHQ", 60, 0, 4) + b"\x00\x00"
    cases = [
        method + _frame(2, 1, header) + _frame(3, 1, b"ab") + _frame(3, 1, b"cd"),  # 2 bodies
        method + _frame(2, 2, header) + _frame(3, 1, b"abcd"),  # header on another channel
        method + _frame(2, 1, header) + _frame(3, 1, b"abcde"),  # size does not add up
        method + _frame(2, 1, struct.pack(">HHQ", 60, 0, 0) + b"\x00\x00"),  # no body
        frames.encode_method(0, commands.Basic.Publish()) + _frame(2, 0, header)
        + _frame(3, 0, b"abcd"),  # channel 0 is the connection's: judged as such
    ]
    for data in cases:
        fused = _cut(data, 1 << 20, publishes=True)
        assert fused == _cut(data, 1 << 20, publishes=False), data


def test_a_bad_end_octet_inside_a_publish_is_still_a_frame_error() -> None:
    data = bytearray(_publish(1, b"abcd"))
    data[-1] = 0x00  # the body frame's end octet
    with pytest.raises(ConnectionError_) as err:
        frames.FrameCutter(FRAME_MAX, publishes=True).feed(bytes(data))
    assert err.value.code == 501


@pytest.mark.parametrize("step", [1, 5, 300, 1 << 20])
def test_repeated_publishes_come_out_as_frame_by_frame_makes_them(step: int) -> None:
    """A publish that repeats the last one's method, properties and size is cut by comparing
    its leading bytes: the same commands, and the bad end octet still a frame error."""
    same = [_publish(1, bytes([i]) * 100) for i in range(4)]
    data = b"".join([*same, _publish(1, b"x" * 99), same[0], _publish(2, b"y" * 100), same[1]])
    plain = _cut(data, step, publishes=False)
    fused = _cut(data, step, publishes=True)
    assert _commands(fused) == _commands(plain)
    assert [c for c, _ in _commands(fused)] == [1, 1, 1, 1, 1, 1, 2, 1]
    if step > len(data):  # in one read: the repeats share the first one's method and props
        first, second = fused[0][2], fused[1][2]
        assert second[1] is first[1] and second[2] is first[2] and second[3] != first[3]
    bad = bytearray(data + same[2])
    bad[-1] = 0x00
    with pytest.raises(ConnectionError_) as err:
        _cut(bytes(bad), step, publishes=True)
    assert err.value.code == 501


def test_a_lower_frame_max_applies_to_a_repeated_publish() -> None:
    cutter = frames.FrameCutter(FRAME_MAX, publishes=True)
    assert [f[0] for f in cutter.feed(_publish(1, b"a" * 100))] == [frames.FRAME_PUBLISH]
    cutter.frame_max = 64  # as tune-ok sets it
    with pytest.raises(ConnectionError_) as err:
        cutter.feed(_publish(1, b"b" * 100))
    assert err.value.code == 501


def test_encode_frames_gives_back_the_bytes_that_were_cut() -> None:
    """What a connection handed to another worker replays (broker/server/handover.py): cut
    frames (whole publishes among them), encoded again, cut to the same frames; a body over
    frame_max comes back in frames that fit."""
    data = (_publish(1, b"a" * 300) + frames.HEARTBEAT_FRAME
            + frames.encode_method(2, commands.Basic.Qos(prefetch_count=3))
            + _publish(2, b"b" * 10, b"\x10\x00\x02"))
    cut = _cut(data, 1 << 20, publishes=True)
    assert frames.encode_frames(cut, FRAME_MAX) == data
    big = [(frames.FRAME_PUBLISH, 1, ("content", cut[0][2][1], b"\x00\x00", b"z" * 300))]
    again = _cut(frames.encode_frames(big, 128), 1 << 20, publishes=False)
    assert [f[0] for f in again] == [1, 2, 3, 3, 3]
    assert b"".join(p for t, _, p in again if t == 3) == b"z" * 300
