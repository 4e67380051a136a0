"""The confirms ledger with plain values: what each queue's answer settles, and which frames
(nacks, acks with multiple) the channel is told to send."""

from __future__ import annotations

from broker.server.confirms import Confirms


def test_confirmed_once_every_queue_has_it() -> None:
    c = Confirms()
    c.pending[1] = 2
    c.confirm([1])
    assert c.take() == ([], []) and len(c) == 1
    c.confirm([1])
    assert c.take() == ([], [(1, False)]) and len(c) == 0


def test_a_run_below_every_pending_seq_is_one_multiple_ack() -> None:
    c = Confirms()
    for seq in (1, 2, 3, 4):
        c.pending[seq] = 1
    c.confirm([3, 1, 2])
    assert c.take() == ([], [(3, True)])
    c.confirm([4])
    assert c.take() == ([], [(4, False)])


def test_acks_above_a_pending_seq_go_one_by_one() -> None:
    c = Confirms()
    for seq in (1, 2, 3, 4):
        c.pending[seq] = 1
    c.confirm([1, 3, 4])
    assert c.take() == ([], [(1, False), (3, False), (4, False)])
    assert list(c.pending) == [2]


def test_a_rejection_nacks_whatever_the_other_queues_do() -> None:
    c = Confirms()
    c.pending[1] = 2
    c.reject([1])
    c.confirm([1])  # the other queue: already settled, ignored
    assert c.take() == ([1], [])


def test_lost_nacks_only_when_no_queue_is_left_to_confirm() -> None:
    c = Confirms()
    c.pending[1] = 2
    c.pending[2] = 1
    c.lost(1)
    c.lost(2)
    assert c.take() == ([2], [])
    c.confirm([1])
    assert c.take() == ([], [(1, False)])


def test_a_queue_lost_after_another_confirmed_leaves_it_confirmed() -> None:
    # a local queue confirms a transient message as it takes it, before a down home's queue
    # is told lost in the same hand-over
    c = Confirms()
    c.pending[1] = 2
    c.pending[2] = 3
    c.confirm([1, 2])
    c.lost(1)
    assert c.take() == ([], [(1, False)])
    c.lost(2)
    c.lost(2)
    assert c.take() == ([], [(2, False)]) and len(c) == 0 and not c._reached


def test_unroutable_publishes_settle_at_once() -> None:
    c = Confirms()
    c.settled(2, False)
    c.settled(1, True)
    c.settled(3, True)
    assert c.take() == ([2], [(3, True)])
    assert c.take() == ([], [])


def test_unknown_seqs_are_ignored() -> None:
    c = Confirms()
    c.confirm([7])
    c.reject([8])
    c.lost(9)
    assert c.take() == ([], []) and len(c) == 0
