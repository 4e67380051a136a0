"""User and vhost limits hold for the whole multi-worker server, whichever worker each
connection lands on (RabbitMQ counts them across its cluster)."""

from __future__ import annotations

from functools import partial

import pika
import pytest

from tests.access.helpers import connect, make_user, make_vhost, q
from tests.workers.helpers import WorkersBroker, one_per_worker


def _refused(opener: partial[pika.BlockingConnection], text: str) -> None:
    """Every attempt is refused, on whichever worker it lands (ten tries: both, surely)."""
    for _ in range(10):
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
            opener().close()
        assert text in str(info.value)


def test_user_max_connections_counts_every_worker(two: WorkersBroker) -> None:
    user = make_user(two, "lim", perms={"/": (".*", ".*", ".*")})
    assert two.api("PUT", f"/api/user-limits/{user}/max-connections", {"value": 2})[0] == 204
    opener = partial(connect, two, user)
    conns = one_per_worker(two, opener)  # one connection of the user on each worker
    _refused(opener, f"connection refused for user '{user}': user connection limit (2) "
                     "is reached")
    conns.popitem()[1].close()
    opener().close()  # a slot is free again
    for conn in conns.values():
        conn.close()


def test_user_max_channels_counts_every_worker(two: WorkersBroker) -> None:
    user = make_user(two, "lim", perms={"/": (".*", ".*", ".*")})
    assert two.api("PUT", f"/api/user-limits/{user}/max-channels", {"value": 2})[0] == 204
    conns = one_per_worker(two, partial(connect, two, user))  # a channel open on each
    first, second = conns.values()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        first.channel()  # its worker has one channel of the user, the other worker one more
    assert info.value.reply_code == 530
    assert info.value.reply_text == (
        f"NOT_ALLOWED - number of channels opened for user '{user}' has reached the "
        "maximum allowed user limit of (2)")
    second.channel()  # the refused connection's channel went with it
    second.close()


def test_vhost_max_connections_counts_every_worker(two: WorkersBroker) -> None:
    vhost = make_vhost(two)
    assert two.api("PUT", f"/api/vhost-limits/{q(vhost)}/max-connections",
                   {"value": 2})[0] == 204
    opener = partial(connect, two, "guest", vhost=vhost)
    conns = one_per_worker(two, opener)
    _refused(opener, f"access to vhost '{vhost}' refused for user 'guest': connection limit "
                     "(2) is reached")
    conns.popitem()[1].close()
    opener().close()
    for conn in conns.values():
        conn.close()


def test_vhost_max_queues_counts_every_worker(two: WorkersBroker) -> None:
    """Every worker knows every queue (its home's or a RemoteQueue), so the queue limit
    counts the whole server's."""
    vhost = make_vhost(two)
    opener = partial(connect, two, "guest", vhost=vhost)
    conns = one_per_worker(two, opener)  # one exclusive probe queue declared on each
    assert two.api("PUT", f"/api/vhost-limits/{q(vhost)}/max-queues", {"value": 3})[0] == 204
    first, second = conns.values()
    first.channel().queue_declare("third")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        second.channel().queue_declare("fourth")
    assert info.value.reply_code == 406
    assert "queue limit in vhost" in info.value.reply_text
    for conn in conns.values():
        conn.close()
