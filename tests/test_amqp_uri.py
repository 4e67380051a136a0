"""broker/amqp_uri.py's plain parts, with plain values: the plugins' reconnect policy (the
shovel's and federation's own tests drive it through their session loops)."""

from __future__ import annotations

from broker.amqp_uri import ReconnectBackoff


def test_backoff_doubles_to_its_cap_and_restarts_after_progress() -> None:
    b = ReconnectBackoff(4)
    got = [b.next_delay(progressed=p) for p in
           (False, False, False, True, False, False, False, False)]
    assert got == [4, 8, 16, 4, 8, 16, 30, 30]


def test_a_base_over_the_cap_is_the_cap_and_zero_means_no_reconnect() -> None:
    long = ReconnectBackoff(45)
    assert [long.next_delay(progressed=False) for _ in range(3)] == [45, 45, 45]
    assert ReconnectBackoff(0).next_delay(progressed=True) is None
