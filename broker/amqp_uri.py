"""AMQP URIs as the plugins that are AMQP clients of brokers take them: a URI or a list of
them, `amqp://` with no host meaning this broker, URIs shown without credentials. Plain code,
below every plugin, so no plugin imports another. The federation plugin uses it; the shovel
plugin still has its own copy (broker/shovel/worker.py, definition.py), left alone while its
URI handling is being reworked on another branch (logins as the defining user), to be joined
here once both are merged."""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit

__all__ = ["LocalBroker", "UriInvalid", "parse_uris", "without_credentials"]


class UriInvalid(ValueError):
    """A URI key refused; the text is the reason (the management API's 400)."""


def parse_uris(raw: object, key: str) -> tuple[str, ...]:
    """The plugins' `uri` keys: one `amqp://` / `amqps://` URI or a non-empty list of them."""
    uris = [raw] if isinstance(raw, str) else raw
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise UriInvalid(f"{key}: a URI or a non-empty list of URIs is required")
    for uri in uris:
        if urlsplit(uri).scheme not in ("amqp", "amqps"):
            raise UriInvalid(f"{key}: {uri!r} is not an amqp:// or amqps:// URI")
    return tuple(uris)


class LocalBroker:
    """Where `amqp://` with no host goes (the plugins' direct connection): this broker's own
    AMQP listener, logged in as the node's default user."""

    def __init__(self, port: int, user: str, password: str) -> None:
        self.port, self.user, self.password = port, user, password

    def resolve(self, uri: str, vhost: str) -> str:
        parts = urlsplit(uri)
        if parts.hostname:
            return uri
        # the plugin's own vhost when the URI names none, as the plugin's direct connection
        path = parts.path if parts.path not in ("", "/") else "/" + quote(vhost, safe="")
        login = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}"
        netloc = f"{login}@127.0.0.1:{self.port}"
        return urlunsplit(("amqp", netloc, path, parts.query, ""))


def without_credentials(uri: str) -> str:
    """The URI with no user or password (the federation plugin's "safe" URI)."""
    parts = urlsplit(uri)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc))
