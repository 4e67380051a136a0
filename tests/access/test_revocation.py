"""Revoking access takes effect on open connections: a deleted user or vhost is closed with
320 and RabbitMQ's reason; a cleared or narrowed permission holds from the next operation on
every open channel (publishes included: the per-channel cache follows the permissions'
generation) and on new channels; a new password leaves open connections alone."""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ProbableAuthenticationError

from tests.mgmt.helpers import MgmtBroker

from .helpers import (
    PASSWORD,
    closed_with,
    connect,
    make_user,
    make_vhost,
    q,
    refused,
    set_permissions,
)


def test_deleting_a_user_closes_its_connections(mgmt: MgmtBroker) -> None:
    victim = make_user(mgmt, "victim", perms={"/": (".*", ".*", ".*")})
    bystander = make_user(mgmt, "bystander", perms={"/": (".*", ".*", ".*")})
    first, second = connect(mgmt, victim), connect(mgmt, victim)
    first.channel()
    other = connect(mgmt, bystander)
    assert mgmt.api("DELETE", f"/api/users/{victim}")[0] == 204
    for conn in (first, second):
        closed = closed_with(conn, 320)
        assert closed.reply_text == f"CONNECTION_FORCED - user '{victim}' is deleted"
    other.channel().queue_declare("", exclusive=True)  # the others carry on


def test_deleting_a_vhost_closes_its_connections(mgmt: MgmtBroker) -> None:
    vhost = make_vhost(mgmt)
    conn = connect(mgmt, vhost=vhost)
    elsewhere = connect(mgmt)
    assert mgmt.api("DELETE", f"/api/vhosts/{q(vhost)}")[0] == 204
    closed = closed_with(conn, 320)
    assert closed.reply_text == f"CONNECTION_FORCED - vhost '{vhost}' is deleted"
    elsewhere.channel().queue_declare("", exclusive=True)


def test_cleared_permissions_apply_to_open_and_new_channels(mgmt: MgmtBroker) -> None:
    user = make_user(mgmt, "rev", perms={"/": (".*", ".*", ".*")})
    conn = connect(mgmt, user)
    ch = conn.channel()
    ch.queue_declare("rev-" + user, auto_delete=False)
    ch.basic_publish("", "rev-" + user, b"x")
    assert mgmt.api("DELETE", f"/api/permissions/%2F/{user}")[0] == 204
    refused(ch, lambda c: c.basic_get("rev-" + user),
            f"access to queue 'rev-{user}' in vhost '/' refused for user '{user}'")
    fresh = conn.channel()  # channel.open itself is allowed, as RabbitMQ
    refused(fresh, lambda c: c.basic_publish("", "rev-" + user, b"y"),
            "access to exchange 'amq.default'")
    assert conn.is_open  # the connection stays: only operations are refused
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect(mgmt, user)  # and a new connection.open is refused
    connect(mgmt).channel().queue_delete("rev-" + user)


def test_narrowed_write_stops_publishes_on_an_open_channel(mgmt: MgmtBroker) -> None:
    user = make_user(mgmt, "narrow", perms={"/": (".*", ".*", ".*")})
    conn = connect(mgmt, user)
    ch = conn.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"cached")  # the write check is now cached on the channel
    set_permissions(mgmt, user, "/", ".*", "^nothing-here$", ".*")
    # RabbitMQ 3.10.8 keeps publishing on this channel (its permission cache outlives the
    # change); Hare drops the cache when the permissions change
    refused(ch, lambda c: c.basic_publish("", queue, b"refused"),
            f"access to exchange 'amq.default' in vhost '/' refused for user '{user}'")


def test_a_new_password_leaves_open_connections_alone(mgmt: MgmtBroker) -> None:
    user = make_user(mgmt, "pw", perms={"/": (".*", ".*", ".*")})
    conn = connect(mgmt, user)
    ch = conn.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    assert mgmt.api("PUT", f"/api/users/{user}", {"password": "new-one"})[0] == 204
    ch.basic_publish("", queue, b"still open")
    assert ch.basic_get(queue, auto_ack=True)[2] == b"still open"
    conn.channel()
    with pytest.raises(ProbableAuthenticationError):
        connect(mgmt, user, PASSWORD)
    connect(mgmt, user, "new-one").close()
