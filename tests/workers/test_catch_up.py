"""A definition made through one worker is there for the next request on any other (RabbitMQ's
cluster writes its metadata in a transaction every node sees): a script's `PUT` of a vhost,
user or permission, then its connection or next request, may land on two workers. A worker
that has not applied the change from its watch yet catches up with the parent's store before
it refuses. The lag is made certain here by stopping the other worker (SIGSTOP) while the
definition is written (its connections made while the first was stopped): its watch then
holds the change while the request comes in."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

from pamqp import commands

from tests.access.helpers import PASSWORD, q, unique
from tests.amqp_raw import PROTOCOL_HEADER, RawClient
from tests.workers.helpers import WorkersBroker


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _tuned(b: WorkersBroker, user: str, password: str) -> RawClient:
    """A connection logged in and tuned: its connection.open is what decides."""
    c = RawClient(b.port, timeout=10)
    c.send(PROTOCOL_HEADER)
    c.expect(commands.Connection.Start, 0)
    c.send_method(0, commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response=f"\0{user}\0{password}",
        locale="en_US"))
    tune = c.expect(commands.Connection.Tune, 0, timeout=10)
    c.send_method(0, commands.Connection.TuneOk(channel_max=tune.channel_max,
                                                frame_max=131072, heartbeat=0))
    return c


def _opened(conns: list[RawClient]) -> list[str]:
    """Each connection's answer to its connection.open."""
    answers = []
    for c in conns:
        got = c.recv_frame(10)
        assert got is not None, "closed without an answer"
        answers.append(getattr(got[1], "reply_text", type(got[1]).__name__))
        c.close()
    return answers


def test_a_vhost_made_on_one_worker_opens_on_the_other(two: WorkersBroker) -> None:
    # made while worker 1 is stopped, every connection is worker 2's; the vhost is made while
    # worker 2 is stopped, so worker 1 makes it
    with _stopped(two.workers()[1]):
        conns = [_tuned(two, "guest", "guest") for _ in range(4)]
    vhost = unique("late")
    with _stopped(two.workers()[2]):
        assert two.api("PUT", f"/api/vhosts/{q(vhost)}", {})[0] == 201
        for c in conns:
            c.send_method(0, commands.Connection.Open(virtual_host=vhost))
        time.sleep(0.2)  # the parent's watch event and the opens both wait in its sockets
    assert _opened(conns) == ["OpenOk"] * 4


def test_a_user_made_on_one_worker_logs_in_on_the_other(two: WorkersBroker) -> None:
    user = unique("late")
    with _stopped(two.workers()[1]):
        conns = [RawClient(two.port, timeout=10) for _ in range(4)]
        for c in conns:
            c.send(PROTOCOL_HEADER)
            c.expect(commands.Connection.Start, 0)
    with _stopped(two.workers()[2]):
        assert two.api("PUT", f"/api/users/{user}", {"password": PASSWORD, "tags": ""})[0] == 201
        assert two.api("PUT", f"/api/permissions/%2F/{user}",
                       {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
        for c in conns:
            c.send_method(0, commands.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response=f"\0{user}\0{PASSWORD}",
                locale="en_US"))
        time.sleep(0.2)
    answers = []
    for c in conns:
        got = c.recv_frame(10)
        answers.append("closed" if got is None else type(got[1]).__name__)
        c.close()
    assert answers == ["Tune"] * 4


def test_a_wrong_password_is_still_refused_on_every_worker(two: WorkersBroker) -> None:
    """Catching up brings nothing new: the refusal stands, as before."""
    for _ in range(6):
        c = RawClient(two.port, timeout=10)
        c.send(PROTOCOL_HEADER)
        c.expect(commands.Connection.Start, 0)
        c.send_method(0, commands.Connection.StartOk(
            client_properties={}, mechanism="PLAIN", response="\0guest\0wrong",
            locale="en_US"))
        got = c.recv_frame(10)
        assert got is None or isinstance(got[1], commands.Connection.Close), got
        c.close()

