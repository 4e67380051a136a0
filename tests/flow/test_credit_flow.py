"""CreditFlow: grants, blocking, deferred grants, transitive blocking along a chain."""

from __future__ import annotations

from collections import deque

import pytest

from broker.flow.credit_flow import CreditFlow


class Actor:
    """A peer whose bumps are delivered immediately (a plain call)."""

    def __init__(self, name: str, initial: int = 4, more: int = 2) -> None:
        self.name = name
        self.credit_flow = CreditFlow(self, initial, more)
        self.events: list[str] = []
        self.credit_flow.on_blocked = lambda: self.events.append("blocked")
        self.credit_flow.on_unblocked = lambda: self.events.append("unblocked")

    def __repr__(self) -> str:
        return self.name


class MailboxActor(Actor):
    """A peer that posts bumps to its mailbox and handles them when it drains it."""

    def __init__(self, name: str, initial: int = 4, more: int = 2) -> None:
        super().__init__(name, initial, more)
        self.mailbox: deque[tuple[object, int]] = deque()
        self.credit_flow = CreditFlow(self, initial, more, deliver_bump=self._post)
        self.credit_flow.on_blocked = lambda: self.events.append("blocked")
        self.credit_flow.on_unblocked = lambda: self.events.append("unblocked")

    def _post(self, frm: object, n: int) -> None:
        self.mailbox.append((frm, n))

    def drain(self) -> None:
        while self.mailbox:
            frm, n = self.mailbox.popleft()
            self.credit_flow.handle_bump(frm, n)  # type: ignore[arg-type]


def test_defaults_are_current_rabbitmq() -> None:
    cf = CreditFlow(object())
    assert (cf.initial_credit, cf.more_credit_after) == (400, 200)


def test_rejects_non_positive_credit() -> None:
    with pytest.raises(ValueError):
        CreditFlow(object(), 0, 1)


def test_send_spends_credit_and_blocks_at_zero() -> None:
    a, b = Actor("a"), Actor("b")
    for _ in range(3):
        a.credit_flow.send(b)
    assert not a.credit_flow.blocked()
    assert a.credit_flow.credit_left(b) == 1
    a.credit_flow.send(b)
    assert a.credit_flow.blocked()
    assert a.credit_flow.blocked_by() == frozenset({b})
    assert a.events == ["blocked"]
    a.credit_flow.send(b)  # sending on while blocked is allowed: the credit goes negative
    assert a.credit_flow.credit_left(b) == -1


def test_ack_grants_every_more_credit_after_messages() -> None:
    a, b = Actor("a"), Actor("b")
    for _ in range(4):
        a.credit_flow.send(b)
    assert a.credit_flow.blocked()
    b.credit_flow.ack(a)
    assert a.credit_flow.blocked()  # one ack earns nothing yet
    b.credit_flow.ack(a)
    assert not a.credit_flow.blocked()
    assert a.credit_flow.credit_left(b) == 2
    assert a.events == ["blocked", "unblocked"]


def test_bump_that_leaves_credit_non_positive_keeps_blocked() -> None:
    a, b = Actor("a"), Actor("b")
    for _ in range(7):
        a.credit_flow.send(b)  # 4 credits, then 3 more sends: -3
    a.credit_flow.handle_bump(b, 2)
    assert a.credit_flow.blocked()
    a.credit_flow.handle_bump(b, 2)
    assert not a.credit_flow.blocked()
    assert a.credit_flow.credit_left(b) == 1


def test_send_many_equals_repeated_send() -> None:
    for n in range(0, 8):
        one, many, b = Actor("one"), Actor("many"), Actor("b")
        for _ in range(n):
            one.credit_flow.send(b)
        many.credit_flow.send_many(b, n)
        assert one.credit_flow.credit_left(b) == many.credit_flow.credit_left(b)
        assert one.credit_flow.blocked() == many.credit_flow.blocked() == (n >= 4)
        assert one.events == many.events


def test_ack_many_equals_repeated_ack() -> None:
    for n in range(0, 12):
        one, many = Actor("one"), Actor("many")
        src1, src2 = Actor("s1", initial=100), Actor("s2", initial=100)
        for _ in range(n):
            one.credit_flow.ack(src1)
        many.credit_flow.ack_many(src2, n)
        assert src1.credit_flow.credit_left(one) - 100 == src2.credit_flow.credit_left(many) - 100
        # the receive counters agree too: one more ack grants (or not) in both
        one.credit_flow.ack(src1)
        many.credit_flow.ack(src2)
        assert src1.credit_flow.credit_left(one) == src2.credit_flow.credit_left(many)


def test_grant_is_deferred_while_blocked_and_flushed_on_unblock() -> None:
    a, b, c = Actor("a"), Actor("b"), Actor("c")
    for _ in range(4):
        a.credit_flow.send(b)
        b.credit_flow.send(c)
    assert a.credit_flow.blocked() and b.credit_flow.blocked()
    b.credit_flow.ack_many(a, 4)  # b is blocked by c: a's credit is held back
    assert a.credit_flow.blocked()
    assert a.credit_flow.credit_left(b) == 0
    c.credit_flow.ack_many(b, 2)  # c grants b; b unblocks and pays a what it owed
    assert not b.credit_flow.blocked()
    assert not a.credit_flow.blocked()
    assert a.credit_flow.credit_left(b) == 4


def test_chain_of_three_blocks_the_first_when_the_last_stops_acking() -> None:
    reader, channel, queue = Actor("reader"), Actor("channel"), Actor("queue")
    in_queue: deque[object] = deque()

    def pump() -> None:
        """One message through reader -> channel -> queue; the queue keeps it unacked."""
        reader.credit_flow.send(channel)
        channel.credit_flow.ack(reader)  # the channel handled it...
        channel.credit_flow.send(queue)  # ...and passed it on
        in_queue.append(object())

    sent = 0
    while not reader.credit_flow.blocked():
        pump()
        sent += 1
        assert sent < 100, "the reader was never blocked"
    assert channel.credit_flow.blocked_by() == frozenset({queue})
    assert reader.credit_flow.blocked_by() == frozenset({channel})
    assert reader.events == ["blocked"]

    queue.credit_flow.ack_many(channel, len(in_queue))  # the queue catches up
    in_queue.clear()
    assert not channel.credit_flow.blocked()
    assert not reader.credit_flow.blocked()
    assert reader.events == ["blocked", "unblocked"]


def test_mailbox_delivery_waits_for_the_actor_to_drain() -> None:
    a, b = MailboxActor("a"), Actor("b")
    for _ in range(4):
        a.credit_flow.send(b)
    b.credit_flow.ack_many(a, 2)
    assert a.credit_flow.blocked()  # the bump is in a's mailbox, not yet handled
    assert a.mailbox == deque([(b, 2)])
    a.drain()
    assert not a.credit_flow.blocked()


def test_peer_down_unblocks_and_forgets_the_peer() -> None:
    a, b, up = Actor("a"), Actor("b"), Actor("up")
    up.credit_flow.send(a)
    for _ in range(4):
        a.credit_flow.send(b)
    a.credit_flow.ack_many(up, 2)  # deferred: a is blocked by b
    assert up.credit_flow.credit_left(a) == 3
    a.credit_flow.peer_down(b)
    assert not a.credit_flow.blocked()
    assert a.events == ["blocked", "unblocked"]
    assert a.credit_flow.credit_left(b) == 4  # a fresh peer with the same identity
    assert up.credit_flow.credit_left(a) == 5  # the deferred grant was paid


def test_peer_down_drops_grants_owed_to_the_dead_peer() -> None:
    a, b, dead = Actor("a"), Actor("b"), Actor("dead")
    dead.credit_flow.send(a)
    for _ in range(4):
        a.credit_flow.send(b)
    a.credit_flow.ack_many(dead, 2)
    a.credit_flow.peer_down(dead)
    a.credit_flow.handle_bump(b, 2)
    assert not a.credit_flow.blocked()
    assert dead.credit_flow.credit_left(a) == 3  # nothing was delivered to it


def test_unblocked_fires_once_when_the_last_blocker_goes() -> None:
    a, b, c = Actor("a"), Actor("b"), Actor("c")
    for _ in range(4):
        a.credit_flow.send(b)
        a.credit_flow.send(c)
    assert a.events == ["blocked"]
    a.credit_flow.handle_bump(b, 2)
    assert a.credit_flow.blocked_by() == frozenset({c})
    a.credit_flow.handle_bump(c, 2)
    assert a.events == ["blocked", "unblocked"]
