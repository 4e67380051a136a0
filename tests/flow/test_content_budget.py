"""ContentBudget: who stops reading when incomplete message bodies hold too much, node-wide."""

from __future__ import annotations

import pytest

from broker.flow.content_budget import ContentBudget


class Holder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.content_held = 0
        self.freed = 0

    def content_budget_freed(self) -> None:
        self.freed += 1

    def __repr__(self) -> str:
        return self.name


def test_under_the_limit_nobody_stops():
    b = ContentBudget(100)
    a, c = Holder("a"), Holder("c")
    b.add(a, 60)
    b.add(c, 40)
    assert (b.total, b.holders) == (100, 2)
    assert not b.over(a) and not b.over(c)


def test_above_the_limit_holders_past_their_share_stop_but_the_largest():
    b = ContentBudget(100)
    big, mid, small = Holder("big"), Holder("mid"), Holder("small")
    b.add(big, 90)
    b.add(mid, 50)
    b.add(small, 10)  # share is 100 / 3: small is inside it
    assert b.over(mid)
    assert not b.over(big)  # the largest always completes its message
    assert not b.over(small)


def test_equal_holders_one_goes_on():
    b = ContentBudget(100)
    hs = [Holder(str(i)) for i in range(4)]
    for h in hs:
        b.add(h, 50)
    assert sum(not b.over(h) for h in hs) == 1


def test_freed_bytes_wake_waiting_holders_that_may_read_again():
    b = ContentBudget(100)
    big, mid = Holder("big"), Holder("mid")
    b.add(big, 120)
    b.add(mid, 60)
    assert b.over(mid)
    b.wait(mid)
    b.add(big, -120)  # big's message completed
    assert mid.freed == 1
    assert not b.over(mid) and b.holders == 1
    b.add(mid, -10)
    assert mid.freed == 1  # told once: it is no longer waiting


def test_forget_frees_everything_a_holder_kept():
    b = ContentBudget(100)
    gone, waiting = Holder("gone"), Holder("waiting")
    b.add(gone, 150)
    b.add(waiting, 80)
    b.wait(waiting)
    b.forget(gone)
    assert (b.total, gone.content_held, b.holders) == (80, 0, 1)
    assert waiting.freed == 1


def test_limit_must_be_positive():
    with pytest.raises(ValueError):
        ContentBudget(0)


def test_the_largest_goes_on_only_up_to_one_message_or_the_limit():
    """A connection interleaving many incomplete messages is not let through without end."""
    b = ContentBudget(100, max_message_size=150)
    hoarder, other = Holder("hoarder"), Holder("other")
    b.add(other, 60)
    b.add(hoarder, 149)
    assert not b.over(hoarder)  # may still complete a message of up to 150
    b.add(hoarder, 1)
    assert b.over(hoarder)
