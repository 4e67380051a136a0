"""Users, passwords and per-vhost permissions; the PLAIN and AMQPLAIN mechanisms.

As RabbitMQ: a user in `loopback_users` (guest by default) may only log in from localhost; a
failed login is connection.close 403 ACCESS_REFUSED."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pamqp import decode

from broker.config import check_password, hash_password
from broker.protocol.constants import ACCESS_REFUSED
from broker.protocol.errors import ConnectionError_

__all__ = ["Auth", "Permissions", "User"]


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


class Auth:
    def __init__(self, loopback_users: tuple[str, ...] | list[str] = ("guest",)) -> None:
        self.users: dict[str, User] = {}
        self.perms: dict[tuple[str, str], Permissions] = {}
        self.loopback_users = set(loopback_users)

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
    def authenticate(self, mechanism: str, response: object, *, loopback: bool) -> str:
        raw = response if isinstance(response, bytes) else str(response).encode()
        if mechanism == "PLAIN":
            parts = raw.split(b"\x00")
            if len(parts) != 3:
                raise _refused(mechanism)
            name, password = parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
        elif mechanism == "AMQPLAIN":
            try:
                _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
            except Exception as exc:
                raise _refused(mechanism) from exc
            name = _text(table.get("LOGIN"))
            password = _text(table.get("PASSWORD"))
        else:
            raise ConnectionError_(
                ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'", (10, 11)
            )
        user = self.users.get(name)
        if user is None or not check_password(password, user.password_hash):
            raise _refused(mechanism)
        if name in self.loopback_users and not loopback:
            raise ConnectionError_(
                ACCESS_REFUSED, f"User '{name}' can only connect via localhost", (10, 11)
            )
        return name

    def permissions(self, user: str, vhost: str) -> Permissions | None:
        return self.perms.get((user, vhost))


def _refused(mechanism: str) -> ConnectionError_:
    return ConnectionError_(
        ACCESS_REFUSED,
        f"Login was refused using authentication mechanism {mechanism}. "
        "For details see the broker logfile.",
        (10, 11),
    )


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)
