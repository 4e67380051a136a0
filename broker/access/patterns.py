"""Permission patterns as RabbitMQ matches them.

A pattern is a regular expression searched (not anchored) in a resource name, as Erlang's
`re:run`: `^app\\.` allows `app.orders`. An empty pattern means `^$` (RabbitMQ's
rabbit_auth_backend_internal does the same), which no resource name matches: names are never
empty, the default exchange is checked as `amq.default`. Topic patterns may name the
variables `{username}` and `{vhost}`, expanded before matching."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Permissions", "TopicPermission", "compile_pattern", "expand"]


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """The compiled pattern; `re.error` for a bad one (the caller's 400 / config error)."""
    return re.compile(pattern if pattern else "^$")


def expand(pattern: str, username: str, vhost: str) -> str:
    """RabbitMQ's topic permission variables."""
    return pattern.replace("{username}", username).replace("{vhost}", vhost)


@dataclass(slots=True, frozen=True)
class Permissions:
    """A user's configure / write / read patterns in one vhost."""

    configure: re.Pattern[str]
    write: re.Pattern[str]
    read: re.Pattern[str]
    source: tuple[str, str, str]  # the patterns as given

    @classmethod
    def of(cls, configure: str, write: str, read: str) -> Permissions:
        return cls(compile_pattern(configure), compile_pattern(write), compile_pattern(read),
                   (configure, write, read))

    def allows(self, permission: str, name: str) -> bool:
        pattern: re.Pattern[str] = getattr(self, permission)
        return pattern.search(name) is not None

    def patterns(self) -> tuple[str, str, str]:
        return self.source


@dataclass(slots=True, frozen=True)
class TopicPermission:
    """A user's write / read patterns on the routing keys of one topic exchange."""

    exchange: str
    write: str
    read: str

    @classmethod
    def of(cls, exchange: str, write: str, read: str) -> TopicPermission:
        for pattern in (write, read):  # refuse a bad pattern when it is set, not when used
            compile_pattern(expand(pattern, "", ""))
        return cls(exchange, write, read)

    def matcher(self, permission: str, username: str, vhost: str) -> re.Pattern[str]:
        return compile_pattern(expand(getattr(self, permission), username, vhost))
