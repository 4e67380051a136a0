"""A quorum queue follower on this node: its member log (broker/queue/quorum_log.py), the
leader it follows, and the exchange with that leader over the inter-node link.

It asks the leader of the record's epoch for a copy (`q_copy`, with the seq_ids it holds) as
soon as a link to it is up, applies the copy and then the leader's batches, and answers each
position it holds on disk (`q_pos`). It refuses batches of an epoch it has voted past
(`q_stale`: the leader's fence, docs/CLUSTER.md). During a copy it is not a voter: its member
file says so before the copy changes anything on disk, and the copy's end makes it one again,
holding the leader's position."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from broker.cluster.link_codec import LOG_BATCH, LOG_COPY, LOG_COPY_BEGIN
from broker.queue.quorum_log import Op

if TYPE_CHECKING:
    from broker.cluster.link import Link
    from broker.cluster.quorum import QuorumCoordinator
    from broker.queue.quorum_log import MemberLog

__all__ = ["Replica"]

log = structlog.get_logger("hare.quorum")

_IDLE, _ASKED, _COPYING, _FOLLOWING = "idle", "asked", "copying", "following"


class Replica:
    def __init__(self, coordinator: QuorumCoordinator, vhost: str, name: str,
                 member: MemberLog) -> None:
        self.coordinator = coordinator
        self.vhost = vhost
        self.name = name
        self.member = member
        if not member.opened:
            member.recover()
        member.on_durable = self._durable
        member.ship_to(None)
        self.leader = ""  # the node it follows
        self.epoch = 0  # that leader's epoch
        self.state = _IDLE

    @property
    def voter(self) -> bool:
        return self.member.state.voter

    def follow(self, leader: str, epoch: int) -> None:
        """The record names this leader and epoch: follow it (ask for a copy when a link to
        it is up; the coordinator calls `link_up` then)."""
        if (leader, epoch) == (self.leader, self.epoch) and self.state != _IDLE:
            return
        self.leader, self.epoch = leader, epoch
        self.state = _IDLE
        self.ask()

    def fenced(self, epoch: int) -> bool:
        """This member voted past `epoch`: its leader's batches are refused."""
        return epoch < self.member.state.epoch

    def ask(self) -> None:
        if not self.leader or self.leader == self.coordinator.me or self.fenced(self.epoch):
            return
        link = self.coordinator.cluster.links.get(self.leader)
        if link is None:
            return
        member = self.member
        member.end_batch()
        s = member.state
        link.control({"op": "q_copy", "v": self.vhost, "q": self.name, "epoch": self.epoch,
                      "last_epoch": s.last_epoch, "pos": s.pos,
                      "ranges": member.index.live_ranges()})
        self.state = _ASKED

    def ask_later(self, delay_s: float = 0.5) -> None:
        """The leader had no queue to copy yet: ask again (while it is still the one)."""
        self.state = _IDLE
        leader, epoch = self.leader, self.epoch

        def again() -> None:
            if (self.leader, self.epoch, self.state) == (leader, epoch, _IDLE):
                self.ask()
        asyncio.get_running_loop().call_later(delay_s, again)

    def stop_following(self) -> None:
        self.leader, self.epoch, self.state = "", 0, _IDLE

    # -- frames from the leader ---------------------------------------------------------------
    def on_log(self, link: Link, epoch: int, pos: int, kind: int, ops: list[Op]) -> None:
        member = self.member
        if member.closed:
            return
        if self.fenced(epoch):
            link.control({"op": "q_stale", "v": self.vhost, "q": self.name,
                          "epoch": member.state.epoch})
            return
        if link.peer != self.leader or epoch != self.epoch:
            return  # a leader the record does not name (yet): its copy comes after
        if kind == LOG_COPY_BEGIN:
            if self.state != _ASKED:
                return
            member.begin_copy(pos)
            member.apply(pos, ops)
            self.state = _COPYING
        elif kind == LOG_COPY:
            if self.state == _COPYING:
                member.apply(max(pos, member.state.pos), ops)
        elif kind == LOG_BATCH and self.state in (_COPYING, _FOLLOWING):
            member.apply(pos, ops)

    def copy_end(self, link: Link, m: dict[str, Any]) -> None:
        if link.peer != self.leader or int(m["epoch"]) != self.epoch or self.state != _COPYING:
            return
        self.member.end_copy(self.epoch, [(int(e), int(s)) for e, s in m["history"]])
        self.state = _FOLLOWING
        log.info("quorum member copied", queue=self.name, vhost=self.vhost,
                 leader=self.leader, epoch=self.epoch, position=self.member.state.pos)

    def _durable(self, pos: int) -> None:
        if self.state != _FOLLOWING or self.member.copying:
            return
        link = self.coordinator.cluster.links.get(self.leader)
        if link is not None:
            link.control({"op": "q_pos", "v": self.vhost, "q": self.name,
                          "epoch": self.epoch, "pos": pos})

    def link_down(self) -> None:
        if self.state != _IDLE:
            self.state = _IDLE  # a new link means a new copy (what was in flight is lost)

    def info(self) -> dict[str, Any]:
        s = self.member.state
        return {"state": self.state, "leader": self.leader, "epoch": self.epoch,
                "position": self.member.durable_pos, "last_epoch": s.last_epoch,
                "voter": s.voter}
