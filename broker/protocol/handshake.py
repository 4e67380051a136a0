"""The connection handshake's rules, no I/O: the verdict on the protocol header, what
connection.start offers, how tune-ok's values are checked against the server's limits, what a
client's properties say, and the errors (RabbitMQ's reply codes and texts) for a refused login
or too many channels. broker/server/handshake.py runs the steps and does the sending; the order
of the steps is connection_state.py's table."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from pamqp import commands

from broker.protocol.constants import ACCESS_REFUSED, FRAME_MIN_SIZE, NOT_ALLOWED, PROTOCOL_HEADER
from broker.protocol.errors import ConnectionError_

__all__ = [
    "SERVER_CAPABILITIES",
    "HeaderVerdict",
    "Tune",
    "check_channel_count",
    "client_capability",
    "client_name",
    "connection_start",
    "login_refused",
    "negotiate_tune",
    "protocol_header",
    "unsupported_mechanism",
    "whole_publishes_fit",
]

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}

# channel_max 0 means the protocol's own limit
PROTOCOL_CHANNEL_MAX = 65535


class HeaderVerdict(enum.Enum):
    INCOMPLETE = "incomplete"  # a prefix of ours: wait for more bytes
    ACCEPTED = "accepted"  # AMQP 0-9-1: send connection.start
    REFUSED = "refused"  # anything else: send our header back and close (the spec's answer)


def protocol_header(buf: bytes) -> tuple[HeaderVerdict, bytes]:
    """The verdict on the first bytes of a connection and what goes with it: the bytes kept
    (INCOMPLETE), the bytes after the header (ACCEPTED) or the header refused (REFUSED)."""
    if len(buf) < 8 and PROTOCOL_HEADER.startswith(buf):
        return HeaderVerdict.INCOMPLETE, buf
    if buf[:8] != PROTOCOL_HEADER:
        return HeaderVerdict.REFUSED, buf[:8]
    return HeaderVerdict.ACCEPTED, buf[8:]


def connection_start(version: str, cluster_name: str, mechanisms: list[str]
                     ) -> commands.Connection.Start:
    """connection.start: who we are, what we can do, the SASL mechanisms offered."""
    return commands.Connection.Start(
        version_major=0,
        version_minor=9,
        server_properties={
            "product": "Hare",
            "version": version,
            "platform": "Python",
            "copyright": "Hare developers",
            "information": "AMQP 0-9-1 broker, see README",
            "cluster_name": cluster_name,
            "capabilities": SERVER_CAPABILITIES,
        },
        mechanisms=" ".join(mechanisms),
        locales="en_US",
    )


@dataclass(frozen=True, slots=True)
class Tune:
    """A connection's limits: the server's in connection.tune, then the negotiated ones."""

    channel_max: int
    frame_max: int
    heartbeat: int


def negotiate_tune(server: Tune, client: Tune) -> Tune:
    """The limits the connection runs with, from the server's tune and the client's tune-ok;
    530 NOT_ALLOWED for a client that asks for more than the server offered (RabbitMQ's texts).
    0 means "no limit" and is therefore above any limit of ours; the heartbeat is the
    client's."""
    if client.frame_max and client.frame_max < FRAME_MIN_SIZE:
        raise ConnectionError_(
            NOT_ALLOWED, f"frame_max={client.frame_max} < {FRAME_MIN_SIZE} min size"
        )
    if client.frame_max > server.frame_max or not client.frame_max:
        raise ConnectionError_(
            NOT_ALLOWED, f"frame_max={client.frame_max} > {server.frame_max} max size"
        )
    if server.channel_max and (client.channel_max > server.channel_max
                               or not client.channel_max):
        raise ConnectionError_(
            NOT_ALLOWED, f"channel_max={client.channel_max} > {server.channel_max} max"
        )
    return Tune(
        channel_max=client.channel_max or server.channel_max,
        frame_max=client.frame_max,
        heartbeat=client.heartbeat,
    )


def whole_publishes_fit(max_message_size: int, frame_max: int) -> bool:
    """May a publish the cutter found whole skip the assembler? Only if no single body frame
    can exceed max_message_size: the fast path does not check the size, so that it costs
    nothing when frames are smaller than the limit (the usual case)."""
    return max_message_size >= frame_max - 8


def check_channel_count(opened: int, channel_max: int) -> None:
    """channel_max limits how many channels are open at once, not their numbers (RabbitMQ:
    channel 65535 opens on a connection that negotiated 2047); 0 means the protocol's."""
    channel_max = channel_max or PROTOCOL_CHANNEL_MAX
    if opened >= channel_max:
        raise ConnectionError_(
            NOT_ALLOWED,
            f"number of channels opened ({opened}) has reached the "
            f"negotiated channel_max ({channel_max})",
        )


def unsupported_mechanism(mechanism: str) -> ConnectionError_:
    return ConnectionError_(
        ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'")


def login_refused(mechanism: str, username: str, *, loopback_only: bool) -> ConnectionError_:
    """RabbitMQ's texts for a refused login: the reason itself stays in the broker log."""
    if loopback_only:
        return ConnectionError_(
            ACCESS_REFUSED, f"User '{username}' can only connect via localhost")
    # class and method 0, as RabbitMQ's close for a refused login
    return ConnectionError_(
        ACCESS_REFUSED,
        f"Login was refused using authentication mechanism {mechanism}. "
        "For details see the broker logfile.",
    )


def client_capability(props: dict[str, Any], name: str) -> bool:
    """Did the client say, in start-ok's client properties, that it takes `name`?"""
    caps = props.get("capabilities")
    return bool(isinstance(caps, dict) and caps.get(name))


def client_name(props: dict[str, Any]) -> str:
    """"product version" from the client properties, for the log."""
    product = props.get("product", "")
    version = props.get("version", "")
    if isinstance(product, bytes):
        product = product.decode(errors="replace")
    if isinstance(version, bytes):
        version = version.decode(errors="replace")
    return f"{product} {version}".strip()
