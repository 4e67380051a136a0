"""Runs one conformance row against a broker over a plain socket and describes its answers.

A row is a list of steps; each step is written in one `sendall` and the frames the broker
answers are collected as short strings ("1 channel.close 404 60.40 | NOT_FOUND - ..."): channel,
method, the fields that matter, and after " | " the reply text, which is shown but never
compared. Two modes:

- recording (`expect=None`): read until the broker has been quiet for `row.quiet` seconds or
  closed the socket. This is how the table is made from RabbitMQ (tests/conformance/record.py).
- checking (`expect` given): read exactly as many frames as the table says (or until the
  socket closes), so a run costs no waiting at all when the broker answers as recorded.

After the steps: if the broker sent connection.close, the runner answers close-ok and reads
what follows (the socket's end, "EOF"). If the socket is still open, a probe on a fresh
channel (channel.open + a passive declare of amq.direct) says whether the connection is
still usable; any other frame that shows up meanwhile is a late answer, recorded apart.

Names: every "cf." prefix in a queue, exchange or argument is rewritten to
"cf.<row name>." so rows never meet each other's queues, even on a broker that lives on;
what a row declares is deleted afterwards through a second connection (`Admin`), which also
runs a row's `setup` (queues with messages, a consumer from another connection)."""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pamqp import base, commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp.body import ContentBody
from pamqp.heartbeat import Heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
EOF = "EOF"
RESET = "RESET"


# -- what rows are made of ----------------------------------------------------------------------
class Method(NamedTuple):
    channel: int
    method: base.Frame


Step = list["Method | bytes"]


def m(channel: int, method: base.Frame) -> Method:
    return Method(channel, method)


def frame(ftype: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    """One frame by hand: type, channel, size, payload and the given end octet."""
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + end


def header(channel: int, size: int, class_id: int = 60, props: bytes = b"\x00\x00") -> bytes:
    """A content header announcing `size` body bytes (raw property flags + list)."""
    return frame(2, channel, struct.pack(">HHQ", class_id, 0, size) + props)


def body(channel: int, data: bytes) -> bytes:
    return frame(3, channel, data)


def content(
    channel: int,
    data: bytes = b"hi",
    size: int | None = None,
    props: commands.Basic.Properties | None = None,
    frame_max: int = 131072,
) -> bytes:
    """Header + body frames; `size` lets the header announce another length than sent."""
    hdr = pheader.ContentHeader(0, len(data) if size is None else size,
                                props or commands.Basic.Properties())
    out = [pframe.marshal(hdr, channel)]
    step = frame_max - 8
    for i in range(0, len(data), step):
        out.append(pframe.marshal(ContentBody(data[i:i + step]), channel))
    return b"".join(out)


def publish(channel: int, exchange: str = "", routing_key: str = "", data: bytes = b"hi",
            props: commands.Basic.Properties | None = None, **flags: bool) -> Step:
    return [m(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                              **flags)),
            content(channel, data, props=props)]


def heartbeat(channel: int = 0) -> bytes:
    return frame(8, channel, b"")


@dataclass(frozen=True)
class Outcome:
    """What a broker did with a row: the frames answered after each step (a last step is added
    for the runner's close-ok when the broker closed the connection), whether the connection
    was usable afterwards, and frames that came in only during the probe."""

    answers: list[list[str]]
    usable: bool | None  # None: not probed (the row ends the connection itself)
    late: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"answers": self.answers, "usable": self.usable}
        if self.late:
            out["late"] = self.late
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(data["answers"], data["usable"], data.get("late", []))


@dataclass(frozen=True)
class Row:
    name: str
    steps: list[Step]
    stage: str = "open"  # "open", "tuned" (no connection.open), "started" (no start-ok)
    channels: tuple[int, ...] = (1,)  # opened before the steps (stage "open")
    tune: dict[str, int] | None = None  # tune-ok fields (default: channel_max as offered)
    setup: Step = field(default_factory=list)  # run first on the admin connection
    probe: int = 100  # the channel the usability probe opens; 0: none (usable is None)
    quiet: float = 0.3  # recording: a step's answers are complete after this much silence
    differs: str = ""  # a chosen difference: one line saying why
    hare: Outcome | None = None  # with `differs`: what Hare answers instead
    xfail: str = ""  # Hare is known to differ; the reason names who fixes it


# -- describing frames --------------------------------------------------------------------------
def _kebab(name: str) -> str:
    cls, meth = name.split(".")
    return f"{cls.lower()}.{re.sub(r'(?<!^)(?=[A-Z])', '-', meth).lower()}"


_GENERATED = re.compile(r"\b(amq\.(?:gen|ctag)-)[A-Za-z0-9_\-]+")


def _names(text: str) -> str:
    return _GENERATED.sub(r"\1*", text)


def describe(channel: int, value: Any) -> str | None:
    """A frame as the table writes it; None for heartbeats (never part of an answer)."""
    if isinstance(value, Heartbeat):
        return None
    if isinstance(value, pheader.ContentHeader):
        return f"{channel} content-header size={value.body_size}"
    if isinstance(value, ContentBody):
        return f"{channel} content-body {len(value.value)}B"
    name = _kebab(value.name)
    fields = ""
    text = ""
    if isinstance(value, commands.Connection.Close | commands.Channel.Close):
        fields = f" {value.reply_code} {value.class_id}.{value.method_id}"
        text = value.reply_text
    elif isinstance(value, commands.Connection.Tune):
        fields = (f" channel_max={value.channel_max} frame_max={value.frame_max}"
                  f" heartbeat={value.heartbeat}")
    elif isinstance(value, commands.Queue.DeclareOk):
        fields = (f" {value.queue} messages={value.message_count}"
                  f" consumers={value.consumer_count}")
    elif isinstance(value, commands.Queue.PurgeOk | commands.Queue.DeleteOk):
        fields = f" messages={value.message_count}"
    elif isinstance(value, commands.Basic.ConsumeOk | commands.Basic.CancelOk
                    | commands.Basic.Cancel):
        fields = f" {value.consumer_tag}"
    elif isinstance(value, commands.Basic.Deliver):
        fields = (f" {value.consumer_tag} tag={value.delivery_tag}"
                  f" redelivered={int(value.redelivered)} {value.exchange}/{value.routing_key}")
    elif isinstance(value, commands.Basic.GetOk):
        fields = (f" tag={value.delivery_tag} redelivered={int(value.redelivered)}"
                  f" {value.exchange}/{value.routing_key} left={value.message_count}")
    elif isinstance(value, commands.Basic.Return):
        fields = f" {value.reply_code} {value.exchange}/{value.routing_key}"
        text = value.reply_text
    elif isinstance(value, commands.Basic.Ack | commands.Basic.Nack):
        fields = f" tag={value.delivery_tag} multiple={int(value.multiple)}"
    elif isinstance(value, commands.Channel.Flow | commands.Channel.FlowOk):
        fields = f" active={int(value.active)}"
    out = _names(f"{channel} {name}{fields}")
    return f"{out} | {_names(text)}" if text else out


def key(answer: str) -> str:
    """The compared part of an answer: everything before the reply text."""
    return answer.split(" | ", 1)[0]


def differences(expected: Outcome, got: Outcome, got_may_reset: bool = False) -> list[str]:
    """Empty when `got` answers as `expected`. Within a step the order of frames matters per
    channel only: two channels' answers may interleave either way.
    A RESET recorded from RabbitMQ (which closes its sockets with SO_LINGER 0) is met by a
    clean EOF; the other way round it is not: the broker under test must never reset
    (`got_may_reset` lifts that, to compare two recordings of RabbitMQ)."""
    out = []
    steps = max(len(expected.answers), len(got.answers))
    for i in range(steps):
        want = expected.answers[i] if i < len(expected.answers) else []
        have = got.answers[i] if i < len(got.answers) else []
        if _per_channel(want, reset_is_eof=True) != _per_channel(have, got_may_reset):
            out.append(f"step {i + 1}: expected {want}, got {have}")
    if _after_close(got.answers):
        out.append(f"frames after connection.close(-ok): {_after_close(got.answers)}")
    if expected.usable != got.usable:
        out.append(f"usable afterwards: expected {expected.usable}, got {got.usable}")
    def late(answers: list[str], reset_is_eof: bool) -> list[str]:
        return [EOF if reset_is_eof and a == RESET else key(a) for a in answers]

    if late(expected.late, True) != late(got.late, got_may_reset):
        out.append(f"late frames: expected {expected.late}, got {got.late}")
    return out


def _per_channel(answers: list[str], reset_is_eof: bool = False) -> dict[str, list[str]]:
    by: dict[str, list[str]] = {}
    for a in answers:
        k = EOF if reset_is_eof and a == RESET else key(a)
        by.setdefault(k.split(" ", 1)[0], []).append(k)
    return by


def _after_close(answers: list[list[str]]) -> list[str]:
    """Frames on other channels after connection.close or close-ok: never allowed."""
    closed, out = False, []
    for a in (a for step in answers for a in step):
        k = key(a)
        if closed and not k.startswith("0 ") and k not in (EOF, RESET):
            out.append(a)
        closed |= k.startswith(("0 connection.close ", "0 connection.close-ok"))
    return out


# -- the socket ---------------------------------------------------------------------------------
class Conn:
    """A plain socket that cuts frames; closed and reset sockets become EOF / RESET answers."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.ended = ""  # EOF or RESET once the broker's side is gone

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def next(self, timeout: float) -> tuple[int, Any] | str | None:
        """The next frame, EOF/RESET, or None when nothing came within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 7:
                size = struct.unpack_from(">I", self.buf, 3)[0]
                if len(self.buf) >= size + 8:
                    _, channel, value = pframe.unmarshal(self.buf[:size + 8])
                    self.buf = self.buf[size + 8:]
                    return channel, value
            if self.ended:
                return self.ended
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                return None
            except ConnectionResetError:
                self.ended = RESET
                continue
            if not data:
                self.ended = EOF
                continue
            self.buf += data

    def answers(self, count: int | None, quiet: float, timeout: float) -> list[str]:
        """Exactly `count` answers (fewer if the socket ends or `timeout` passes between two
        frames), or with count None everything until `quiet` seconds of silence."""
        out: list[str] = []
        while count is None or len(out) < count:
            got = self.next(quiet if count is None else timeout)
            if got is None:
                break
            if isinstance(got, str):
                out.append(got)
                break
            text = describe(*got)
            if text is not None:
                out.append(text)
        return out

    def expect(self, cls: type, timeout: float = 5.0) -> Any:
        while True:
            got = self.next(timeout)
            if got is None or isinstance(got, str):
                raise AssertionError(f"expected {cls.__name__}, got {got!r}")
            if not isinstance(got[1], Heartbeat):
                if not isinstance(got[1], cls):
                    raise AssertionError(f"expected {cls.__name__}, got {got[1]!r}")
                return got[1]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# -- rows ---------------------------------------------------------------------------------------
def localize(value: Any, prefix: str) -> Any:
    """Rewrite the "cf." prefix of names (also inside argument tables) to the row's own."""
    if isinstance(value, str):
        return prefix + value[3:] if value.startswith("cf.") else value
    if isinstance(value, dict):
        return {k: localize(v, prefix) for k, v in value.items()}
    if isinstance(value, list):
        return [localize(v, prefix) for v in value]
    return value


def encode(item: Method | bytes, prefix: str, declared: list[tuple[str, str]]) -> bytes:
    if isinstance(item, bytes):
        return item
    method = type(item.method)()
    for attr, value in item.method:
        setattr(method, attr, localize(value, prefix))
    if isinstance(method, commands.Queue.Declare) and not method.passive and method.queue:
        declared.append(("queue", method.queue))
    if isinstance(method, commands.Exchange.Declare) and not method.passive:
        declared.append(("exchange", method.exchange))
    return pframe.marshal(method, item.channel)


def flatten(step: Iterable[Any]) -> Iterator[Method | bytes]:
    for item in step:
        if isinstance(item, Method | bytes):
            yield item
        else:
            yield from flatten(item)


def prefix_of(row: Row) -> str:
    return "cf." + re.sub(r"[^A-Za-z0-9_.\-]", "-", row.name.replace("/", ".")) + "."


def handshake(conn: Conn, row: Row) -> None:
    conn.send(PROTOCOL_HEADER)
    conn.expect(commands.Connection.Start)
    if row.stage == "started":
        return
    conn.send(pframe.marshal(commands.Connection.StartOk(
        client_properties={"product": "hare-conformance", "capabilities": {
            "consumer_cancel_notify": True, "connection.blocked": True,
            "authentication_failure_close": True,
            "publisher_confirms": True, "basic.nack": True}},
        mechanism="PLAIN", response="\0guest\0guest", locale="en_US"), 0))
    tune = conn.expect(commands.Connection.Tune)
    fields = {"channel_max": tune.channel_max, "frame_max": 131072, "heartbeat": 0}
    fields.update(row.tune or {})
    conn.send(pframe.marshal(commands.Connection.TuneOk(**fields), 0))
    if row.stage == "tuned":
        return
    conn.send(pframe.marshal(commands.Connection.Open(virtual_host="/"), 0))
    conn.expect(commands.Connection.OpenOk)
    for n in row.channels:
        conn.send(pframe.marshal(commands.Channel.Open(), n))
        conn.expect(commands.Channel.OpenOk)


def run(row: Row, host: str, port: int, admin: Admin, expect: Outcome | None = None,
        timeout: float = 5.0) -> Outcome:
    """One row on a connection of its own; what it declared is deleted afterwards."""
    prefix = prefix_of(row)
    declared: list[tuple[str, str]] = []
    try:
        admin.setup(row.setup, prefix, declared)
        conn = Conn(host, port)
        try:
            return _steps(conn, row, prefix, declared, expect, timeout)
        finally:
            _goodbye(conn)
    finally:
        admin.cleanup(declared)


def _steps(conn: Conn, row: Row, prefix: str, declared: list[tuple[str, str]],
           expect: Outcome | None, timeout: float) -> Outcome:
    try:
        handshake(conn, row)
    except AssertionError as exc:  # the row's own tune-ok or stage may be refused at once
        return Outcome([[f"handshake: {exc}"]], False)
    answers: list[list[str]] = []

    def read() -> list[str]:
        i = len(answers)
        count = None
        if expect is not None:
            count = len(expect.answers[i]) if i < len(expect.answers) else 0
        got = conn.answers(count, row.quiet, timeout)
        answers.append(got)
        return got

    closed_by_broker = False
    for step in row.steps:
        data = b"".join(encode(item, prefix, declared) for item in flatten(step))
        conn.send(data)
        got = read()
        closed_by_broker |= any(key(a).startswith("0 connection.close ") for a in got)
        if _ended(answers):
            return Outcome(answers, False)
    if closed_by_broker:
        conn.send(pframe.marshal(commands.Connection.CloseOk(), 0))
        read()
        if _ended(answers):
            return Outcome(answers, False)
    if not row.probe:
        return Outcome(answers, None)
    # a broker that is expected to have gone quiet is not waited for long
    wait = 0.5 if expect is not None and not expect.usable else timeout
    return _probe(conn, row.probe, answers, wait)


def _ended(answers: list[list[str]]) -> bool:
    return bool(answers[-1]) and answers[-1][-1] in (EOF, RESET)


def _probe(conn: Conn, n: int, answers: list[list[str]], timeout: float) -> Outcome:
    """Usable means: a new channel opens and answers a passive declare, and then the
    connection closes on our connection.close with a plain close-ok. The close goes only after
    the declare's answer, so every frame the row sent has been acted on by then: an error on
    its way from one of them comes before the close-ok."""
    late: list[str] = []

    def until(want: list[str]) -> bool:
        seen: list[str] = []
        while seen != want:
            got = conn.next(timeout)
            if got is None:
                return False
            if isinstance(got, str):
                late.append(got)
                return False
            text = describe(*got)
            if text is None:
                continue
            if text == want[len(seen)]:
                seen.append(text)
            else:
                late.append(text)
        return True

    conn.send(pframe.marshal(commands.Channel.Open(), n)
              + pframe.marshal(commands.Exchange.Declare(exchange="amq.direct", passive=True), n))
    usable = until([f"{n} channel.open-ok", f"{n} exchange.declare-ok"])
    if usable:
        conn.send(pframe.marshal(commands.Connection.Close(
            reply_code=200, reply_text="probe", class_id=0, method_id=0), 0))
        usable = until(["0 connection.close-ok"])
        conn.ended = conn.ended or "probed"  # closed by the probe: no goodbye
    return Outcome(answers, usable and not late, late)


def _goodbye(conn: Conn) -> None:
    """Close politely if the connection is still up, so the broker logs no abrupt close."""
    if not conn.ended:  # a row that ended without a probe
        conn.send(pframe.marshal(commands.Connection.Close(
            reply_code=200, reply_text="bye", class_id=0, method_id=0), 0))
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            got = conn.next(deadline - time.monotonic())
            if got is None or isinstance(got, str):
                break
            if isinstance(got[1], commands.Connection.CloseOk):
                break
    conn.close()


class Admin:
    """A second connection: runs rows' set-up and deletes what rows declared. Its channel is
    in confirm mode so a set-up's publishes are in their queues before the row starts."""

    def __init__(self, host: str, port: int) -> None:
        self.conn = Conn(host, port)
        handshake(self.conn, Row("admin", [], channels=()))
        self.channel = 0
        self.published = 0
        self.confirmed = 0
        self._fresh_channel()

    def _fresh_channel(self) -> None:
        self.channel += 1
        self.published = self.confirmed = 0
        self.conn.send(pframe.marshal(commands.Channel.Open(), self.channel)
                       + pframe.marshal(commands.Confirm.Select(), self.channel))
        self._wait(2)

    def _wait(self, replies: int, acks: int = 0) -> list[Any]:
        """Wait for `replies` method replies on our channel and confirms up to `acks`."""
        got: list[Any] = []
        while len(got) < replies or self.confirmed < acks:
            frame_ = self.conn.next(10.0)
            if frame_ is None or isinstance(frame_, str):
                raise RuntimeError(f"admin connection: {frame_!r} while waiting")
            channel, value = frame_
            if channel != self.channel:
                continue  # deliveries and cancels for an older channel's consumers
            if isinstance(value, commands.Basic.Ack):
                self.confirmed = max(self.confirmed, value.delivery_tag)
            elif isinstance(value, commands.Channel.Close):
                self.conn.send(pframe.marshal(commands.Channel.CloseOk(), self.channel))
                raise _Refused(describe(channel, value) or "")
            elif isinstance(value, base.Frame) and not isinstance(
                    value, commands.Basic.Deliver | commands.Basic.Cancel | commands.Basic.Return):
                got.append(value)
        return got

    def setup(self, step: Step, prefix: str, declared: list[tuple[str, str]]) -> None:
        if not step:
            return
        data, replies = [], 0
        for item in flatten(step):
            if isinstance(item, Method):
                item = Method(self.channel, item.method)
                sync = item.method.synchronous and not getattr(item.method, "nowait", False)
                replies += int(sync)
                self.published += int(isinstance(item.method, commands.Basic.Publish))
            else:  # content frames: moved to our channel
                item = _rechannel(item, self.channel)
            data.append(encode(item, prefix, declared))
        self.conn.send(b"".join(data))
        self._wait(replies, self.published)

    def cleanup(self, declared: list[tuple[str, str]]) -> None:
        for kind, name in declared:
            if not name.startswith("cf."):
                continue  # amq.*, "" and the like were refused, not created
            method = (commands.Queue.Delete(queue=name) if kind == "queue"
                      else commands.Exchange.Delete(exchange=name))
            self.conn.send(pframe.marshal(method, self.channel))
            try:
                self._wait(1)
            except _Refused:  # amq.* names, or never created: the channel is closed now
                self.published = 0
                self._fresh_channel()

    def close(self) -> None:
        _goodbye(self.conn)


class _Refused(Exception):
    pass


def _rechannel(data: bytes, channel: int) -> bytes:
    out, pos = [], 0
    while pos < len(data):
        size = struct.unpack_from(">I", data, pos + 3)[0]
        out.append(data[pos:pos + 1] + struct.pack(">H", channel) + data[pos + 3:pos + 8 + size])
        pos += 8 + size
    return b"".join(out)
