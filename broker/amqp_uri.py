"""AMQP URIs as the plugins that are AMQP clients of brokers (shovel, federation) take them: a
URI or a list of them, checked as RabbitMQ's amqp_uri parser would; a URI that names this
broker (`amqp://` with no host, or this node's port on loopback with no credentials) logged
in as a given user through the node's direct secret; URIs shown without their secrets; the
reconnect delays between sessions. Plain code, below every plugin, so no plugin imports
another."""

from __future__ import annotations

from urllib.parse import quote, unquote, urlsplit, urlunsplit

__all__ = ["LocalBroker", "ReconnectBackoff", "UriInvalid", "parse_uris", "redacted",
           "uri_vhost", "without_credentials"]

_LOOPBACK = ("localhost", "127.0.0.1", "::1")


class UriInvalid(ValueError):
    """A URI key refused; the text is the reason (the management API's 400)."""


def parse_uris(raw: object, key: str) -> tuple[str, ...]:
    """A plugin's URI key: one `amqp://` / `amqps://` URI or a non-empty list of them, each
    one RabbitMQ's parser would take (the texts are the shovel plugin's)."""
    uris = [raw] if isinstance(raw, str) else raw
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise UriInvalid(f"{key}: a URI or a non-empty list of URIs is required")
    for uri in uris:
        problem = _uri_problem(uri)
        if problem:
            raise UriInvalid(f'{key}: "{uri}" not a valid URI: {problem}')
    return tuple(uris)


def _uri_problem(uri: str) -> str | None:
    """What amqp_uri:parse would refuse: another scheme, a port that is no port, a broken
    host. Query parameters are left to the client."""
    try:
        parts = urlsplit(uri)
        port = parts.port  # raises on a port that is no number or out of range
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("amqp", "amqps"):
        return f"unexpected URI scheme {parts.scheme!r} (amqp or amqps)"
    if port == 0:
        return "port 0"
    if parts.path.count("/") > 1:
        return "the vhost must be one path segment (%2F for /)"
    return None


def uri_vhost(uri: str, default: str) -> str:
    """The vhost a URI names; `default` when it names none."""
    return unquote(urlsplit(uri).path[1:]) or default


class LocalBroker:
    """Where a URI naming this broker goes: `amqp://` with no host (the plugins' direct
    connection) or this node's own AMQP port on loopback with no credentials. The client
    connects to this broker's listener logged in as the user it acts for through the node's
    direct secret (AccessControl.direct_secret), so that user's permissions apply to
    everything it reads and writes, as RabbitMQ's direct connections for a user do."""

    def __init__(self, port: int, secret: str) -> None:
        self.port, self.secret = port, secret

    def is_local(self, uri: str) -> bool:
        parts = urlsplit(uri)
        if not parts.hostname:
            return True
        default_port = 5671 if parts.scheme == "amqps" else 5672
        return (parts.username is None and parts.scheme == "amqp"
                and parts.hostname in _LOOPBACK and (parts.port or default_port) == self.port)

    def resolve(self, uri: str, vhost: str, user: str) -> str:
        """The URL to connect with: `uri` itself unless it names this broker."""
        if not self.is_local(uri):
            return uri
        parts = urlsplit(uri)
        # the plugin's own vhost when the URI names none, as the plugin's direct connection
        path = parts.path if parts.path not in ("", "/") else "/" + quote(vhost, safe="")
        login = f"{quote(user, safe='')}:{quote(self.secret, safe='')}"
        netloc = f"{login}@127.0.0.1:{self.port}"
        return urlunsplit(("amqp", netloc, path, parts.query, ""))


def redacted(uri: str) -> str:
    """The URI with its password as `***` (the shovel plugin's status)."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def without_credentials(uri: str) -> str:
    """The URI with no user or password (the federation plugin's "safe" URI)."""
    parts = urlsplit(uri)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc))


class ReconnectBackoff:
    """The plugins' wait before a new session (`reconnect-delay`): the base delay, doubling
    after each failed session up to 30 s (or the base, if that is longer), back to the base
    after a session that made progress; a base of 0 means no reconnect (the plugins' 0)."""

    MAX_S = 30.0

    def __init__(self, base_s: float) -> None:
        self.base_s = base_s
        self._next_s = base_s

    def next_delay(self, progressed: bool) -> float | None:
        """The wait before the next session, or None for none."""
        if self.base_s == 0:
            return None
        if progressed:
            self._next_s = self.base_s
        delay = self._next_s
        self._next_s = min(delay * 2, max(self.MAX_S, self.base_s))
        return delay
