"""A quorum queue leader's followers, over the inter-node link: each turn's batch goes to every
follower that follows this leader; each follower answers the position it holds; and a follower
that (re)joins - after a restart, a lost disk, a new leader, `hare-ctl grow` - is brought to the
leader's state by a copy of what it lacks (docs/CLUSTER.md, "Replicated queues").

The copy is a diff, never a replay of old batches (the leader keeps none): the follower sends
the seq_ids it holds as ranges with the epoch of its last leader; the leader answers, at its
current position P, with one LOG_COPY_BEGIN frame (ACK of what the follower holds and the
leader does not, and every delivery state), LOG_COPY frames with the messages the follower
lacks (read from the index a segment at a time, as the link drains), and `q_copy_end`. Batches
after P go to the follower meanwhile, in the link's order, so what it applies converges: a
message acked after P was acked before its copy was read, and is not sent. Entries from
`divergence` on (the first seq_id of the first epoch after the follower's last one) may differ
in content from the leader's, so they are replaced, not kept."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog

from broker.cluster.link_codec import LOG_BATCH, LOG_COPY, LOG_COPY_BEGIN, encode_log
from broker.queue.quorum_log import OP_ACK, OP_COUNT, OP_PUB, Op

if TYPE_CHECKING:
    from broker.cluster.link import Link
    from broker.cluster.quorum import QuorumCoordinator
    from broker.queue.quorum_queue import QuorumQueue

__all__ = ["LeaderFollowers", "divergence", "ranges_minus"]

log = structlog.get_logger("hare.quorum")

Ranges = list[tuple[int, int]]  # sorted, disjoint [start, end) seq_id ranges
_PIECE_BYTES = 1 << 20  # a LOG_COPY frame carries about this much
_PIECE_ENTRIES = 4096
INFINITY = 1 << 63


def ranges_minus(a: Ranges, b: Ranges) -> Ranges:
    """The parts of `a` outside `b` (both sorted and disjoint)."""
    out: Ranges = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while start < end:
            if k >= len(b) or b[k][0] >= end:
                out.append((start, end))
                break
            if b[k][0] > start:
                out.append((start, b[k][0]))
            start = max(start, b[k][1])
            k += 1
    return out


def _expand(ranges: Iterable[tuple[int, int]]) -> list[int]:
    return [seq for start, end in ranges for seq in range(start, end)]


def divergence(last_epoch: int, epoch: int, history: list[tuple[int, int]]) -> int:
    """The first seq_id a member that last followed `last_epoch` may hold differently from a
    leader of `epoch` whose epochs began at `history` [(epoch, first seq_id)]."""
    if last_epoch >= epoch:
        return INFINITY
    for e, first in history:
        if e > last_epoch:
            return first
    return 0


class _Follower:
    __slots__ = ("copy", "link", "name", "pos", "synced")

    def __init__(self, name: str, link: Link) -> None:
        self.name = name
        self.link = link
        self.pos = 0
        self.synced = False  # it answered a position of this leader's after its copy
        self.copy: asyncio.Task[None] | None = None


class LeaderFollowers:
    """The Followers of one QuorumQueue leader (broker/queue/quorum_queue.py)."""

    def __init__(self, coordinator: QuorumCoordinator, queue: QuorumQueue) -> None:
        self.coordinator = coordinator
        self.queue = queue
        self.vhost = queue.vhost.name
        self.name = queue.name
        self.followers: dict[str, _Follower] = {}
        self.shipped_bytes = 0  # LOG frame bytes sent (figures: the cost of replication)

    # -- the Followers protocol -------------------------------------------------------------
    def ship(self, pos: int, ops: list[Op]) -> None:
        frame: list[bytes] | None = None
        for f in self.followers.values():
            if f.link.closed:
                continue
            if frame is None:
                frame = encode_log(self.queue.epoch, pos, LOG_BATCH, self.vhost, self.name, ops)
                size = sum(len(p) for p in frame)
            f.link.send(frame)
            self.shipped_bytes += size

    def positions(self) -> list[int]:
        members = set(self.queue.members)
        return [f.pos for f in self.followers.values() if f.synced and f.name in members]

    def stop(self) -> None:
        for f in self.followers.values():
            if f.copy is not None:
                f.copy.cancel()
        self.followers.clear()

    # -- what followers say ---------------------------------------------------------------
    def copy_request(self, link: Link, m: dict[str, Any]) -> None:
        """A follower asks to follow this leader: copy it what it lacks, then batches."""
        q = self.queue
        old = self.followers.pop(link.peer, None)
        if old is not None and old.copy is not None:
            old.copy.cancel()
        member = q.log
        member.end_batch()  # the copy starts between two batches
        pos = member.state.pos
        high = member.next_seq()
        ours = member.index.live_ranges()
        theirs: Ranges = [(a, b) for a, b in m["ranges"]]
        cut = divergence(int(m["last_epoch"]), q.epoch, member.state.history)
        keep = [(cut, INFINITY)] if cut < INFINITY else []
        trusted_theirs = ranges_minus(theirs, keep)
        acks = _expand(ranges_minus(theirs, ranges_minus(ours, keep)))
        send = [r for r in ranges_minus(ours, trusted_theirs) if r[0] < high]
        counts = [(seq, value) for seq, value in member.counts.items()]
        ops: list[Op] = []
        if acks:
            ops.append((OP_ACK, acks))
        if counts:
            ops.append((OP_COUNT, counts))
        link.send(encode_log(q.epoch, pos, LOG_COPY_BEGIN, self.vhost, self.name, ops))
        f = self.followers[link.peer] = _Follower(link.peer, link)
        f.copy = asyncio.get_running_loop().create_task(
            self._copy(f, pos, send), name=f"quorum-copy:{self.name}:{link.peer}")
        log.info("quorum member copy started", queue=self.name, vhost=self.vhost,
                 member=link.peer, position=pos, acks=len(acks),
                 ranges=len(send), divergence=cut if cut < INFINITY else None)

    async def _copy(self, f: _Follower, pos: int, ranges: Ranges) -> None:
        q = self.queue
        member = q.log
        store = member.store
        sent = 0
        try:
            for start, end in ranges:
                at = start
                while at < end:
                    stop = min(end, at + _PIECE_ENTRIES)
                    ops: list[Op] = []
                    size = 0
                    for e in member.index.read(at, stop):  # only what is still live now
                        data = e.payload if e.payload is not None else store.read(e.msg_id)
                        ops.append((OP_PUB, e.seq_id, e.msg_id, data))
                        size += len(data)
                        if size >= _PIECE_BYTES:
                            stop = e.seq_id + 1
                            break
                    at = stop
                    if ops:
                        f.link.send(encode_log(q.epoch, pos, LOG_COPY, self.vhost, self.name,
                                               ops))
                        sent += len(ops)
                        self.shipped_bytes += size
                    await f.link.drained()
            f.link.control({"op": "q_copy_end", "v": self.vhost, "q": self.name,
                            "epoch": q.epoch, "pos": pos,
                            "history": member.state.history})
            log.info("quorum member copy sent", queue=self.name, vhost=self.vhost,
                     member=f.name, messages=sent)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("quorum member copy failed", queue=self.name, member=f.name)
        finally:
            f.copy = None

    def position(self, peer: str, m: dict[str, Any]) -> None:
        f = self.followers.get(peer)
        if f is None or int(m["epoch"]) != self.queue.epoch:
            return
        pos = int(m["pos"])
        if pos > f.pos or not f.synced:
            f.pos = pos
            f.synced = True
            self.queue.followers_moved()

    def link_down(self, peer: str) -> None:
        f = self.followers.pop(peer, None)
        if f is not None:
            if f.copy is not None:
                f.copy.cancel()
            self.queue.followers_moved()

    def member_positions(self) -> dict[str, int]:
        return {f.name: f.pos for f in self.followers.values() if f.synced}
