"""The internal user database (RabbitMQ's rabbit_auth_backend_internal data): users with
password hashes, tags and limits; permissions per (user, vhost); topic permissions per
(user, vhost, exchange).

Every change that can narrow what an open connection may do bumps `generation`: channels
keep a cache of the exchanges they may publish to and drop it when the generation moves, so a
revoked permission holds from the next operation on every open channel. Memory only: the
management API writes the same changes to the definitions database."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.access.patterns import Permissions, TopicPermission
from broker.config import hash_password

__all__ = ["LIMITS", "User", "UserDB"]

# RabbitMQ's user limits; -1 (or no entry) is unlimited.
LIMITS = ("max-connections", "max-channels")


@dataclass(slots=True)
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)


class UserDB:
    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.perms: dict[tuple[str, str], Permissions] = {}
        self.topic_perms: dict[tuple[str, str], dict[str, TopicPermission]] = {}
        self.generation = 0

    def _changed(self) -> None:
        self.generation += 1

    # -- users ------------------------------------------------------------------------------
    def add_user(self, name: str, password: str | None = None, *, password_hash: str = "",
                 tags: list[str] | None = None) -> User:
        """Create or replace a user; its limits survive a replacement (a password or tag
        change is not a new user)."""
        if password is not None:
            password_hash = hash_password(password)
        old = self.users.get(name)
        user = User(name, password_hash, list(tags or []), dict(old.limits) if old else {})
        self.users[name] = user
        self._changed()  # tags (impersonator) are read by open channels
        return user

    def delete_user(self, name: str) -> bool:
        if self.users.pop(name, None) is None:
            return False
        for key in [k for k in self.perms if k[0] == name]:
            del self.perms[key]
        for key in [k for k in self.topic_perms if k[0] == name]:
            del self.topic_perms[key]
        self._changed()
        return True

    def limit(self, user: str, name: str) -> int:
        """The user's limit `name`, -1 when it has none."""
        found = self.users.get(user)
        return -1 if found is None else found.limits.get(name, -1)

    def set_limit(self, user: str, name: str, value: int) -> None:
        self.users[user].limits[name] = value

    def clear_limit(self, user: str, name: str) -> bool:
        """`name` "all" clears every limit, as rabbitmqctl clear_user_limits."""
        limits = self.users[user].limits
        if name == "all":
            had = bool(limits)
            limits.clear()
            return had
        return limits.pop(name, None) is not None

    # -- permissions ------------------------------------------------------------------------
    def set_permissions(self, user: str, vhost: str, configure: str, write: str,
                        read: str) -> None:
        self.perms[(user, vhost)] = Permissions.of(configure, write, read)
        self._changed()

    def clear_permissions(self, user: str, vhost: str) -> bool:
        found = self.perms.pop((user, vhost), None) is not None
        self._changed()
        return found

    def permissions(self, user: str, vhost: str) -> Permissions | None:
        return self.perms.get((user, vhost))

    def set_topic_permission(self, user: str, vhost: str, exchange: str, write: str,
                             read: str) -> None:
        perm = TopicPermission.of(exchange, write, read)
        self.topic_perms.setdefault((user, vhost), {})[exchange] = perm
        self._changed()

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> bool:
        """All of the user's topic permissions in the vhost, or the one on `exchange`."""
        per_exchange = self.topic_perms.get((user, vhost))
        if not per_exchange:
            return False
        if exchange is None:
            del self.topic_perms[(user, vhost)]
        elif per_exchange.pop(exchange, None) is None:
            return False
        elif not per_exchange:
            del self.topic_perms[(user, vhost)]
        self._changed()
        return True

    def topic_permission(self, user: str, vhost: str, exchange: str) -> TopicPermission | None:
        per_exchange = self.topic_perms.get((user, vhost))
        return None if per_exchange is None else per_exchange.get(exchange)

    def vhost_deleted(self, vhost: str) -> None:
        for key in [k for k in self.perms if k[1] == vhost]:
            del self.perms[key]
        for key in [k for k in self.topic_perms if k[1] == vhost]:
            del self.topic_perms[key]
        self._changed()
