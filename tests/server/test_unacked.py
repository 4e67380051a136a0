"""The unacked ledger with plain values: which records each ack/nack/reject form takes."""

from __future__ import annotations

import pytest

from broker.protocol.constants import PRECONDITION_FAILED
from broker.protocol.errors import ChannelError
from broker.server.unacked import Unacked


def ledger(*tags: int) -> Unacked[str]:
    u: Unacked[str] = Unacked()
    for tag in tags:
        u[tag] = f"r{tag}"
    return u


def test_single_takes_its_tag_and_leaves_the_rest_in_order() -> None:
    u = ledger(1, 2, 3)
    assert u.take(2, False) == ["r2"]
    assert list(u) == [1, 3]


def test_multiple_takes_every_tag_up_to_and_including_it() -> None:
    u = ledger(1, 2, 3, 5)
    assert u.take(3, True) == ["r1", "r2", "r3"]
    assert list(u) == [5]


def test_multiple_after_a_single_ack_below_it() -> None:
    u = ledger(1, 2, 3)
    u.take(1, False)
    assert u.take(3, True) == ["r2", "r3"]
    assert not u


def test_zero_multiple_takes_all_and_nothing_when_empty() -> None:
    u = ledger(1, 2)
    assert u.take(0, True) == ["r1", "r2"]
    assert u.take(0, True) == []  # RabbitMQ answers nothing: no error


@pytest.mark.parametrize(("tags", "tag", "multiple"), [
    ((), 0, False), ((), 1, False), ((), 1, True), ((1, 2), 0, False), ((1, 2), 9, False),
    ((1, 2), 9, True), ((1, 3), 2, True),
])
def test_unknown_tags_are_406_and_take_nothing(tags: tuple[int, ...], tag: int,
                                               multiple: bool) -> None:
    u = ledger(*tags)
    with pytest.raises(ChannelError) as err:
        u.check(tag, multiple)
    assert err.value.code == PRECONDITION_FAILED
    with pytest.raises(ChannelError, match=f"unknown delivery tag {tag}"):
        u.take(tag, multiple)
    assert list(u) == list(tags)


def test_check_passes_what_take_would_take() -> None:
    u = ledger(1, 2)
    u.check(0, True)
    u.check(2, True)
    u.check(1, False)
    ledger().check(0, True)
    assert list(u) == [1, 2]


def test_take_all_empties_in_delivery_order() -> None:
    u = ledger(4, 7, 9)
    assert u.take_all() == ["r4", "r7", "r9"]
    assert u.take_all() == []
