"""The node's access control: logins through the configured backends, the permission checks
every AMQP method and management request goes through, and the login counters.

Checks raise RabbitMQ's errors: `AccessRefused` (403 ACCESS_REFUSED on the channel; the
management API turns it into 401) and `LoginRefused` (connection.close 403 / HTTP 401).
`Pending` means a backend must be asked over the network first: the caller awaits
`pending.wait()` and runs the same operation again, which then finds the answer cached."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from broker.access.backends import Backend, LoginResult, Principal, Query, login_query
from broker.access.mechanisms import Credentials
from broker.access.users import UserDB
from broker.config.values import CertLoginFrom
from broker.protocol.constants import ACCESS_REFUSED
from broker.protocol.errors import ChannelError

__all__ = ["AccessControl", "AccessRefused", "AuthAttempts", "LoginRefused", "Pending"]

log = structlog.get_logger("hare.auth")


class AccessRefused(ChannelError):
    """A permission check said no (403 on a channel, 401 over HTTP)."""

    def __init__(self, text: str) -> None:
        super().__init__(ACCESS_REFUSED, text)


class LoginRefused(Exception):
    """Wrong credentials, an unknown user, a backend that failed, or a loopback-only user
    from elsewhere. `reason` is for the log; clients get RabbitMQ's fixed texts."""

    def __init__(self, username: str, reason: str, *, loopback_only: bool = False) -> None:
        super().__init__(reason)
        self.username = username
        self.reason = reason
        self.loopback_only = loopback_only


class Pending(Exception):
    """The answer must be fetched: await `wait()`, then run the operation again."""

    def __init__(self, backend: Backend, query: Query) -> None:
        super().__init__(query[0])
        self.backend = backend
        self.query = query

    async def wait(self) -> None:
        await self.backend.fetch(self.query)


@dataclass(slots=True)
class AuthAttempts:
    """Login attempts of one protocol (RabbitMQ's auth_attempts metrics)."""

    attempts: int = 0
    failed: int = 0
    succeeded: int = 0


class AccessControl:
    def __init__(self, users: UserDB, backends: list[Backend],
                 loopback_users: tuple[str, ...] | list[str] = ("guest",), *,
                 mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN"),
                 cert_login_from: CertLoginFrom = CertLoginFrom.COMMON_NAME) -> None:
        self.users = users
        self.backends = backends
        self.loopback_users = set(loopback_users)
        self.mechanisms = mechanisms  # `auth_mechanisms`
        self.cert_login_from = cert_login_from
        self.attempts = {"amqp091": AuthAttempts(), "http": AuthAttempts()}
        # The password of the node's own AMQP clients (shovels), RabbitMQ's direct
        # connections: over loopback it logs in as any existing user without that user's
        # password, so a shovel acts as the user who defined it. Random per start, in memory
        # only, never logged (a multi-worker server's workers share one: cli.py).
        self.direct_secret = secrets.token_urlsafe(32)

    # -- login ------------------------------------------------------------------------------
    def login(self, credentials: Credentials, *, mechanism: str, peer: str, loopback: bool,
              protocol: str = "amqp091") -> Principal | Coroutine[Any, Any, Principal]:
        """The principal, or (when a backend must be asked over the network) a coroutine
        that returns it. Raises (or the coroutine raises) LoginRefused, logged and counted;
        the password never reaches a log line."""
        if (protocol == "amqp091" and loopback and credentials.password is not None
                and hmac.compare_digest(credentials.password, self.direct_secret)):
            credentials = Credentials.verified(credentials.username)  # the backends check
            # only that the user exists, as for EXTERNAL
        query, password = login_query(credentials.username, credentials.password)
        reasons: list[str] = []
        for i, backend in enumerate(self.backends):
            result: LoginResult | None = backend.decide(query, password)
            if result is None:
                return self._login_async(i, query, password, reasons, mechanism, peer,
                                         loopback, protocol)
            if result.allowed:
                return self._granted(backend, credentials.username, result, mechanism, peer,
                                     loopback, protocol)
            reasons.append(f"{backend.name}: {result.reason}")
        raise self._refused(credentials.username, "; ".join(reasons), mechanism, peer,
                            protocol)

    async def _login_async(self, start: int, query: Query, password: str | None,
                           reasons: list[str], mechanism: str, peer: str, loopback: bool,
                           protocol: str) -> Principal:
        username = query[1]
        for backend in self.backends[start:]:
            result = backend.decide(query, password)
            if result is None:
                await backend.fetch(query, password)
                result = backend.decide(query, password)
            if result is not None and result.allowed:
                return self._granted(backend, username, result, mechanism, peer, loopback,
                                     protocol)
            reasons.append(f"{backend.name}: {result.reason if result else 'no answer'}")
        raise self._refused(username, "; ".join(reasons), mechanism, peer, protocol)

    def _granted(self, backend: Backend, username: str, result: LoginResult, mechanism: str,
                 peer: str, loopback: bool, protocol: str) -> Principal:
        if username in self.loopback_users and not loopback:
            raise self._refused(username, "loopback-only user connecting remotely", mechanism,
                                peer, protocol, loopback_only=True)
        counts = self.attempts[protocol]
        counts.attempts += 1
        counts.succeeded += 1
        return Principal(username, result.tags, backend)

    def refused_before_login(self, username: str, reason: str, mechanism: str, peer: str,
                             protocol: str = "amqp091") -> LoginRefused:
        """A login that failed before any backend was asked (an unreadable response)."""
        return self._refused(username, reason, mechanism, peer, protocol)

    def _refused(self, username: str, reason: str, mechanism: str, peer: str, protocol: str,
                 *, loopback_only: bool = False) -> LoginRefused:
        counts = self.attempts[protocol]
        counts.attempts += 1
        counts.failed += 1
        log.warning("login refused", user=username, mechanism=mechanism, peer=peer,
                    protocol=protocol, reason=reason)
        return LoginRefused(username, reason, loopback_only=loopback_only)

    # -- authorisation ----------------------------------------------------------------------
    def _ask(self, principal: Principal, query: Query) -> Any:
        answer = principal.backend.decide(query)
        if answer is None:
            raise Pending(principal.backend, query)
        return answer

    def vhost_allowed(self, principal: Principal, vhost: str, ip: str = "") -> bool:
        return bool(self._ask(principal, ("vhost", principal.name, vhost, ip)))

    def check_resource(self, principal: Principal, vhost: str, kind: str, name: str,
                       permission: str) -> None:
        """`kind` exchange or queue; `permission` configure, write or read. The default
        exchange is checked as 'amq.default', as RabbitMQ does."""
        name = name or "amq.default"
        if not self._ask(principal, ("resource", principal.name, vhost, kind, name, permission)):
            raise AccessRefused(f"access to {kind} '{name}' in vhost '{vhost}' refused for "
                                f"user '{principal.name}'")

    def check_declare(self, principal: Principal, vhost: str, kind: str, name: str,
                      arguments: dict[str, Any] | None, *, new: bool) -> None:
        """Declaring an exchange or queue: configure on it and, when it is new and names an
        alternate or dead-letter exchange, read on it and write on that exchange (the broker
        will publish there on the user's behalf). RabbitMQ checks these at declare, before
        anything exists, so a refusal leaves nothing behind."""
        self.check_resource(principal, vhost, kind, name, "configure")
        if new:
            target = _exchange_argument(arguments, _TARGET_ARGUMENT[kind])
            if target is not None:
                self.check_resource(principal, vhost, kind, name, "read")
                self.check_resource(principal, vhost, "exchange", target, "write")

    def check_policy_definition(self, principal: Principal, vhost: str,
                                definition: dict[str, Any]) -> None:
        """Whoever sets a policy needs the permissions its effect needs: write on the
        dead-letter and alternate exchanges it names (messages will be published there)."""
        for key in ("dead-letter-exchange", "alternate-exchange"):
            target = _exchange_argument(definition, key)
            if target is not None:
                self.check_resource(principal, vhost, "exchange", target, "write")

    def topic_checked(self, principal: Principal, vhost: str, exchange: str) -> bool:
        return principal.backend.topic_checked(principal.name, vhost, exchange)

    def check_topic(self, principal: Principal, vhost: str, exchange: str, routing_key: str,
                    permission: str) -> None:
        """A routing key on a topic exchange (write: publish, read: bind from it)."""
        query = ("topic", principal.name, vhost, exchange, routing_key, permission)
        if not self._ask(principal, query):
            raise AccessRefused(f"access to topic '{routing_key}' in exchange '{exchange}' in "
                                f"vhost '{vhost}' refused for user '{principal.name}'")

    async def settle(self, check: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a check, fetching what it needs first (for callers that may await: the
        management API)."""
        while True:
            try:
                return check(*args, **kwargs)
            except Pending as pending:
                await pending.wait()

    async def close(self) -> None:
        for backend in self.backends:
            close = getattr(backend, "close", None)
            if close is not None:
                await close()


# The argument of a new queue / exchange that names an exchange the broker publishes into.
_TARGET_ARGUMENT = {"queue": "x-dead-letter-exchange", "exchange": "alternate-exchange"}


def _exchange_argument(arguments: dict[str, Any] | None, key: str) -> str | None:
    value = (arguments or {}).get(key)
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) else None
