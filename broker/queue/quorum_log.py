"""One member's copy of a quorum queue: its queue index (the messages, as a durable classic
queue keeps them), bodies of large messages in the node's persistent message store, and its
member file (broker/store/quorum_meta.py: epoch, log position, delivery counts).

The replicated log is a sequence of *batches*, each with a position (`pos`, one per leader
turn) and a list of operations on the queue's state: PUB (seq_id, msg_id, encoded message),
ACK (seq_ids leave), COUNT (seq_id -> its delivery state, absolute: returns << 1 | 1 while a
consumer holds it). Every operation sets the state of one seq_id, so applying a batch twice, or
a batch on a state that already holds part of it, gives the same state: a member can always
be brought to the leader's state by a diff (broker/cluster/quorum_leader.py), never needs the
leader's old batches, and its index is its log.

The leader writes through the same calls when it takes a publish (before the majority has it)
and ships what it wrote at the end of each turn; a follower applies what it is shipped. Both
group-commit: one fsync round (index segments, store bodies, then a STATE record in the member
file) covers every batch that arrived meanwhile, and `durable_pos` (what this member would
answer the leader) moves only when all of a batch is on disk."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from broker.message import Message
from broker.store.queue_index import IndexEntry, QueueIndex
from broker.store.quorum_meta import (
    COMPACT_BYTES,
    MemberState,
    MetaFile,
    encode_counts,
    encode_state,
)

if TYPE_CHECKING:
    from broker.store.msg_store import MsgStore

__all__ = ["CHECKED_OUT", "OP_ACK", "OP_COUNT", "OP_PUB", "LogIndex", "LogStore", "MemberLog",
           "Op"]

log = structlog.get_logger("hare.quorum")

OP_PUB = 1  # (OP_PUB, seq_id, msg_id, encoded message)
OP_ACK = 2  # (OP_ACK, [seq_id, ...])
OP_COUNT = 3  # (OP_COUNT, [(seq_id, returns << 1 | checked out), ...]); 0 forgets the entry
CHECKED_OUT = 1  # the low bit of a delivery state: a consumer holds the message
Op = tuple[Any, ...]
_RETRY_S = 1.0  # a failed fsync round is tried again after this long


class MemberLog:
    """The disk side of a quorum queue member, on the event loop (fsyncs in a worker thread).

    It also answers what a queue asks of its durability (`persistent`, `end_batch`,
    `delivered`, `close`, `delete`), so the leader's AMQQueue machinery drives it unchanged."""

    persistent = True  # a quorum queue keeps every message on disk, whatever its delivery mode

    def __init__(self, directory: Path, store: MsgStore, *, name: str, embed_below: int,
                 segment_entries: int, fsync: str = "batch") -> None:
        self.name = name  # vhost/queue, for logs
        self.directory = Path(directory)
        self.index = QueueIndex(self.directory, embed_below=embed_below,
                                segment_entries=segment_entries)
        self.meta = MetaFile(self.directory)
        self.store = store
        self.fsync = fsync
        self.state = MemberState()
        # seq_id -> delivery state (returns << 1 | CHECKED_OUT) of messages that have one
        self.counts: dict[int, int] = {}
        self._store_ids: dict[int, int] = {}  # seq_id -> msg_id of bodies in the store
        self._store_wait: dict[int, int] = {}  # msg_id -> pos of a body not yet fsynced
        self._dirty_counts: list[tuple[int, int]] = []
        self._checkouts: list[tuple[int, int]] = []  # delivery states set since the batch began
        self.open_pos = 0  # the position of the batch being written (0: none)
        self.ops: list[Op] | None = None  # the open batch's operations, while shipping
        self.synced_pos = 0  # every batch up to here is in an fsynced index and member file
        self.durable_pos = 0  # ... and so are their bodies: what this member holds
        self.on_durable: Callable[[int], None] | None = None
        self.ship: Callable[[int, list[Op]], None] | None = None
        self._syncing = False
        self._state_dirty = False  # epoch or voter changed: a STATE record is due
        self._retry: asyncio.TimerHandle | None = None
        self.copying = False  # a leader's copy is being applied
        self._rounds = 0  # fsync rounds started
        self._stream = 0  # a copy restarts the positions: rounds of an older stream count not
        self._notify_round = 0  # tell on_durable when this round is done, moved or not
        self.opened = False  # recover() ran
        self.closed = False
        self._meta_lock = threading.Lock()  # a sync round's member file write vs close()

    # -- open -----------------------------------------------------------------------------------
    def recover(self) -> list[IndexEntry]:
        """Read index and member file back (once, before use): the live entries, ascending.
        Entries whose body never reached the store (after a crash) are dropped: the member's
        position never counted them."""
        self.opened = True
        scan = self.meta.load()
        entries = self.index.recover()
        missing = [e.seq_id for e in entries
                   if e.payload is None and not self.store.contains(e.msg_id)]
        if missing:
            self.index.ack(missing)
            gone = set(missing)
            entries = [e for e in entries if e.seq_id not in gone]
            log.info("quorum member entries without a body dropped", queue=self.name,
                     count=len(missing))
        self._store_ids = {e.seq_id: e.msg_id for e in entries if e.payload is None}
        state = scan.state or MemberState()
        if scan.damaged:
            log.error("quorum member file damaged: this member votes again once a leader has "
                      "copied the queue to it", queue=self.name, file=str(self.meta.path))
            state.voter = False
        self.state = state
        live = {e.seq_id for e in entries}
        self.counts = {s: c for s, c in scan.counts.items() if s in live}
        self.synced_pos = self.durable_pos = state.pos
        return entries

    def create(self, epoch: int) -> None:
        """A new member of a new queue (or one the leader copies everything to): it holds
        the empty queue as of position 0 of `epoch`, written now so it may vote from the
        start."""
        self.opened = True
        self.state = MemberState(epoch, epoch, 0, True, [(epoch, 0)])
        self.meta.rewrite(self.state, {})

    def promote(self, epoch: int) -> None:
        """This member leads `epoch` from now on: its entries from here on are the epoch's
        (`history`), and it holds the queue as of its position."""
        s = self.state
        s.epoch = max(s.epoch, epoch)
        s.last_epoch = epoch
        if not s.history or s.history[-1][0] != epoch:
            s.history.append((epoch, self.next_seq()))
        s.voter = True
        self.save_state()

    def fence(self, epoch: int) -> None:
        """This member votes past `epoch`: it refuses that leader's batches from now on."""
        if self.state.epoch <= epoch:
            self.state.epoch = epoch + 1
            self.save_state()

    def begin_copy(self, pos: int) -> None:
        """A leader copies the queue to this member. Before the copy changes anything on
        disk, the member file says it is no voter (a crash half-way must not leave a claim to
        a position its index no longer holds); its delivery states are the leader's next."""
        self.end_batch()
        self.copying = True
        self.state.voter = False
        with self._meta_lock:
            self.meta.append(encode_state(self.state))
        if self.counts:
            self._dirty_counts.extend((seq, 0) for seq in self.counts)
            self.counts = {}
        # positions count from the leader's stream now
        self._stream += 1
        self.state.pos = pos
        self.synced_pos = self.durable_pos = min(self.durable_pos, pos)
        for msg_id, at in self._store_wait.items():
            self._store_wait[msg_id] = min(at, pos)

    def end_copy(self, epoch: int, history: list[tuple[int, int]]) -> None:
        """The copy is complete: the member holds the leader's state and votes again (once
        that is on disk, its position is told)."""
        s = self.state
        s.epoch = max(s.epoch, epoch)
        s.last_epoch = epoch
        s.history = list(history)
        s.voter = True
        self.copying = False
        self._notify_round = self._rounds + 1  # the round that writes this state
        self.end_batch()
        self.save_state()

    def empty(self) -> bool:
        """Nothing held and nothing applied yet."""
        return not self.state.pos and not self.index.count() and not self.open_pos

    def next_seq(self) -> int:
        return self.index.bounds()[1]

    # -- writes (the leader's own, and a follower applying a batch) ----------------------------
    def _open(self) -> None:
        if not self.open_pos:
            self.open_pos = self.state.pos + 1

    def ship_to(self, ship: Callable[[int, list[Op]], None] | None) -> None:
        """The leader with followers: each batch's operations go to `ship` at its end."""
        self.ship = ship
        self.ops = [] if ship is not None else None

    def publish(self, seq: int, msg_id: int, data: bytes) -> bool:
        """Write one message; True when it went into the index itself (embedded)."""
        self._open()
        if self.ops is not None:
            self.ops.append((OP_PUB, seq, msg_id, data))
        if self.index.should_embed(len(data)):
            self.index.publish(seq, msg_id, data)
            return True
        self.store.write(msg_id, data, self)
        self._store_ids[seq] = msg_id
        self._store_wait[msg_id] = self.open_pos
        self.index.publish(seq, msg_id, None)
        return False

    def ack(self, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        self._open()
        if self.ops is not None:
            self.ops.append((OP_ACK, list(seqs)))
        self.index.ack(seqs)
        store_ids, counts = self._store_ids, self.counts
        for seq in seqs:
            msg_id = store_ids.pop(seq, None)
            if msg_id is not None:
                self.store.remove(msg_id)
            if counts and counts.pop(seq, None) is not None:
                self._dirty_counts.append((seq, 0))

    def set_counts(self, pairs: list[tuple[int, int]]) -> None:
        """Delivery states (seq_id, returns << 1 | CHECKED_OUT), absolute; 0 forgets one."""
        if not pairs:
            return
        counts = self.counts
        for seq, value in pairs:
            if value:
                counts[seq] = value
            else:
                counts.pop(seq, None)
        self._record_counts(pairs)

    def checkout(self, seq: int) -> None:
        """A consumer took the message (the leader's hot path: recorded at the batch's end)."""
        counts = self.counts
        value = counts.get(seq, 0) | CHECKED_OUT
        counts[seq] = value
        self._checkouts.append((seq, value))

    def _record_counts(self, pairs: list[tuple[int, int]]) -> None:
        self._open()
        if self.ops is not None:
            self.ops.append((OP_COUNT, pairs))
        self._dirty_counts.extend(pairs)

    def apply(self, pos: int, ops: Iterable[Op]) -> None:
        """A follower: one batch of the leader's, at `pos`."""
        self.open_pos = pos
        for op in ops:
            kind = op[0]
            if kind == OP_PUB:
                self.publish(op[1], op[2], op[3])
            elif kind == OP_ACK:
                self.ack(op[1])
            elif kind == OP_COUNT:
                self.set_counts(op[1])
        self.end_batch()

    # -- what AMQQueue asks of a durability ------------------------------------------------------
    def track(self, msg: Message, channel: Any, cseq: int) -> None:
        raise AssertionError("a quorum queue confirms by commit, not by its own fsync")

    def delivered(self, seq: int) -> None:
        """AMQQueue's note of a delivery: a quorum queue's backing queue records each one
        itself as a delivery state (QuorumVariableQueue.fetch), whatever the delivery mode."""

    def end_batch(self) -> None:
        """The open batch is complete: its position is the member's, its operations are
        shipped, its writes go to the OS, and an fsync round is started (or the running one
        will be followed by another)."""
        if self._checkouts:
            counts = self.counts  # those acked or returned since are settled already
            pairs = [(s, v) for s, v in self._checkouts if counts.get(s) == v]
            self._checkouts = []
            if pairs:
                self._record_counts(pairs)
        if not self.open_pos:
            return
        pos = self.state.pos = self.open_pos
        self.open_pos = 0
        if self.ops:
            ops, self.ops = self.ops, []
            assert self.ship is not None
            self.ship(pos, ops)
        self.index.flush()
        self._kick()

    # -- group commit -----------------------------------------------------------------------------
    def _kick(self) -> None:
        if self._syncing or self.closed or (
                self.state.pos == self.synced_pos and not self._state_dirty):
            return
        self._syncing = True
        self._state_dirty = False
        self._rounds += 1
        round_no = self._rounds
        stream = self._stream
        target = self.state.pos
        state = self.state.copy()
        counts, self._dirty_counts = self._dirty_counts, []
        record = encode_counts(counts) + encode_state(state)
        compact = (self.meta.size > COMPACT_BYTES and dict(self.counts)) or None
        fut = asyncio.get_running_loop().run_in_executor(
            None, self._sync_round, record, state, compact)
        fut.add_done_callback(lambda f: self._synced(target, counts, round_no, stream, f))

    def _sync_round(self, record: bytes, state: MemberState,
                    compact: dict[int, int] | None) -> None:  # worker thread
        if self.fsync == "never":
            self.index.flush()
        else:
            self.index.sync()
        with self._meta_lock:
            if self.closed:
                return  # close() wrote the final state
            if compact is not None or self.meta.size > COMPACT_BYTES:
                self.meta.rewrite(state, compact or {})
            else:
                self.meta.append(record)

    def _synced(self, target: int, counts: list[tuple[int, int]], round_no: int,
                stream: int, fut: asyncio.Future[None]) -> None:
        self._syncing = False
        if self.closed:
            return
        exc = fut.exception()
        if exc is not None:
            log.error("quorum member fsync failed, will retry", queue=self.name, error=str(exc))
            self._dirty_counts[:0] = counts
            self._retry = asyncio.get_running_loop().call_later(_RETRY_S, self._retry_kick)
            return
        if stream == self._stream:
            self.synced_pos = target
        before = self.durable_pos
        self._advance()
        if self._notify_round and round_no >= self._notify_round:
            self._notify_round = 0
            if self.durable_pos == before and self.on_durable is not None:
                self.on_durable(self.durable_pos)
        self._kick()

    def _retry_kick(self) -> None:
        self._retry = None
        self._kick()

    def _advance(self) -> None:
        durable = self.synced_pos
        if self._store_wait:
            durable = min(durable, next(iter(self._store_wait.values())) - 1)
        if durable > self.durable_pos:
            self.durable_pos = durable
            if self.on_durable is not None:
                self.on_durable(durable)

    # StoreClient: bodies of large messages
    def msgs_durable(self, msg_ids: list[int]) -> None:
        wait = self._store_wait
        for msg_id in msg_ids:
            wait.pop(msg_id, None)
        self._advance()

    def msgs_failed(self, msg_ids: list[int], error: OSError) -> None:
        # the batch cannot become durable here: this member's position stops before it
        log.error("quorum member body write failed", queue=self.name, error=str(error),
                  messages=len(msg_ids))

    # -- member state -----------------------------------------------------------------------------
    def save_state(self) -> None:
        """The member state changed outside a batch (epoch, voter): written with the next
        fsync round, which is started now."""
        self._state_dirty = True
        self._kick()

    # -- life cycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Clean stop: everything written and fsynced, member file included."""
        if self.closed:
            return
        self.end_batch()
        if self._retry is not None:
            self._retry.cancel()
        with self._meta_lock:
            self.closed = True
            try:
                self.index.close()
                # the whole delivery state: a sync round still running leaves its counts out
                self.meta.rewrite(self.state, dict(self.counts))
            except OSError as exc:
                log.error("quorum member not closed cleanly", queue=self.name, error=str(exc))
            self.meta.close()

    def delete(self) -> None:
        with self._meta_lock:
            self.closed = True
        if self._retry is not None:
            self._retry.cancel()
        for msg_id in self._store_ids.values():
            self.store.remove(msg_id)
        self._store_ids.clear()
        self.meta.close()
        self.index.delete()


class LogIndex:
    """The index as the leader's variable queue sees it: reads go to the index, removals go
    through the log (so they are replicated). Entries come in at commit already written.
    `held`: messages dead-lettered at least once whose removal waits for the confirms."""

    __slots__ = ("held", "log")

    def __init__(self, member: MemberLog) -> None:
        self.log = member
        self.held: set[int] = set()

    def should_embed(self, size: int) -> bool:
        return self.log.index.should_embed(size)

    def publish(self, seq_id: int, msg_id: int, payload: bytes | None) -> None:
        raise AssertionError("quorum queue entries are written by the log, before commit")

    def read(self, start_seq: int, end_seq: int) -> Sequence[IndexEntry]:
        return self.log.index.read(start_seq, end_seq)

    def ack(self, seq_ids: Iterable[int]) -> None:
        held = self.held
        self.log.ack([s for s in seq_ids if s not in held] if held else list(seq_ids))


class LogStore:
    """The message store as the leader's variable queue sees it: it reads bodies; the log
    writes and removes them (at PUB and ACK)."""

    __slots__ = ("owner", "store")

    def __init__(self, store: MsgStore, owner: tuple[str, str]) -> None:
        self.store = store
        self.owner = owner

    def write(self, msg_id: int, data: bytes, client: object | None) -> None:
        raise AssertionError("quorum queue bodies are written by the log")

    def read(self, msg_id: int) -> bytes:
        return self.store.read(msg_id, self.owner)

    def remove(self, msg_id: int) -> None:
        pass
