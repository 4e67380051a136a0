"""Authentication and authorisation backends, as RabbitMQ's auth_backends: each answers who
may log in (and with which tags), which vhosts a user may open, and which resources and
routing keys it may configure, write or read.

A backend answers synchronously when it can (`decide`) and returns None when it must ask
elsewhere first (`fetch`, awaited by the caller, then `decide` again). The internal backend
always answers at once; the HTTP backend answers from its cache and fetches on a miss. So the
broker's hot paths stay synchronous and only a cache miss costs an await.

Queries are tuples, so a backend can cache them as they are:
    ("user", username, password_digest)          -> LoginResult
    ("vhost", username, vhost, ip)               -> bool
    ("resource", username, vhost, kind, name, permission) -> bool
    ("topic", username, vhost, exchange, routing_key, permission) -> bool
`password_digest` is a SHA-256 of the password (None: the client proved its identity some
other way, e.g. a verified TLS certificate with EXTERNAL); the password itself never lands in
a cache key or a log."""

from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass
from typing import Any

from broker.access.users import UserDB
from broker.config import check_password

__all__ = [
    "Backend",
    "InternalBackend",
    "LoginResult",
    "Principal",
    "Query",
    "login_query",
]

Query = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class LoginResult:
    allowed: bool
    tags: tuple[str, ...] = ()
    reason: str = ""  # why not, for the log line (never shown to the client)


@dataclass(frozen=True, slots=True, eq=False)
class Principal:
    """Who is logged in and which backend answers for them (RabbitMQ's #user{})."""

    name: str
    tags: tuple[str, ...]
    backend: Backend


def login_query(username: str, password: str | None) -> tuple[Query, str | None]:
    """The login query (with a digest in place of the password) and the password itself,
    which only the backend that checks it gets."""
    digest = None if password is None else hashlib.sha256(password.encode()).hexdigest()
    return ("user", username, digest), password


class Backend(abc.ABC):
    name: str

    @property
    @abc.abstractmethod
    def generation(self) -> int:
        """Changes whenever answers this backend gave may no longer hold (channels drop their
        permission caches when it moves)."""

    @abc.abstractmethod
    def decide(self, query: Query, password: str | None = None) -> Any:
        """The answer, or None when it must be fetched first."""

    async def fetch(self, query: Query, password: str | None = None) -> None:  # noqa: B027
        """Make the next `decide(query)` answer (a backend that always answers has nothing
        to do, hence no abstract method)."""

    def topic_checked(self, username: str, vhost: str, exchange: str) -> bool:
        """Whether publishes to and bindings from this topic exchange need a routing-key
        check at all (so channels skip it where nothing could refuse)."""
        return True


class InternalBackend(Backend):
    """The broker's own users (rabbit_auth_backend_internal)."""

    name = "internal"

    def __init__(self, users: UserDB) -> None:
        self.users = users

    @property
    def generation(self) -> int:
        return self.users.generation

    def decide(self, query: Query, password: str | None = None) -> Any:
        kind = query[0]
        users = self.users
        if kind == "resource":
            _, username, vhost, _, name, permission = query
            perms = users.perms.get((username, vhost))
            return perms is not None and perms.allows(permission, name)
        if kind == "topic":
            _, username, vhost, exchange, routing_key, permission = query
            topic = users.topic_permission(username, vhost, exchange)
            if topic is None:  # no topic permission on this exchange: keys are not checked
                return True
            return topic.matcher(permission, username, vhost).search(routing_key) is not None
        if kind == "vhost":
            return (query[1], query[2]) in users.perms
        if kind == "user":
            user = users.users.get(query[1])
            # RabbitMQ's text for both: which of the two it was stays unsaid
            refused = LoginResult(False, reason=f"user '{query[1]}' - invalid credentials")
            if user is None:
                return refused
            # no password: the mechanism (EXTERNAL) proved who this is; the user must exist
            if password is not None and not check_password(password, user.password_hash):
                return refused
            return LoginResult(True, tuple(user.tags))
        raise ValueError(f"unknown query {kind!r}")

    def topic_checked(self, username: str, vhost: str, exchange: str) -> bool:
        return self.users.topic_permission(username, vhost, exchange) is not None
