"""The cluster's definitions in etcd: writes, claims, and applying what other nodes wrote.

Every definition is one key `/hare/<cluster>/meta/<family>/<id>` holding a JSON record
(broker/cluster/families.py). A node changes definitions the way it always did (VHost,
VHostParams and the management API mutate local state and report through Node.changed);
`changed` turns each report into an etcd put or delete, and `commit` returns once they are
in etcd (one transaction per batch). Creations that can race - a queue or exchange name
declared on two nodes at once - are *claimed* first: a transaction "create if absent" that
either wins or hands back the winner's record, which is applied here before the declare
compares against it (406 as on one node). Other nodes' changes arrive through the watch and
are applied with `quiet()` on, so they are not written back."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import structlog

from broker.cluster.etcd import Etcd, EtcdUnavailable, KeyValue, sleep_backoff
from broker.cluster.families import BY_NAME, FAMILIES, family_of_event, key_parts, record_key
from broker.protocol.constants import INTERNAL_ERROR
from broker.protocol.errors import ChannelError

if TYPE_CHECKING:
    from broker.node import Node

__all__ = ["ClusterMetadata", "MetadataUnavailable", "cluster_root", "transient_keys"]

log = structlog.get_logger("hare.cluster")

_TXN_OPS = 100  # etcd refuses transactions of more than 128 operations by default


class MetadataUnavailable(ChannelError):
    """etcd cannot take a metadata change: the change is refused (traffic goes on)."""

    def __init__(self, detail: str = "etcd unreachable") -> None:
        super().__init__(
            INTERNAL_ERROR,
            f"metadata store unavailable ({detail}): definitions cannot change now; "
            "publishing and consuming go on",
        )


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


class _Claims:
    """One key's claims on this node, one at a time: a second declare of the same name here
    waits until the first has made its object, then meets it as the winner. While a claim's
    answer is outstanding, the watch's events for the key wait for it too."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
        self.held: list[tuple[KeyValue, bool]] | None = None  # a list while a claim is out


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


class ClusterMetadata:
    def __init__(self, node: Node, etcd: Etcd, root: str) -> None:
        self.node = node
        self.etcd = etcd
        self.prefix = root + "meta/"
        # > 0: applying the cluster's state, nothing to write back; 1 from the start until
        # the node's restore from disk is done and the cluster's state taken (`started`)
        self._quiet = 1
        self._pending: list[dict[str, Any]] = []  # etcd txn operations not yet written
        self._waiters: list[asyncio.Future[None]] = []
        self._writer: asyncio.Task[None] | None = None
        self._claimed: dict[str, str] = {}  # key -> value we already wrote by a claim
        self._own: dict[str, int] = {}  # key -> revision of our last write to it
        self._claims: dict[str, _Claims] = {}
        self.writable = True  # False while etcd refuses or cannot be reached

    # -- local changes -> etcd --------------------------------------------------------------
    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def started(self) -> None:
        """The node has restored its disk and taken the cluster's state: changes from now
        on are the node's own and go to etcd."""
        self._quiet -= 1

    def changed(self, vhost: str | None, what: str, obj: Any) -> None:
        if self._quiet:
            return
        if what in ("put_policy", "delete_policy") and getattr(obj, "operator", False):
            what = what.replace("policy", "operator_policy")
        found = family_of_event(what)
        if found is None:
            return
        family, put = found
        key = self.prefix + record_key(family.name, family.key(vhost, obj))
        if put:
            value = _dumps(family.record(vhost, obj))
            if self._claimed.pop(key, None) == value:
                return  # written by its claim already
            self._pending.append(Etcd.op_put(key, value))
        else:
            self._pending.append(Etcd.op_delete(key))
            self._pending.extend(self._cascade(family.name, vhost, obj))
        self._schedule()

    def forget_queue(self, vhost: str, name: str) -> None:
        """Delete a queue's record (and its bindings') that no node will create again."""
        key = self.prefix + record_key("queues", (vhost, name))
        self._pending.append(Etcd.op_delete(key))
        self._pending.extend(self._cascade("queues", vhost, _Named(name)))
        self._schedule()

    def _cascade(self, family: str, vhost: str | None, obj: Any) -> list[dict[str, Any]]:
        """A deleted queue or exchange takes its bindings' keys along (every node unbinds
        locally on its own; the keys must not outlive them and come back with a namesake)."""
        if family == "queues":
            return [Etcd.op_delete(self.prefix + record_key(
                "bindings", (str(vhost), "queue", obj.name)) + "/", prefix=True)]
        if family == "exchanges":
            ops = [Etcd.op_delete(self.prefix + record_key(
                "bindings", (str(vhost), "exchange", obj.name)) + "/", prefix=True)]
            binding = BY_NAME["bindings"]
            for b in obj.bindings():
                parts = binding.key(vhost, (obj, b.destination, b.routing_key,
                                            b.arguments_dict()))
                ops.append(Etcd.op_delete(self.prefix + record_key("bindings", parts)))
            return ops
        return []

    def _schedule(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write(),
                                                                  name="cluster:meta-writer")

    async def _write(self) -> None:
        """Write what is pending, in order, until nothing is; etcd unreachable: retry (the
        local change is made; the cluster gets it when etcd is back)."""
        attempt = 0
        # a commit() that came while a batch was on its way, with nothing of its own pending,
        # is answered after that batch (a round with no operations)
        while self._pending or self._waiters:
            ops, waiters = self._pending, self._waiters
            self._pending, self._waiters = [], []
            try:
                for i in range(0, len(ops), _TXN_OPS):
                    chunk = ops[i:i + _TXN_OPS]
                    result = await self.etcd.txn([], chunk, [])
                    for op in chunk:
                        put = op.get("request_put")
                        if put is not None:
                            self._own[_key(put["key"])] = result.revision
            except EtcdUnavailable as exc:
                self.writable = False
                self._pending = ops + self._pending
                self._waiters = waiters + self._waiters
                log.warning("metadata write failed, will retry", error=str(exc))
                await sleep_backoff(attempt)
                attempt += 1
                continue
            self.writable = True
            attempt = 0
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    async def commit(self) -> None:
        if not self._pending and (self._writer is None or self._writer.done()):
            return
        done = asyncio.get_running_loop().create_future()
        self._waiters.append(done)
        self._schedule()
        try:
            await asyncio.wait_for(asyncio.shield(done), self.etcd.timeout_s * 2)
        except TimeoutError:
            raise MetadataUnavailable() from None

    async def check_writable(self) -> None:
        if not self.writable:
            raise MetadataUnavailable()

    async def claim(self, family: str, parts: tuple[str, ...], record: dict[str, Any]
                    ) -> dict[str, Any] | None:
        """Create the record if its key is free: None when we won, else the winner's record
        (applied here before returning)."""
        key = self.prefix + record_key(family, parts)
        claims = self._claims.setdefault(key, _Claims())
        claims.users += 1
        try:
            async with claims.lock:
                claims.held = []
                try:
                    return await self._claim(key, family, parts, record)
                finally:
                    held, claims.held = claims.held, None
                    for kv, deleted in held:
                        self.apply_event(kv, deleted)
        finally:
            claims.users -= 1
            if not claims.users:
                del self._claims[key]

    async def _claim(self, key: str, family: str, parts: tuple[str, ...],
                     record: dict[str, Any]) -> dict[str, Any] | None:
        value = _dumps(record)
        try:
            result = await self.etcd.txn([Etcd.absent(key)], [Etcd.op_put(key, value)],
                                         [Etcd.op_get(key)])
        except EtcdUnavailable as exc:
            self.writable = False
            raise MetadataUnavailable() from exc
        self.writable = True
        if result.succeeded:
            self._claimed[key] = value
            self._own[key] = result.revision
            return None
        if not result.kvs:
            return None  # deleted meanwhile: ours is as good as any
        winner: dict[str, Any] = json.loads(result.kvs[0].value)
        with self.quiet():
            BY_NAME[family].apply(self.node, parts, winner)
        return winner

    # -- etcd -> local state ----------------------------------------------------------------
    def apply_event(self, kv: KeyValue, deleted: bool) -> None:
        claims = self._claims.get(kv.key)
        if claims is not None and claims.held is not None:
            claims.held.append((kv, deleted))  # its claim's answer comes first
            return
        if not deleted and self._own.get(kv.key) == kv.mod_revision:
            return  # our own write, applied when we made it
        family_name, parts = key_parts(kv.key[len(self.prefix):])
        family = BY_NAME.get(family_name)
        if family is None:
            return  # a kind this node does not know (a newer node wrote it)
        record = None if deleted else json.loads(kv.value)
        with self.quiet():
            try:
                family.apply(self.node, parts, record)
            except Exception:
                log.exception("cluster metadata not applied", key=kv.key)

    def load(self, kvs: list[KeyValue]) -> None:
        """Take the cluster's whole state (start, or a compacted watch): apply every record,
        families in order, then drop what this node has and the cluster does not."""
        by_family: dict[str, list[tuple[tuple[str, ...], dict[str, Any]]]] = {}
        for kv in kvs:
            family_name, parts = key_parts(kv.key[len(self.prefix):])
            by_family.setdefault(family_name, []).append((parts, json.loads(kv.value)))
        with self.quiet():
            for family in sorted(FAMILIES, key=lambda f: f.order):
                for parts, record in by_family.get(family.name, []):
                    try:
                        family.apply(self.node, parts, record)
                    except Exception:
                        log.exception("cluster metadata not applied", family=family.name,
                                      key=parts)
            wanted = {f.name: {parts for parts, _ in by_family.get(f.name, [])}
                      for f in FAMILIES}
            for family in sorted(FAMILIES, key=lambda f: -f.order):
                for parts in family.local(self.node):
                    if parts not in wanted[family.name]:
                        try:
                            family.apply(self.node, parts, None)
                        except Exception:
                            log.exception("local definition not dropped", family=family.name,
                                          key=parts)

    def seed_ops(self) -> list[dict[str, Any]]:
        """Every definition this node has, as puts: the first node of a cluster (or a single
        node joining one with an empty etcd) brings its definitions along."""
        ops = []
        for family in sorted(FAMILIES, key=lambda f: f.order):
            for vhost, obj in family.objects(self.node):
                key = self.prefix + record_key(family.name, family.key(vhost, obj))
                ops.append(Etcd.op_put(key, _dumps(family.record(vhost, obj))))
        return ops

    async def rehome(self, kvs: list[KeyValue], old_names: set[str]) -> None:
        """This node's queues recorded under a name it had before (its data directory
        started under another `node_name`) are its own: their records name it now."""
        if not old_names:
            return
        ops = []
        for kv in kvs:
            if key_parts(kv.key[len(self.prefix):])[0] != "queues":
                continue
            record = json.loads(kv.value)
            members = record.get("members")
            if record["node"] in old_names or any(m in old_names for m in members or ()):
                if record["node"] in old_names:
                    record["node"] = self.node.name
                if members:
                    record["members"] = [self.node.name if m in old_names else m
                                         for m in members]
                ops.append(Etcd.op_put(kv.key, _dumps(record)))
        for i in range(0, len(ops), _TXN_OPS):
            await self.etcd.txn([], ops[i:i + _TXN_OPS], [])

    async def seed(self) -> None:
        for i in range(0, len(ops := self.seed_ops()), _TXN_OPS):
            await self.etcd.txn([], ops[i:i + _TXN_OPS], [])


def cluster_root(cluster_name: str) -> str:
    """Where everything of a cluster is kept in etcd (docs/CLUSTER.md, "Keys")."""
    return f"/hare/{cluster_name}/"


def transient_keys(root: str, items: list[tuple[bytes, bytes]]) -> list[bytes]:
    """Of every (key, value), the definitions under `root` that do not outlive a restart of
    the whole broker: non-durable exchanges, non-durable and exclusive queues, and the
    bindings from or to any of them (RabbitMQ keeps them in RAM only). A multi-worker
    server's parent drops them when it starts (a worker's restart keeps them: the broker
    was up)."""
    prefix = (root + "meta/").encode()
    gone: set[tuple[str, str, str]] = set()  # (vhost, kind, name)
    keys: list[bytes] = []
    bindings: list[tuple[bytes, dict[str, Any]]] = []
    for key, value in items:
        if not key.startswith(prefix):
            continue
        family, _ = key_parts(key[len(prefix):].decode())
        if family not in ("exchanges", "queues", "bindings"):
            continue
        record = json.loads(value)
        if family == "bindings":
            bindings.append((key, record))
        elif not record["durable"] or (family == "queues" and record["exclusive"]):
            gone.add((record["vhost"], family[:-1], record["name"]))
            keys.append(key)
    keys.extend(key for key, b in bindings
                if (b["vhost"], "exchange", b["source"]) in gone
                or (b["vhost"], b["destination_type"], b["destination"]) in gone)
    return keys


def _key(b64: str) -> str:
    import base64

    return base64.b64decode(b64).decode()
