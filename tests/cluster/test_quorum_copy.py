"""The pure parts of quorum queue replication, without processes: LOG frames round trip
(broker/cluster/link_codec.py), and what a copy to a member sends and acks (range arithmetic
and the divergence point, broker/cluster/quorum_leader.py) - including a member that holds
entries of an older leader's epoch the new leader never had."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from broker.cluster.link_codec import HEADER, LOG, LOG_COPY, decode_log, encode_log
from broker.cluster.quorum_leader import INFINITY, divergence, ranges_minus
from broker.queue.quorum_log import OP_ACK, OP_COUNT, OP_PUB


def test_log_frame_round_trip() -> None:
    ops = [(OP_PUB, 7, (1 << 100) + 5, b"\x00encoded message"), (OP_ACK, [1, 2, 2**40]),
           (OP_COUNT, [(7, 3), (9, 0)]), (OP_PUB, 8, 1, b"")]
    parts = encode_log(4, 1234, LOG_COPY, "/", "orders", ops)
    raw = b"".join(parts)
    size, kind = HEADER.unpack_from(raw)
    assert kind == LOG and size == len(raw) - 4
    assert decode_log(raw[HEADER.size:]) == (4, 1234, LOG_COPY, "/", "orders", ops)


_ranges = st.lists(st.tuples(st.integers(0, 200), st.integers(1, 20)), max_size=12).map(
    lambda xs: _normal([(a, a + n) for a, n in xs]))


def _normal(rs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(rs):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _set(rs: list[tuple[int, int]]) -> set[int]:
    return {x for a, b in rs for x in range(a, b)}


@given(_ranges, _ranges)
def test_ranges_minus_is_set_difference(a: list[tuple[int, int]],
                                        b: list[tuple[int, int]]) -> None:
    out = ranges_minus(a, b)
    assert _set(out) == _set(a) - _set(b)
    assert all(x[1] <= y[0] for x, y in itertools.pairwise(out))  # sorted, disjoint


def test_divergence_from_the_leaders_epochs() -> None:
    history = [(1, 0), (3, 400), (4, 450)]
    assert divergence(4, 4, history) == INFINITY  # the same leader: a prefix of its batches
    assert divergence(3, 4, history) == 450  # from where epoch 4 began
    assert divergence(1, 4, history) == 400  # it missed epoch 3 entirely
    assert divergence(2, 4, history) == 400  # an epoch whose leader published nothing kept
    assert divergence(0, 4, history) == 0  # a new member: everything is copied


@given(_ranges, _ranges, st.integers(0, 250))
def test_a_copy_brings_a_member_to_the_leaders_state(
        leader: list[tuple[int, int]], member: list[tuple[int, int]], cut: int) -> None:
    """What the leader acks and sends (QuorumLeader.copy_request's arithmetic) leaves the
    member holding exactly the leader's entries, the ones from `cut` on replaced."""
    keep = [(cut, INFINITY)]
    acks = _set(ranges_minus(member, ranges_minus(leader, keep)))
    send = _set(ranges_minus(leader, ranges_minus(member, keep)))
    after = (_set(member) - acks) | send
    assert after == _set(leader)
    assert not (send & (_set(member) - acks))  # nothing sent that it still holds
    assert {x for x in _set(member) if x >= cut} <= acks  # older epochs' entries replaced
