"""The meta server's state: etcd's key-value model in plain code (no I/O, no event loop).

One global revision; per key its create and mod revisions and its version; a txn applies its
requests in order at one new revision (none when it changed nothing); leases hold keys and
take them along when revoked or expired. Every change is a list of `Event`s at one revision:
the watch history keeps the last `history` revisions of them, and the log
(meta_log.py) writes exactly them, so a replay (`apply`) rebuilds the same state.

The rules copied from etcd (server/etcdserver/apply.go, txn.go, v3rpc/key.go), because the
client and the tests that check parity depend on them: a compare of VALUE on a missing key
fails, of anything else compares against zeros; a put and a delete of the same key (or two
puts) in one branch are "duplicate key given in txn request"; a lease shorter than
`MIN_TTL_S` is granted as `MIN_TTL_S`; a watch may resume from the oldest revision held
(`compact_revision`), not before."""

from __future__ import annotations

import bisect
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_TXN_OPS", "MIN_TTL_S", "Event", "Lease", "MetaError", "MetaStore", "Record"]

MIN_TTL_S = 2  # etcd's minimum with its default election timeout (1.5 s, rounded up)
MAX_TXN_OPS = 128  # etcd's --max-txn-ops default


class MetaError(Exception):
    """A refused request, with etcd's gRPC code and the HTTP status its gateway gives it."""

    def __init__(self, message: str, code: int = 3, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def _lease_not_found() -> MetaError:
    return MetaError("etcdserver: requested lease not found", code=5, status=404)


@dataclass(slots=True)
class Record:
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class Event:
    """A put (record set) or a delete (record None) of one key at `revision`."""

    key: bytes
    revision: int
    record: Record | None


@dataclass(slots=True)
class Lease:
    ttl_s: int
    deadline: float
    keys: set[bytes] = field(default_factory=set)


def in_range(key: bytes, start: bytes, end: bytes) -> bool:
    """etcd's [key, range_end): no end is the one key, end b"\\0" every key from start on."""
    if not end:
        return key == start
    return start <= key and (end == b"\0" or key < end)


class MetaStore:
    """Keys, revision, leases and the recent history. Times are the caller's clock."""

    def __init__(self, history: int = 10_000) -> None:
        self.revision = 1  # etcd starts at 1 with nothing in it
        self.keys: dict[bytes, Record] = {}
        self._order: list[bytes] = []  # the keys sorted, for ranges
        self.leases: dict[int, Lease] = {}
        self.history: deque[list[Event]] = deque()  # one list per revision, oldest first
        self.history_limit = history
        self.compact_revision = 0  # the oldest revision a watch may start from

    # -- reads ------------------------------------------------------------------------------
    def range(self, key: bytes, end: bytes) -> list[tuple[bytes, Record]]:
        if not end:
            record = self.keys.get(key)
            return [(key, record)] if record is not None else []
        lo = bisect.bisect_left(self._order, key)
        hi = len(self._order) if end == b"\0" else bisect.bisect_left(self._order, end, lo)
        return [(k, self.keys[k]) for k in self._order[lo:hi]]

    def events_since(self, start: int) -> list[Event]:
        """Every event at revision >= start still held (the caller checked compaction)."""
        if not self.history:
            return []
        first = self.history[0][0].revision
        out: list[Event] = []
        for i in range(max(0, start - first), len(self.history)):
            out.extend(self.history[i])
        return out

    # -- writes -----------------------------------------------------------------------------
    def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
            failure: list[dict[str, Any]]) -> tuple[bool, list[dict[str, Any]], list[Event]]:
        """Run a txn: (succeeded, one answer per request, the events it made). Requests
        arrive decoded (bytes keys) by the server; answers are plain dicts it encodes."""
        for branch in (success, failure):
            _check_branch(branch)
        ok = all(self._compare(c) for c in compare)
        branch = success if ok else failure
        for request in branch:  # nothing is applied when a lease is missing
            put = request.get("put")
            if put is not None and put["lease"] and put["lease"] not in self.leases:
                raise _lease_not_found()
        rev = self.revision + 1
        events: list[Event] = []
        answers: list[dict[str, Any]] = []
        for request in branch:
            if "put" in request:
                put = request["put"]
                events.append(self._put(put["key"], put["value"], put["lease"], rev))
                answers.append({"put": None})
            elif "delete" in request:
                gone = self.range(*request["delete"])
                for key, _ in gone:
                    events.append(self._delete(key, rev))
                answers.append({"delete": len(gone)})
            else:
                answers.append({"range": self.range(*request["range"])})
        self._commit(events)
        return ok, answers, events

    def _compare(self, c: dict[str, Any]) -> bool:
        found = self.range(c["key"], c["range_end"])
        target, result, want = c["target"], c["result"], c["value"]
        if not found:
            if target == "VALUE":
                return False  # no way to tell a missing value from an empty one
            found = [(c["key"], Record(b"", 0, 0, 0, 0))]
        for _, record in found:
            have = {"VALUE": record.value, "CREATE": record.create_revision,
                    "MOD": record.mod_revision, "VERSION": record.version,
                    "LEASE": record.lease}[target]
            if not {"EQUAL": have == want, "NOT_EQUAL": have != want,
                    "GREATER": have > want, "LESS": have < want}[result]:
                return False
        return True

    def _put(self, key: bytes, value: bytes, lease: int, rev: int) -> Event:
        old = self.keys.get(key)
        if old is None:
            record = Record(value, rev, rev, 1, lease)
            bisect.insort(self._order, key)
        else:
            record = Record(value, old.create_revision, rev, old.version + 1, lease)
            self._detach(key, old.lease)
        self.keys[key] = record
        if lease and lease in self.leases:
            self.leases[lease].keys.add(key)
        return Event(key, rev, record)

    def _delete(self, key: bytes, rev: int) -> Event:
        old = self.keys.pop(key)
        del self._order[bisect.bisect_left(self._order, key)]
        self._detach(key, old.lease)
        return Event(key, rev, None)

    def _detach(self, key: bytes, lease: int) -> None:
        held = self.leases.get(lease)
        if held is not None:
            held.keys.discard(key)

    def _commit(self, events: list[Event]) -> None:
        if not events:
            return
        self.revision = events[0].revision
        self.history.append(events)
        while len(self.history) > self.history_limit:
            self.history.popleft()
            self.compact_revision = self.history[0][0].revision

    def apply(self, revision: int, events: Iterable[tuple[bytes, bytes | None, int]]) -> None:
        """Replay one logged revision: (key, value or None for a delete, lease)."""
        done = []
        for key, value, lease in events:
            if value is None:
                if key in self.keys:
                    done.append(self._delete(key, revision))
            else:
                done.append(self._put(key, value, lease, revision))
        self._commit(done)
        self.revision = max(self.revision, revision)

    def load(self, revision: int, records: dict[bytes, Record]) -> None:
        """Start from a snapshot."""
        self.revision = revision
        self.keys = dict(records)
        self._order = sorted(records)

    def restarted(self, forget: Iterable[bytes] = ()) -> list[Event]:
        """After recovery: keys held by leases died with the old process (leases are not
        kept), so they go, with the keys `forget` names that are there, as one revision; no
        history before this point."""
        gone = {k for k, r in self.keys.items() if r.lease} | (set(forget) & set(self.keys))
        events = [self._delete(key, self.revision + 1) for key in sorted(gone)]
        self._commit(events)
        self.history.clear()
        self.compact_revision = self.revision + 1 if self.revision > 1 else 0
        return events

    # -- leases -----------------------------------------------------------------------------
    def grant(self, ttl_s: int, now: float) -> tuple[int, int]:
        """A new lease: its id (random, as etcd's) and the TTL granted."""
        ttl_s = max(ttl_s, MIN_TTL_S)
        lease_id = random.getrandbits(62) + 1
        while lease_id in self.leases:
            lease_id = random.getrandbits(62) + 1
        self.leases[lease_id] = Lease(ttl_s, now + ttl_s)
        return lease_id, ttl_s

    def keepalive(self, lease_id: int, now: float) -> int:
        """The TTL granted again, 0 for a lease unknown or expired (as etcd answers)."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.deadline <= now:
            return 0
        lease.deadline = now + lease.ttl_s
        return lease.ttl_s

    def revoke(self, lease_id: int) -> list[Event]:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            raise _lease_not_found()
        rev = self.revision + 1
        events = [self._delete(key, rev) for key in sorted(lease.keys) if key in self.keys]
        self._commit(events)
        return events

    def expired(self, now: float) -> list[int]:
        return [i for i, lease in self.leases.items() if lease.deadline <= now]


def _check_branch(branch: list[dict[str, Any]]) -> None:
    if len(branch) > MAX_TXN_OPS:
        raise MetaError("etcdserver: too many operations in txn request")
    puts: set[bytes] = set()
    deletes = [r["delete"] for r in branch if "delete" in r]
    for request in branch:
        put = request.get("put")
        if put is None:
            continue
        key = put["key"]
        if key in puts or any(in_range(key, start, end) for start, end in deletes):
            raise MetaError("etcdserver: duplicate key given in txn request")
        puts.add(key)
