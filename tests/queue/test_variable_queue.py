"""VariableQueue: the seed's worked example step by step, disk bookkeeping, requeue order, and
a stateful property test (exactly once, FIFO, RAM within target, nothing left on disk).

MemStore and MemIndex are small in-memory implementations of the two interfaces the variable
queue is parameterised by (BodyStore, Index), strict enough to catch double writes and
removals of unknown entries."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker.message import Message
from broker.queue.variable_queue import VariableQueue
from broker.queue.vq_interfaces import IndexEntry
from broker.store.msg_store import MsgStore
from broker.store.queue_index import QueueIndex

PERSISTENT = b"\x10\x00\x02"  # flags with delivery_mode, delivery_mode = 2
TRANSIENT = b"\x00\x00"


class MemStore:
    def __init__(self) -> None:
        self.bodies: dict[int, bytes] = {}
        self.refs: dict[int, int] = {}
        self.writes = 0
        self.reads = 0
        self.clients: list[object | None] = []

    def write(self, msg_id: int, data: bytes, client: object | None) -> None:
        self.clients.append(client)
        self.bodies[msg_id] = data
        self.refs[msg_id] = self.refs.get(msg_id, 0) + 1
        self.writes += 1

    def read(self, msg_id: int) -> bytes:
        self.reads += 1
        return self.bodies[msg_id]

    def remove(self, msg_id: int) -> None:
        self.refs[msg_id] -= 1
        if not self.refs[msg_id]:
            del self.refs[msg_id], self.bodies[msg_id]


class MemIndex:
    def __init__(self, embed_below: int = 0) -> None:
        self.entries: dict[int, IndexEntry] = {}
        self.embed_below = embed_below
        self.reads = 0

    def publish(self, seq_id: int, msg_id: int, payload: bytes | None) -> None:
        assert seq_id not in self.entries, f"seq_id {seq_id} published twice"
        self.entries[seq_id] = IndexEntry(seq_id, msg_id, payload, False)

    def read(self, start_seq: int, end_seq: int) -> list[IndexEntry]:
        self.reads += 1
        return [self.entries[s] for s in sorted(self.entries) if start_seq <= s < end_seq]

    def ack(self, seq_ids: Iterable[int]) -> None:
        for s in seq_ids:
            del self.entries[s]

    def should_embed(self, size: int) -> bool:
        return size < self.embed_below


def msg(n: int, persistent: bool = False, size: int = 8) -> Message:
    body = str(n).encode().ljust(size, b".")
    return Message("ex", "rk", PERSISTENT if persistent else TRANSIENT, body)


def number(m: Message) -> int:
    return int(m.body.rstrip(b"."))


def make(**kw: object) -> tuple[VariableQueue, MemStore, MemStore, MemIndex]:
    store, transient, index = MemStore(), MemStore(), MemIndex(kw.pop("embed_below", 0))  # type: ignore[arg-type]
    vq = VariableQueue(store, index, transient_store=transient, **kw)  # type: ignore[arg-type]
    return vq, store, transient, index


# -- the worked example of seeds/002 -------------------------------------------------------------


def test_worked_example_step_by_step() -> None:
    # message k gets seq_id k-1; with 8-entry segments, q3 keeps seq 4..7 (its first segment)
    # when paging, and delta [10..13] (seq 9..12) loads back in one segment read.
    vq, store, transient, index = make(segment_entries=8)

    def publish(*ns: int) -> None:
        for n in ns:
            vq.publish(msg(n, persistent=n % 2 == 0))

    def fetch(k: int) -> list[int]:
        out = []
        for _ in range(k):
            entry = vq.fetch()
            assert entry is not None
            out.append(number(entry[1]))
        return out

    def layout() -> dict[str, list[int]]:
        return {part: [s + 1 for s in seqs] for part, seqs in vq.seq_layout().items()}

    def expect(
        q4: list[int], q3: list[int], delta: list[int], q2: list[int], q1: list[int]
    ) -> None:
        assert layout() == {"q4": q4, "q3": q3, "delta": delta, "q2": q2, "q1": q1}
        s = vq.stats()
        assert (s.q4, s.q3, s.delta, s.q2, s.q1) == tuple(map(len, (q4, q3, delta, q2, q1)))
        assert s.ram_msg_count == len(q4) + len(q1)

    def r(a: int, b: int) -> list[int]:
        return list(range(a, b))

    publish(*r(1, 10))
    expect(r(1, 10), [], [], [], [])
    publish(10)
    expect(r(1, 11), [], [], [], [])
    vq.push_alphas_to_betas(3)
    expect(r(1, 8), [8, 9, 10], [], [], [])
    publish(*r(11, 16))
    expect(r(1, 8), [8, 9, 10], [], [], r(11, 16))
    vq.push_q1_to_betas(3)  # the seed moves 3 from q1 and 3 from q4 in this step
    vq.push_q4_to_q3(3)
    expect(r(1, 5), r(5, 14), [], [], [14, 15])
    vq.push_betas_to_deltas(4)
    expect(r(1, 5), r(5, 10), r(10, 14), [], [14, 15])
    publish(*r(16, 21))
    expect(r(1, 5), r(5, 10), r(10, 14), [], r(14, 21))
    vq.push_q1_to_betas(4)  # delta is not empty: q1's oldest go to q2
    vq.push_q4_to_q3(3)
    expect([1], r(2, 10), r(10, 14), r(14, 18), [18, 19, 20])
    assert fetch(3) == [1, 2, 3]
    expect([], r(4, 10), r(10, 14), r(14, 18), [18, 19, 20])
    assert fetch(5) == [4, 5, 6, 7, 8]
    expect([], [9], r(10, 14), r(14, 18), [18, 19, 20])
    # q3 runs dry: delta loads into q3, and delta being empty then, q2 joins q3's rear
    assert fetch(1) == [9]
    expect([], r(10, 18), [], [], [18, 19, 20])
    publish(*r(21, 26))
    expect([], r(10, 18), [], [], r(18, 26))
    # q3 and delta empty: q1 becomes q4
    assert fetch(8) == r(10, 18)
    expect(r(18, 26), [], [], [], [])
    assert fetch(1) == [18]
    expect(r(19, 26), [], [], [], [])

    assert fetch(7) == r(19, 26)
    assert vq.fetch() is None
    vq.ack(range(25))
    assert not store.bodies and not transient.bodies and not index.entries


# -- disk bookkeeping ------------------------------------------------------------------------


def test_persistent_messages_are_on_disk_at_publish_transient_ones_only_when_paged() -> None:
    vq, store, transient, index = make(embed_below=30)
    vq.publish(msg(1, persistent=True, size=4))  # small: embedded in the index
    vq.publish(msg(2, persistent=True, size=100))  # big: store + index entry
    vq.publish(msg(3))
    assert index.entries[0].payload is not None
    assert index.entries[1].payload is None and len(store.bodies) == 1
    assert 2 not in index.entries and not transient.bodies
    vq.set_target_ram_count(0)  # all become betas; only the transient one needs writing
    assert vq.stats().q3 == 3 and vq.ram_msg_count == 0
    assert (store.writes, transient.writes) == (1, 1)
    assert 2 not in index.entries  # betas need no index entry until delta
    assert [number(vq.fetch()[1]) for _ in range(3)] == [1, 2, 3]  # type: ignore[index]
    vq.ack([0, 1, 2])
    assert not store.bodies and not transient.bodies and not index.entries


def test_only_persistent_writes_carry_the_confirm_client() -> None:
    confirms = object()
    vq, store, transient, _ = make(client=confirms)
    vq.publish(msg(1, persistent=True))
    vq.publish(msg(2))
    vq.set_target_ram_count(0)
    assert store.clients == [confirms]
    assert transient.clients == [None]


def test_non_durable_queue_treats_every_message_as_transient() -> None:
    vq, store, transient, index = make(durable=False)
    vq.publish(msg(1, persistent=True))
    assert not store.writes and not index.entries
    vq.set_target_ram_count(0)
    assert transient.writes == 1 and not store.writes
    entry = vq.fetch(ack_required=False)
    assert entry is not None and number(entry[1]) == 1
    assert not transient.bodies


def test_delta_keeps_redelivered_flag_and_expiry() -> None:
    vq, store, transient, index = make(segment_entries=2, io_batch_size=1)
    for n in range(6):
        vq.publish(msg(n, persistent=n % 2 == 1), expires_at=100.0 + n)
    e0 = vq.fetch()
    assert e0 is not None and e0[2] is False
    vq.requeue([e0[0]])
    vq.set_target_ram_count(0)
    assert vq.stats().delta > 0
    out = [vq.fetch() for _ in range(6)]
    assert [(number(e[1]), e[2], e[3]) for e in out if e] == [
        (n, n == 0, 100.0 + n) for n in range(6)
    ]
    vq.ack(range(6))
    assert not store.bodies and not transient.bodies and not index.entries


def test_bytes_ready_counts_paged_messages() -> None:
    vq, *_ = make(segment_entries=2, io_batch_size=1)
    for n in range(10):
        vq.publish(msg(n, size=10 + n))
    total = sum(10 + n for n in range(10))
    vq.set_target_ram_count(0)
    assert vq.bytes_ready == total and vq.stats().ram_bytes == 0
    first = vq.fetch()
    assert first is not None
    assert vq.bytes_ready == total - 10
    vq.set_target_ram_count(None)
    while vq.fetch(ack_required=False):
        pass
    assert vq.bytes_ready == 0 and vq.stats().ram_bytes == 0


def test_peek_reads_the_head_back_once() -> None:
    vq, _, transient, _ = make()
    vq.publish(msg(1))
    vq.publish(msg(2))
    vq.set_target_ram_count(0)
    head = vq.peek()
    assert head is not None and number(head[1]) == 1
    assert transient.reads == 1
    fetched = vq.fetch()
    assert fetched is not None and fetched[0] == head[0] and transient.reads == 1


def test_empty_queue() -> None:
    vq, *_ = make()
    assert vq.fetch() is None and vq.peek() is None and len(vq) == 0
    assert vq.requeue([5]) == 0 and vq.ack([5]) == [] and vq.purge() == 0


def test_fetch_without_ack_removes_disk_copies() -> None:
    vq, store, _, index = make()
    vq.publish(msg(1, persistent=True))
    assert vq.fetch(ack_required=False) is not None
    assert vq.pending_count == 0 and not store.bodies and not index.entries


def test_requeue_returns_messages_to_the_head_in_seq_order() -> None:
    vq, *_ = make()
    for n in range(5):
        vq.publish(msg(n))
    got = [vq.fetch() for _ in range(4)]
    assert [e[0] for e in got if e] == [0, 1, 2, 3]
    assert vq.requeue([2]) == 1
    assert vq.requeue([3, 0]) == 2
    out = [vq.fetch() for _ in range(4)]
    assert [(e[0], e[2]) for e in out if e] == [(0, True), (2, True), (3, True), (4, False)]
    assert (vq.in_count, vq.out_count) == (5 + 3, 4 + 4)
    assert vq.pending_count == 5  # 1 was never requeued


def test_requeue_into_paged_queue_goes_to_q4_or_q3_by_seq() -> None:
    vq, _, transient, _ = make(segment_entries=4)
    for n in range(8):
        vq.publish(msg(n))
    for _ in range(3):
        vq.fetch()
    vq.push_alphas_to_betas(3)  # q4 [3, 4], q3 [5, 6, 7]
    vq.requeue([1])
    assert vq.seq_layout()["q4"] == [1, 3, 4]
    vq.push_alphas_to_betas(10)  # everything paged: q3 [1, 3, 4, 5, 6, 7]
    vq.requeue([0, 2])
    assert vq.seq_layout()["q4"] == [0]  # older than q3's head
    assert vq.seq_layout()["q3"] == [1, 2, 3, 4, 5, 6, 7]
    assert [e[0] for e in (vq.fetch() for _ in range(8)) if e] == list(range(8))
    vq.ack(range(8))
    assert not transient.bodies


def test_purge_drops_ready_messages_and_their_disk_copies() -> None:
    vq, store, transient, index = make(segment_entries=2, io_batch_size=1)
    for n in range(12):
        vq.publish(msg(n, persistent=n % 3 == 0))
    pending = vq.fetch()
    assert pending is not None
    vq.set_target_ram_count(0)
    assert vq.stats().delta > 0
    assert vq.purge() == 11
    assert len(vq) == 0 and vq.bytes_ready == 0 and vq.stats().delta == 0
    assert list(index.entries) == [0] and not transient.bodies  # the pending one stays
    assert [number(m) for m in vq.drop_pending()] == [0]
    assert not store.bodies and not index.entries
    vq.publish(msg(99))
    entry = vq.fetch()
    assert entry is not None and number(entry[1]) == 99


def test_reduce_memory_use_pushes_betas_to_delta_in_io_batches() -> None:
    vq, *_ = make(segment_entries=4, io_batch_size=6)
    for n in range(12):
        vq.publish(msg(n))
    vq.set_target_ram_count(0)
    # 12 betas, permitted min(len(q3), 4) = 4: an excess of 8 >= 6 goes to delta, q3 keeping
    # its first segment (seq 0..3)
    s = vq.stats()
    assert (s.q4, s.q3, s.delta, s.q2, s.q1) == (0, 4, 8, 0, 0)
    vq.set_target_ram_count(None)
    for n in range(3):
        vq.publish(msg(100 + n))  # q3 is not empty: new ones queue in q1
    assert vq.stats().q1 == 3


def test_push_betas_to_deltas_keeps_q3s_first_segment() -> None:
    vq, *_ = make(segment_entries=4)
    for n in range(2, 14):  # seq 0..11; q3's head is seq 0, its segment ends at 4
        vq.publish(msg(n))
    vq.push_alphas_to_betas(12)
    assert vq.push_betas_to_deltas(100) == 92
    assert vq.seq_layout()["q3"] == [0, 1, 2, 3]
    assert vq.seq_layout()["delta"] == list(range(4, 12))
    vq.fetch()
    vq.fetch()  # seq 2 is now q3's head; its segment still ends at 4
    assert vq.push_betas_to_deltas(100) == 100


def test_no_target_no_paging_and_bad_arguments() -> None:
    vq, *_ = make()
    for n in range(50):
        vq.publish(msg(n))
    assert vq.ram_msg_count == 50 and vq.stats().q4 == 50
    with pytest.raises(ValueError):
        vq.set_target_ram_count(-1)
    with pytest.raises(ValueError):
        make(segment_entries=0)


# -- with the real message stores and queue index ----------------------------------------------


async def test_pages_through_the_real_stores_and_index(tmp_path: Path) -> None:
    persistent = MsgStore(tmp_path / "msgs", fsync="never")
    transient = MsgStore(tmp_path / "transient", name="transient", transient=True)
    await persistent.start()
    await transient.start()
    index = QueueIndex(tmp_path / "queue", embed_below=64, segment_entries=8)
    try:
        vq = VariableQueue(
            persistent, index, transient_store=transient, segment_entries=8, io_batch_size=4
        )
        vq.set_target_ram_count(3)
        sent = [msg(n, persistent=n % 3 != 0, size=10 if n % 2 else 200) for n in range(60)]
        ids = [vq.publish(m) for m in sent]
        assert vq.ram_msg_count <= 3 and vq.stats().delta > 0
        got = [vq.fetch() for _ in range(60)]
        assert [e[1].body for e in got if e] == [m.body for m in sent]
        assert vq.fetch() is None
        vq.ack(ids)
        assert not any(persistent.contains(m.msg_id) or transient.contains(m.msg_id) for m in sent)
        assert index.read(0, 60) == []
    finally:
        index.close()
        await persistent.stop()
        await transient.stop()


# -- the property ------------------------------------------------------------------------------


class VQMachine(RuleBasedStateMachine):
    """Random publish/fetch/ack/requeue/purge/target changes against a model: a sorted list of
    ready seq_ids (requeues go back by seq, so the head is always the smallest)."""

    @initialize(
        durable=st.booleans(),
        segment=st.integers(2, 6),
        io_batch=st.integers(1, 4),
        embed_below=st.sampled_from([0, 40]),
    )
    def setup(self, durable: bool, segment: int, io_batch: int, embed_below: int) -> None:
        self.vq, self.store, self.transient, self.index = make(
            durable=durable,
            segment_entries=segment,
            io_batch_size=io_batch,
            embed_below=embed_below,
        )
        self.ready: list[int] = []
        self.pending: set[int] = set()
        self.redelivered: set[int] = set()
        self.bodies: dict[int, bytes] = {}

    @rule(persistent=st.booleans(), size=st.sampled_from([1, 8, 60]), k=st.integers(1, 5))
    def publish(self, persistent: bool, size: int, k: int) -> None:
        for _ in range(k):
            m = msg(len(self.bodies), persistent, size)
            seq = self.vq.publish(m)
            assert seq not in self.bodies
            self.bodies[seq] = m.body
            self.ready.append(seq)

    @rule(ack_required=st.booleans(), k=st.integers(1, 6))
    def fetch(self, ack_required: bool, k: int) -> None:
        for _ in range(k):
            entry = self.vq.fetch(ack_required)
            if not self.ready:
                assert entry is None
                return
            assert entry is not None
            seq, m, redelivered, _ = entry
            assert seq == self.ready.pop(0)
            assert m.body == self.bodies[seq]
            assert redelivered == (seq in self.redelivered)
            if ack_required:
                self.pending.add(seq)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        seqs = data.draw(st.sets(st.sampled_from(sorted(self.pending)), min_size=1))
        msgs = self.vq.ack(seqs)
        assert sorted(m.body for m in msgs) == sorted(self.bodies[s] for s in seqs)
        self.pending -= seqs

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        seqs = data.draw(st.sets(st.sampled_from(sorted(self.pending)), min_size=1))
        assert self.vq.requeue(seqs) == len(seqs)
        self.pending -= seqs
        self.redelivered |= seqs
        self.ready = sorted(self.ready + list(seqs))

    @rule(ram_target=st.one_of(st.none(), st.integers(0, 12)))
    def set_target(self, ram_target: int | None) -> None:
        self.vq.set_target_ram_count(ram_target)

    @rule()
    def reduce_memory_use(self) -> None:
        self.vq.reduce_memory_use()
        target = self.vq.target_ram_count
        assert target is None or self.vq.ram_msg_count <= target

    @rule()
    def purge(self) -> None:
        assert self.vq.purge() == len(self.ready)
        self.ready.clear()

    @invariant()
    def counts_agree(self) -> None:
        if not hasattr(self, "vq"):
            return
        vq = self.vq
        assert len(vq) == len(self.ready)
        assert vq.pending_count == len(self.pending)
        assert vq.bytes_ready == sum(len(self.bodies[s]) for s in self.ready)
        target = vq.target_ram_count
        assert target is None or vq.ram_msg_count <= target
        s = vq.stats()
        assert s.q1 + s.q2 + s.delta + s.q3 + s.q4 == len(self.ready)
        layout = vq.seq_layout()
        in_ram = layout["q4"] + layout["q3"] + layout["q2"] + layout["q1"]
        assert in_ram == sorted(in_ram)  # every part in order, and the parts in order

    def teardown(self) -> None:
        if not hasattr(self, "vq"):
            return
        self.vq.set_target_ram_count(None)
        while self.ready:
            self.fetch(True, 6)
        self.vq.ack(list(self.pending))
        assert not self.store.bodies and not self.transient.bodies and not self.index.entries


VQMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_variable_queue_property = VQMachine.TestCase
