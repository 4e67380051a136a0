"""Users with narrow permissions, made over the management API, and pika connections as them."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from tests.mgmt.helpers import MgmtBroker

PASSWORD = "pw-" + uuid.uuid4().hex[:6]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def q(name: str) -> str:
    return quote(name, safe="")


def make_user(mgmt: MgmtBroker, prefix: str = "u", *, tags: str = "",
              perms: dict[str, tuple[str, str, str]] | None = None) -> str:
    """A new user with PASSWORD, the tags and {vhost: (configure, write, read)}."""
    name = unique(prefix)
    assert mgmt.api("PUT", f"/api/users/{name}", {"password": PASSWORD, "tags": tags})[0] == 201
    for vhost, (configure, write, read) in (perms or {}).items():
        set_permissions(mgmt, name, vhost, configure, write, read)
    return name


def set_permissions(mgmt: MgmtBroker, user: str, vhost: str, configure: str, write: str,
                    read: str) -> None:
    status, _ = mgmt.api("PUT", f"/api/permissions/{q(vhost)}/{user}",
                         {"configure": configure, "write": write, "read": read})
    assert status in (201, 204)


def make_vhost(mgmt: MgmtBroker) -> str:
    name = unique("vh")
    assert mgmt.api("PUT", f"/api/vhosts/{q(name)}", {})[0] == 201  # guest gets .* .* .*
    return name


def connect(mgmt: MgmtBroker, user: str = "guest", password: str | None = None,
            vhost: str = "/") -> pika.BlockingConnection:
    password = password if password is not None else ("guest" if user == "guest" else PASSWORD)
    params = pika.ConnectionParameters("127.0.0.1", mgmt.port, vhost,
                                       pika.PlainCredentials(user, password),
                                       connection_attempts=1, socket_timeout=5,
                                       blocked_connection_timeout=5)
    return pika.BlockingConnection(params)


def refused(ch: BlockingChannel, call: Callable[[BlockingChannel], Any],
            text: str = "") -> ChannelClosedByBroker:
    """`call` on the channel ends in channel.close 403 whose text contains `text`."""
    with pytest.raises(ChannelClosedByBroker) as info:
        call(ch)
        # a publish is refused asynchronously: a round trip on the same channel ends in the
        # channel.close the broker sent before answering it
        ch.basic_qos(prefetch_count=0)
    assert info.value.reply_code == 403, info.value
    assert text in info.value.reply_text, info.value
    return info.value


def closed_with(conn: pika.BlockingConnection, code: int, timeout: float = 5.0
                ) -> ConnectionClosedByBroker:
    """Wait for the broker's connection.close."""
    with pytest.raises(ConnectionClosedByBroker) as info:
        for _ in range(int(timeout * 10)):
            conn.process_data_events(0.1)
    assert info.value.reply_code == code, info.value
    return info.value
