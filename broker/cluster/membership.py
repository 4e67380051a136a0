"""Cluster membership on etcd leases.

Two key families under `/hare/<cluster>/`:

  nodes/<name>  the node's card (JSON: node_id, pid, host, ports, start time, alarms), put
                under the node's lease: it disappears when the node stops refreshing the lease
                (process gone, host gone, partitioned from etcd for the lease's TTL). A node
                is running for the cluster exactly while this key exists.
  known/<name>  the same node's first card, without a lease: the cluster remembers its
                members when they are down (RabbitMQ lists stopped nodes too).

A name is one node. Joining is a transaction "create nodes/<name> if absent"; when the key is
there, the card's node_id says who holds it. Another node_id: a second node is using the name,
and start-up is refused. Our own node_id (kept in the data directory, whose lock we hold, so
its previous process is dead): a restart within the old lease's TTL, and we take the key
over by revoking the old lease."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import structlog

from broker.cluster.etcd import Etcd, EtcdUnavailable, KeyValue, sleep_backoff
from broker.cluster.local import Member, NodeNameTaken

__all__ = ["Membership", "NodeNameTaken"]

log = structlog.get_logger("hare.cluster")


class Membership:
    def __init__(self, etcd: Etcd, root: str, node_name: str, node_id: str, ttl_s: int,
                 card: Callable[[], dict[str, Any]]) -> None:
        self.etcd = etcd
        self.node_name = node_name
        self.node_id = node_id
        self.ttl_s = ttl_s
        self.card = card  # the node's current card fields (ports, alarms)
        self.nodes_prefix = root + "nodes/"
        self.known_prefix = root + "known/"
        self.lease = 0
        self.started_ms = int(time.time() * 1000)
        self.running: dict[str, dict[str, Any]] = {}  # name -> card, from nodes/
        self.known: dict[str, dict[str, Any]] = {}  # name -> card, from known/
        self.old_names: set[str] = set()  # this node's names before (join forgot them)
        self.on_change: Callable[[str, bool], None] | None = None  # (name, running)
        # until when (monotonic) our lease surely holds: from before the call that granted or
        # refreshed it, so never later than etcd's own expiry
        self.lease_until = 0.0
        self.on_rejoined: Callable[[], None] | None = None  # our lease had expired
        self.on_card: Callable[[], None] | None = None  # a running node's card changed
        self.lease_lost = 0  # times our lease expired under us (partitions survived)

    # -- our own card -----------------------------------------------------------------------
    def _own_card(self) -> bytes:
        card = {"name": self.node_name, "node_id": self.node_id, "pid": os.getpid(),
                "host": socket.gethostname(), "started": self.started_ms,
                "lease": self.lease, **self.card()}
        return json.dumps(card, sort_keys=True).encode()

    async def join(self) -> None:
        """Take our name in the cluster, or raise NodeNameTaken. The names this node had
        before (its data directory's node_id under another `node_name`) are forgotten, as a
        single node forgets its old name: only other nodes are remembered while down."""
        key = self.nodes_prefix + self.node_name
        old_names = await self._old_names()
        self.old_names |= {k[len(self.known_prefix):] for k in old_names}
        asked = time.monotonic()
        self.lease = await self.etcd.grant(self.ttl_s)
        self.lease_until = asked + self.ttl_s
        card = self._own_card()
        for _ in range(3):
            result = await self.etcd.txn(
                [Etcd.absent(key)],
                [Etcd.op_put(key, card, self.lease),
                 Etcd.op_put(self.known_prefix + self.node_name, card),
                 *(Etcd.op_delete(k) for k in old_names)],
                [Etcd.op_get(key)],
            )
            if result.succeeded:
                return
            if not result.kvs:
                continue  # gone meanwhile: try again
            holder = json.loads(result.kvs[0].value)
            if holder.get("node_id") != self.node_id:
                await self.etcd.revoke(self.lease)
                raise NodeNameTaken(
                    f"node name '{self.node_name}' is already in use in the cluster "
                    f"(pid {holder.get('pid')} on {holder.get('host')}); refusing to start"
                )
            # our own previous process (killed): its lease still holds the key
            old = int(holder.get("lease") or result.kvs[0].lease)
            log.info("taking over the previous incarnation's lease", node=self.node_name)
            if old:
                try:
                    await self.etcd.revoke(old)
                except EtcdUnavailable:
                    await self.etcd.delete(key)
            else:
                await self.etcd.delete(key)
        raise NodeNameTaken(f"node name '{self.node_name}': could not take it in etcd")

    async def _old_names(self) -> list[str]:
        """The known/ keys of this node_id under a name other than ours."""
        kvs, _ = await self.etcd.get_prefix(self.known_prefix)
        return [kv.key for kv in kvs if kv.key != self.known_prefix + self.node_name
                and json.loads(kv.value).get("node_id") == self.node_id]

    async def refresh_card(self) -> None:
        """Publish our card again (alarms changed)."""
        if self.lease:
            await self.etcd.put(self.nodes_prefix + self.node_name, self._own_card(),
                                lease=self.lease)

    async def keep_alive(self, on_etcd: Callable[[bool], None]) -> None:
        """Refresh the lease every third of its TTL, for ever. A lease that expired (we were
        cut off from etcd longer than the TTL) is replaced and the card put again: the node
        comes back as running. `on_etcd(reachable)` reports etcd's reachability."""
        attempt = 0
        while True:
            try:
                asked = time.monotonic()
                left = await self.etcd.keepalive(self.lease)
                if left <= 0:
                    self.lease_lost += 1
                    self.lease_until = 0.0
                    log.warning("cluster lease expired: joining again", node=self.node_name)
                    await self.join()
                    if self.on_rejoined is not None:
                        self.on_rejoined()
                else:
                    self.lease_until = asked + left
                on_etcd(True)
                attempt = 0
                await asyncio.sleep(self.ttl_s / 3)
            except EtcdUnavailable as exc:
                on_etcd(False)
                log.warning("etcd unreachable", error=str(exc))
                await sleep_backoff(attempt)
                attempt += 1
            except NodeNameTaken as exc:  # our name was taken while we were away
                log.error("cluster name lost", error=str(exc))
                on_etcd(True)
                await asyncio.sleep(self.ttl_s / 3)

    async def leave(self) -> None:
        if self.lease:
            try:
                await self.etcd.revoke(self.lease)
            except EtcdUnavailable:
                pass
            self.lease = 0

    # -- everyone's cards (fed by the cluster's watch) --------------------------------------
    def load(self, kvs: list[KeyValue]) -> None:
        """A full read of the nodes/ and known/ families."""
        self.running.clear()
        self.known.clear()
        for kv in kvs:
            self.apply(kv, deleted=False, quiet=True)

    def apply(self, kv: KeyValue, *, deleted: bool, quiet: bool = False) -> None:
        if kv.key.startswith(self.nodes_prefix):
            name = kv.key[len(self.nodes_prefix):]
            was = name in self.running
            if deleted:
                self.running.pop(name, None)
            else:
                self.running[name] = json.loads(kv.value)
            now = name in self.running
            if was != now and not quiet:
                log.info("cluster node " + ("up" if now else "down"), node=name)
                if self.on_change is not None:
                    self.on_change(name, now)
            if self.on_card is not None:
                self.on_card()
        elif kv.key.startswith(self.known_prefix):
            name = kv.key[len(self.known_prefix):]
            if deleted:
                self.known.pop(name, None)
            else:
                self.known[name] = json.loads(kv.value)

    def members(self) -> list[Member]:
        names = sorted({*self.known, *self.running, self.node_name})
        return [Member(n, n in self.running or n == self.node_name,
                       self.running.get(n) or self.known.get(n) or {}) for n in names]

    def is_running(self, name: str) -> bool:
        return name == self.node_name or name in self.running
