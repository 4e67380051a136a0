"""A quorum queue member's log (broker/queue/quorum_log.py) with a real message store and
queue index: batches applied as a follower does, applied twice or over a later state
(the same state), positions that move only once index, member file and bodies are on disk,
and recovery of all of it after a stop without close."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker.message import Message
from broker.queue.quorum_log import OP_ACK, OP_COUNT, OP_PUB, MemberLog
from broker.store.msg_store import MsgStore


def _msg(i: int, size: int = 10) -> Message:
    return Message("", "q", b"", str(i).encode().ljust(size, b"."))


async def _store(tmp_path: Path) -> MsgStore:
    store = MsgStore(tmp_path / "store", name="persistent")
    await store.start()
    return store


def _log(tmp_path: Path, store: MsgStore) -> MemberLog:
    return MemberLog(tmp_path / "q", store, name="/q", embed_below=100, segment_entries=64)


async def _durable(member: MemberLog, pos: int) -> None:
    for _ in range(200):
        if member.durable_pos >= pos:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"position {pos} never durable ({member.durable_pos})")


def _pub(seq: int, size: int = 10) -> tuple[int, int, int, bytes]:
    m = _msg(seq, size)
    return (OP_PUB, seq, m.msg_id, m.encode())


async def test_follower_batches_and_recovery(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    member = _log(tmp_path, store)
    member.recover()
    seen: list[int] = []
    member.on_durable = seen.append
    batches = [
        (1, [_pub(0), _pub(1, 500), _pub(2)]),  # seq 1 goes to the store (500 B)
        (2, [(OP_ACK, [0]), (OP_COUNT, [(1, 1)])]),
        (3, [(OP_COUNT, [(1, 2)]), _pub(3)]),
    ]
    for pos, ops in batches:
        member.apply(pos, ops)
    await _durable(member, 3)
    assert seen[-1] == 3 and member.state.pos == 3
    # the same batches again (a member copied twice): the same state
    for pos, ops in batches:
        member.apply(pos, ops)
    await _durable(member, 3)
    assert [e.seq_id for e in member.index.recover()] == [1, 2, 3]
    assert member.counts == {1: 2}
    # no close: what a kill -9 leaves
    await store.stop()
    store = await _store(tmp_path)
    again = _log(tmp_path, store)
    entries = again.recover()
    assert [e.seq_id for e in entries] == [1, 2, 3]
    assert again.state.pos == 3 and again.counts == {1: 2}
    assert Message.decode(store.read(entries[0].msg_id), 0).body.startswith(b"1.")
    again.close()
    await store.stop()


async def test_position_waits_for_the_store(tmp_path: Path) -> None:
    """A batch with a body in the store is durable only when the store says so."""
    store = await _store(tmp_path)
    member = _log(tmp_path, store)
    member.recover()
    member.apply(1, [_pub(0, 5000)])
    await _durable(member, 1)
    assert member.durable_pos == 1 and not member._store_wait
    member.close()
    await store.stop()


async def test_leader_writes_are_shipped_at_the_batch_end(tmp_path: Path) -> None:
    store = await _store(tmp_path)
    member = _log(tmp_path, store)
    member.create(epoch=1)
    shipped: list[tuple[int, list]] = []
    member.ship_to(lambda pos, ops: shipped.append((pos, ops)))
    m = _msg(7)
    member.publish(0, m.msg_id, m.encode())
    member.checkout(0)
    member.end_batch()
    member.ack([0])
    member.end_batch()
    assert [pos for pos, _ in shipped] == [1, 2]
    assert shipped[0][1] == [(OP_PUB, 0, m.msg_id, m.encode()), (OP_COUNT, [(0, 1)])]
    assert shipped[1][1] == [(OP_ACK, [0])]
    await _durable(member, 2)
    # a follower applying them reaches the same state
    follower = MemberLog(tmp_path / "f", store, name="/f", embed_below=100, segment_entries=64)
    follower.recover()
    for pos, ops in shipped:
        follower.apply(pos, ops)
    assert follower.index.count() == 0 and follower.counts == {}
    member.close()
    follower.close()
    await store.stop()
