"""Users, passwords and per-vhost permissions; the PLAIN, AMQPLAIN and EXTERNAL mechanisms.

As RabbitMQ: a user in `loopback_users` (guest by default) may only log in from localhost; a
failed login is connection.close 403 ACCESS_REFUSED. EXTERNAL is rabbitmq_auth_mechanism_ssl:
offered on TLS connections when `auth_mechanisms` names it, it logs in the existing user named
by the verified client certificate (`ssl_cert_login_from`), without a password."""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from typing import Any

from pamqp import decode

from broker.config import check_password, hash_password
from broker.config.values import CertLoginFrom
from broker.protocol.constants import ACCESS_REFUSED
from broker.protocol.errors import ConnectionError_

__all__ = ["Auth", "LoginRefused", "Permissions", "User", "peer_cert_name", "rfc4514"]

# RFC 4514 attribute keys for the names Python's getpeercert() gives (rabbit_cert_info's set)
_RDN_KEYS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
    "emailAddress": "EMAILADDRESS",
    "serialNumber": "SERIALNUMBER",
    "surname": "SN",
    "givenName": "GIVENNAME",
    "title": "TITLE",
}


@dataclass(slots=True)
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Permissions:
    configure: re.Pattern[str]
    write: re.Pattern[str]
    read: re.Pattern[str]
    source: tuple[str, str, str] = ("", "", "")  # the patterns as given

    @classmethod
    def of(cls, configure: str, write: str, read: str) -> Permissions:
        # RabbitMQ treats "" as "matches nothing"; a search for "" would match everything.
        return cls(_compile(configure), _compile(write), _compile(read),
                   (configure, write, read))

    def patterns(self) -> tuple[str, str, str]:
        return self.source


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern if pattern else "(?!)")


class LoginRefused(ConnectionError_):
    """A refused login: the client gets RabbitMQ's safe text, the log gets `detail`."""

    def __init__(self, mechanism: str, detail: str) -> None:
        super().__init__(
            ACCESS_REFUSED,
            f"Login was refused using authentication mechanism {mechanism}. "
            "For details see the broker logfile.",
            (10, 11),
        )
        self.detail = detail


class Auth:
    def __init__(
        self,
        loopback_users: tuple[str, ...] | list[str] = ("guest",),
        *,
        mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN"),
        cert_login_from: CertLoginFrom = CertLoginFrom.COMMON_NAME,
    ) -> None:
        self.users: dict[str, User] = {}
        self.perms: dict[tuple[str, str], Permissions] = {}
        self.loopback_users = set(loopback_users)
        self.mechanisms = mechanisms
        self.cert_login_from = cert_login_from
        # what connection.start offers: EXTERNAL only over TLS, as RabbitMQ's should_offer
        self._offered = " ".join(m for m in mechanisms if m != "EXTERNAL")
        self._offered_tls = " ".join(mechanisms)

    # -- administration ---------------------------------------------------------------------
    def add_user(self, name: str, password: str | None = None, *, password_hash: str = "",
                 tags: list[str] | None = None) -> User:
        if password is not None:
            password_hash = hash_password(password)
        user = User(name, password_hash, list(tags or []))
        self.users[name] = user
        return user

    def delete_user(self, name: str) -> bool:
        if self.users.pop(name, None) is None:
            return False
        for key in [k for k in self.perms if k[0] == name]:
            del self.perms[key]
        return True

    def set_permissions(
        self, user: str, vhost: str, configure: str, write: str, read: str
    ) -> None:
        self.perms[(user, vhost)] = Permissions.of(configure, write, read)

    def clear_permissions(self, user: str, vhost: str) -> bool:
        return self.perms.pop((user, vhost), None) is not None

    # -- login ------------------------------------------------------------------------------
    def offered(self, tls: bool) -> str:
        """The mechanisms connection.start lists, space-separated."""
        return self._offered_tls if tls else self._offered

    def authenticate(self, mechanism: str, response: object, *, loopback: bool,
                     tls: ssl.SSLObject | None = None) -> str:
        """The user name a connection.start-ok logs in, or a 403 ConnectionError_."""
        if mechanism not in (self._offered_tls if tls is not None else self._offered).split():
            raise ConnectionError_(
                ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'", (10, 11)
            )
        if mechanism == "EXTERNAL":
            name = self._external(tls)
        else:
            name, password = self._credentials(mechanism, response)
            user = self.users.get(name)
            if user is None or not check_password(password, user.password_hash):
                raise LoginRefused(mechanism, f"user '{name}' - invalid credentials")
        if name in self.loopback_users and not loopback:
            raise ConnectionError_(
                ACCESS_REFUSED, f"User '{name}' can only connect via localhost", (10, 11)
            )
        return name

    @staticmethod
    def _credentials(mechanism: str, response: object) -> tuple[str, str]:
        raw = response if isinstance(response, bytes) else str(response).encode()
        if mechanism == "PLAIN":
            parts = raw.split(b"\x00")
            if len(parts) != 3:
                raise LoginRefused(mechanism, "malformed PLAIN response")
            return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
        try:  # AMQPLAIN: a field table without its length prefix
            _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
        except Exception as exc:
            raise LoginRefused(mechanism, "malformed AMQPLAIN response") from exc
        return _text(table.get("LOGIN")), _text(table.get("PASSWORD"))

    def _external(self, tls: ssl.SSLObject | None) -> str:
        """The user a verified client certificate names (rabbit_auth_mechanism_ssl). The
        response is ignored: SASL EXTERNAL's credentials come from outside the protocol."""
        cert = tls.getpeercert() if tls is not None else None
        if not cert:
            raise LoginRefused(
                "EXTERNAL", "connection peer presented no TLS (x.509) certificate"
            )
        name = peer_cert_name(cert, self.cert_login_from)
        if name is None:
            raise LoginRefused("EXTERNAL", "no name found in the client certificate")
        if name not in self.users:
            raise LoginRefused("EXTERNAL", f"user '{name}' - invalid credentials")
        return name

    def permissions(self, user: str, vhost: str) -> Permissions | None:
        return self.perms.get((user, vhost))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)


def peer_cert_name(cert: dict[str, Any] | None, login_from: CertLoginFrom) -> str | None:
    """The user name in a verified peer certificate (getpeercert()'s dict): its common
    name(s) joined with "," or its subject as an RFC 4514 string; None when there is none."""
    if not cert:
        return None
    subject: tuple[tuple[tuple[str, str], ...], ...] = cert.get("subject", ())
    if login_from is CertLoginFrom.COMMON_NAME:
        names = [value for rdn in subject for key, value in rdn if key == "commonName"]
        return ",".join(names) or None
    return rfc4514(subject) or None


def rfc4514(name: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    """A certificate name (getpeercert()'s "subject" or "issuer") as RFC 4514 text, last RDN
    first, as RabbitMQ's rabbit_cert_info writes it: "CN=alice,O=Example\\, Inc.,C=GB"."""
    return ",".join("+".join(f"{_RDN_KEYS.get(k, k)}={_escape(v)}" for k, v in rdn)
                    for rdn in reversed(name))


def _escape(value: str) -> str:
    """RFC 4514 section 2.4 escaping, the characters RabbitMQ escapes."""
    out = "".join("\\" + ch if ch in ',+"\\<>;' else ch for ch in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out
