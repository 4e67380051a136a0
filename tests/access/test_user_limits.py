"""User limits: max-connections and max-channels, refused as RabbitMQ 3.10.8 refuses them
(530 NOT_ALLOWED on connection.open / channel.open, with its texts), set over HTTP."""

from __future__ import annotations

import pika
import pytest

from tests.mgmt.helpers import MgmtBroker

from .helpers import connect, make_user


def _limit(mgmt: MgmtBroker, user: str, name: str, value: object) -> tuple[int, object]:
    return mgmt.api("PUT", f"/api/user-limits/{user}/{name}", {"value": value})


def test_max_connections(mgmt: MgmtBroker) -> None:
    user = make_user(mgmt, "lim", perms={"/": (".*", ".*", ".*")})
    assert _limit(mgmt, user, "max-connections", 1)[0] == 204
    first = connect(mgmt, user)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(mgmt, user)
    assert (f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (1) "
            "is reached") in str(info.value)
    first.close()
    connect(mgmt, user).close()  # the slot is free again
    assert _limit(mgmt, user, "max-connections", 0)[0] == 204
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        connect(mgmt, user)
    assert mgmt.api("DELETE", f"/api/user-limits/{user}/max-connections")[0] == 204
    connect(mgmt, user).close()


def test_max_channels_counts_every_connection_of_the_user(mgmt: MgmtBroker) -> None:
    user = make_user(mgmt, "lim", perms={"/": (".*", ".*", ".*")})
    assert _limit(mgmt, user, "max-channels", 2)[0] == 204
    one, two = connect(mgmt, user), connect(mgmt, user)
    one.channel()
    two.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        two.channel()
    assert info.value.reply_code == 530
    assert info.value.reply_text == (f"NOT_ALLOWED - number of channels opened for user "
                                     f"'{user}' has reached the maximum allowed user limit of (2)")
    # the refused connection's channel went with it: the user is back to one
    one.channel().queue_declare("", exclusive=True)
    assert mgmt.get(f"/api/user-limits/{user}") == [{"user": user,
                                                    "value": {"max-channels": 2}}]
    assert mgmt.get(f"/api/users/{user}")["limits"] == {"max-channels": 2}


def test_bad_limits_are_refused(mgmt: MgmtBroker) -> None:
    user = make_user(mgmt, "lim")
    status, body = _limit(mgmt, user, "max-connections", "x")
    assert status == 400 and "max-connections should be a number" in body["reason"]
    status, body = _limit(mgmt, user, "max-bogus", 5)
    assert status == 400 and "Unrecognised terms" in body["reason"]
    assert _limit(mgmt, "nobody-here", "max-connections", 5)[0] == 400
    assert mgmt.api("PUT", f"/api/user-limits/{user}/max-channels", {})[0] == 400
    assert mgmt.get(f"/api/user-limits/{user}") == []
    assert mgmt.api("GET", "/api/user-limits/nobody-here")[0] == 404
