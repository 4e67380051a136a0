"""SASL mechanisms: a client's connection.start-ok response -> who it claims to be.

PLAIN and AMQPLAIN carry a user name and a password. EXTERNAL (rabbitmq_auth_mechanism_ssl)
takes the user name from the verified TLS client certificate (`ssl_cert_login_from`) and
gives `Credentials.verified(name)`: no password, and the backends only check that the user
exists (the internal backend) or ask the user path without a password (the HTTP backend), as
RabbitMQ does. Only a mechanism that has verified the identity may build such credentials.
EXTERNAL is offered on TLS connections only, when `auth_mechanisms` names it."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from pamqp import decode

from broker.access.certificates import peer_cert_name
from broker.config.values import CertLoginFrom

__all__ = ["Credentials", "MechanismError", "offered", "parse_response"]


class MechanismError(Exception):
    """The response cannot be read, or names nobody: a refused login (the text is for the
    log, never for the client)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str | None = field(repr=False)

    @classmethod
    def verified(cls, username: str) -> Credentials:
        return cls(username, None)


def offered(mechanisms: tuple[str, ...], tls: bool) -> tuple[str, ...]:
    """What connection.start lists: EXTERNAL only over TLS, as RabbitMQ's should_offer."""
    return mechanisms if tls else tuple(m for m in mechanisms if m != "EXTERNAL")


def parse_response(mechanism: str, response: object, *, tls: ssl.SSLObject | None = None,
                   cert_login_from: CertLoginFrom = CertLoginFrom.COMMON_NAME) -> Credentials:
    """The credentials of an offered mechanism's response (the caller checked the offer)."""
    if mechanism == "EXTERNAL":
        # SASL EXTERNAL's credentials come from outside the protocol: the response is ignored
        cert = tls.getpeercert() if tls is not None else None
        if not cert:
            raise MechanismError("connection peer presented no TLS (x.509) certificate")
        name = peer_cert_name(cert, cert_login_from)
        if name is None:
            raise MechanismError("no name found in the client certificate")
        return Credentials.verified(name)
    raw = response if isinstance(response, bytes) else str(response).encode()
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise MechanismError("malformed PLAIN response")
        return Credentials(parts[1].decode(errors="replace"), parts[2].decode(errors="replace"))
    try:  # AMQPLAIN: a field table without its length prefix
        _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
    except Exception as exc:
        raise MechanismError("malformed AMQPLAIN response") from exc
    return Credentials(_text(table.get("LOGIN")), _text(table.get("PASSWORD")))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)
