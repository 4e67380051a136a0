"""PriorityQueue (x-max-priority): one variable queue per level. Highest priority first, FIFO
within a priority, through paging (each level pages its own chain), requeue and purge; seq_ids
say their level; a stateful property test against a model; and the real stores and index."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pamqp import commands

from broker.message import Message
from broker.queue.priority_queue import LEVEL_SHIFT, PriorityQueue
from broker.queue.variable_queue import VariableQueue
from broker.store.msg_store import MsgStore
from broker.store.queue_index import QueueIndex
from tests.queue.test_variable_queue import MemIndex, MemStore


def pmsg(n: int, priority: int | None, persistent: bool = False, size: int = 8) -> Message:
    props = commands.Basic.Properties(priority=priority,
                                      delivery_mode=2 if persistent else None).marshal()
    return Message("ex", "rk", props, str(n).encode().ljust(size, b"."))


def number(m: Message) -> int:
    return int(m.body.rstrip(b"."))


def make(max_priority: int, **kw: object) -> tuple[PriorityQueue, MemStore, MemStore, MemIndex]:
    store, transient, index = MemStore(), MemStore(), MemIndex(kw.pop("embed_below", 0))  # type: ignore[arg-type]

    def level(seq_base: int) -> VariableQueue:
        return VariableQueue(store, index, transient_store=transient,  # type: ignore[arg-type]
                             seq_base=seq_base, **kw)  # type: ignore[arg-type]

    return PriorityQueue(max_priority, level), store, transient, index


def drain(pq: PriorityQueue) -> list[int]:
    out = []
    while (entry := pq.fetch(False)) is not None:
        out.append(number(entry[1]))
    return out


def test_highest_first_fifo_within_a_priority_capped_at_the_maximum() -> None:
    pq, *_ = make(5)
    for n, p in enumerate([None, 3, 9, 1, 3, 0, 5, 200, None]):
        pq.publish(pmsg(n, p))
    assert len(pq) == 9
    # 9 and 200 are above the maximum: they are level 5, with 6, in arrival order
    assert drain(pq) == [2, 6, 7, 1, 4, 3, 0, 5, 8]
    assert len(pq) == 0 and pq.fetch() is None and pq.peek() is None
    assert sorted(pq.levels()) == [0, 1, 3, 5]  # levels are made on first use


def test_seq_ids_name_their_level_and_requeue_goes_back_by_priority() -> None:
    pq, *_ = make(10)
    seqs = [pq.publish(pmsg(n, p)) for n, p in enumerate([1, 7, 1, 7])]
    assert [s >> LEVEL_SHIFT for s in seqs] == [1, 7, 1, 7]
    got = [pq.fetch(True) for _ in range(3)]
    assert [number(e[1]) for e in got if e] == [1, 3, 0]
    assert pq.pending_count == 3
    assert pq.requeue([seqs[0], seqs[1]]) == 2
    assert len(pq) == 3
    head = pq.peek()
    assert head is not None and number(head[1]) == 1 and head[2]  # redelivered, back on top
    assert [number(m) for m in pq.ack([seqs[3]])] == [3]
    assert drain(pq) == [1, 0, 2]


def test_each_level_pages_its_own_chain_within_the_target() -> None:
    pq, store, transient, index = make(3, segment_entries=4, io_batch_size=2)
    pq.set_target_ram_count(4)
    sent = [(n, n % 4) for n in range(80)]
    for n, p in sent:
        pq.publish(pmsg(n, p, persistent=n % 3 == 0))
    assert pq.ram_msg_count <= 4
    levels = pq.levels()
    assert all(vq.stats().delta > 0 for vq in levels.values())  # every level paged to disk
    expected = [n for n, p in sorted(sent, key=lambda x: (-x[1], x[0]))]
    assert drain(pq) == expected
    assert not store.bodies and not transient.bodies and not index.entries


def test_target_is_shared_highest_level_first() -> None:
    pq, *_ = make(2)
    for n in range(6):
        pq.publish(pmsg(n, n % 3))  # two messages on each of levels 0, 1, 2
    pq.set_target_ram_count(3)
    targets = {p: vq.target_ram_count for p, vq in pq.levels().items()}
    assert targets == {2: 2, 1: 1, 0: 0}
    assert pq.ram_msg_count == 3
    pq.set_target_ram_count(None)
    assert all(vq.target_ram_count is None for vq in pq.levels().values())


def test_purge_and_bad_maximum() -> None:
    pq, store, transient, index = make(4)
    pq.set_target_ram_count(0)
    for n in range(5):
        pq.publish(pmsg(n, n, persistent=n % 2 == 0))
    assert store.bodies and transient.bodies  # paged, so on disk
    assert pq.purge() == 5 and len(pq) == 0 and pq.bytes_ready == 0
    assert not store.bodies and not transient.bodies and not index.entries
    for bad in (0, 256):
        with pytest.raises(ValueError):
            make(bad)


async def test_levels_share_the_real_index_and_stores(tmp_path: Path) -> None:
    persistent = MsgStore(tmp_path / "msgs", fsync="never")
    transient = MsgStore(tmp_path / "transient", name="transient", transient=True)
    await persistent.start()
    await transient.start()
    index = QueueIndex(tmp_path / "queue", embed_below=64, segment_entries=8)
    try:
        pq = PriorityQueue(9, lambda base: VariableQueue(
            persistent, index, transient_store=transient, segment_entries=8, io_batch_size=4,
            seq_base=base))
        pq.set_target_ram_count(3)
        sent = [pmsg(n, n % 10, persistent=n % 3 != 0, size=10 if n % 2 else 200)
                for n in range(60)]
        ids = [pq.publish(m) for m in sent]
        got = [pq.fetch() for _ in range(60)]
        order = sorted(range(60), key=lambda n: (-(n % 10), n))
        assert [e[1].body for e in got if e] == [sent[n].body for n in order]
        pq.ack(ids)
        assert not any(persistent.contains(m.msg_id) or transient.contains(m.msg_id)
                       for m in sent)
        assert index.read(0, 10 << LEVEL_SHIFT) == []
    finally:
        index.close()
        await persistent.stop()
        await transient.stop()


class PQMachine(RuleBasedStateMachine):
    """Random publish/fetch/ack/requeue/purge/target changes against a model: ready seq_ids
    ordered by (level descending, seq ascending)."""

    @initialize(
        durable=st.booleans(),
        max_priority=st.sampled_from([1, 3, 10]),
        segment=st.integers(2, 6),
        io_batch=st.integers(1, 4),
        embed_below=st.sampled_from([0, 40]),
    )
    def setup(self, durable: bool, max_priority: int, segment: int, io_batch: int,
              embed_below: int) -> None:
        self.pq, self.store, self.transient, self.index = make(
            max_priority, durable=durable, segment_entries=segment, io_batch_size=io_batch,
            embed_below=embed_below)
        self.ready: list[int] = []
        self.pending: set[int] = set()
        self.bodies: dict[int, bytes] = {}

    def _order(self) -> None:
        self.ready.sort(key=lambda s: (-(s >> LEVEL_SHIFT), s))

    @rule(persistent=st.booleans(), priority=st.one_of(st.none(), st.integers(0, 12)),
          size=st.sampled_from([1, 60]), k=st.integers(1, 4))
    def publish(self, persistent: bool, priority: int | None, size: int, k: int) -> None:
        for _ in range(k):
            m = pmsg(len(self.bodies), priority, persistent, size)
            seq = self.pq.publish(m)
            assert seq >> LEVEL_SHIFT == min(priority or 0, self.pq.max_priority)
            self.bodies[seq] = m.body
            self.ready.append(seq)
        self._order()

    @rule(ack_required=st.booleans(), k=st.integers(1, 6))
    def fetch(self, ack_required: bool, k: int) -> None:
        for _ in range(k):
            entry = self.pq.fetch(ack_required)
            if not self.ready:
                assert entry is None
                return
            assert entry is not None
            assert entry[0] == self.ready.pop(0)
            assert entry[1].body == self.bodies[entry[0]]
            if ack_required:
                self.pending.add(entry[0])

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), requeue=st.booleans())
    def settle(self, data: st.DataObject, requeue: bool) -> None:
        seqs = data.draw(st.sets(st.sampled_from(sorted(self.pending)), min_size=1))
        self.pending -= seqs
        if requeue:
            assert self.pq.requeue(seqs) == len(seqs)
            self.ready += seqs
            self._order()
        else:
            assert sorted(m.body for m in self.pq.ack(seqs)) == sorted(
                self.bodies[s] for s in seqs)

    @rule(ram_target=st.one_of(st.none(), st.integers(0, 12)))
    def set_target(self, ram_target: int | None) -> None:
        self.pq.set_target_ram_count(ram_target)

    @rule()
    def purge(self) -> None:
        assert self.pq.purge() == len(self.ready)
        self.ready.clear()

    @invariant()
    def counts_agree(self) -> None:
        if not hasattr(self, "pq"):
            return
        pq = self.pq
        assert len(pq) == len(self.ready)
        assert pq.pending_count == len(self.pending)
        assert pq.bytes_ready == sum(len(self.bodies[s]) for s in self.ready)
        target = pq.target_ram_count
        assert target is None or pq.ram_msg_count <= target

    def teardown(self) -> None:
        if not hasattr(self, "pq"):
            return
        self.pq.set_target_ram_count(None)
        while self.ready:
            self.fetch(True, 6)
        self.pq.ack(list(self.pending))
        assert not self.store.bodies and not self.transient.bodies and not self.index.entries


PQMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_priority_queue_property = PQMachine.TestCase
