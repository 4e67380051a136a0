"""The parent process's metadata service: the part of etcd's v3 JSON gateway that
broker/cluster/etcd.py's `Etcd` client calls, served from one process with its keys on disk.

A multi-worker hare-server is a cluster of worker nodes on one machine (docs/CLUSTER.md); the
parent process is the single authority on definitions, in etcd's place, so no consensus is
needed: one writer, one log (meta_log.py), one state (meta_store.py). Served, exactly as the
client uses them:

    /v3/kv/range        key, range_end
    /v3/kv/put          key, value, lease
    /v3/kv/deleterange  key, range_end
    /v3/kv/txn          compare (CREATE, MOD, VERSION, LEASE, VALUE; any result),
                        request_put / request_range / request_delete_range
    /v3/lease/grant, /v3/lease/keepalive (one refresh per call), /v3/lease/revoke
    /v3/watch           create_request: key, range_end, start_revision (a stream)

Answers are shaped as etcd 3.4's gateway shapes them (int64 as strings, defaults left out);
other fields of a request are ignored, as etcd ignores unknown ones. Nothing is answered, and no
watcher told, before the revision it shows is fsynced. Leases live in memory only: a
worker whose lease expires (killed) is seen as down, and the parent's restart drops leased
keys. The listener is 127.0.0.1 on a free port, and every request must carry the random
token in `TOKEN_HEADER`, so only the workers the parent gave it to can read or write."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import json
import secrets
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from broker.cluster.etcd import TOKEN_HEADER
from broker.cluster.meta_log import (
    SNAPSHOT_BYTES,
    Forget,
    MetaLog,
    encode_change,
    encode_snapshot,
)
from broker.cluster.meta_store import Event, MetaError, MetaStore, Record, in_range

__all__ = ["TOKEN_HEADER", "MetaServer"]

log = structlog.get_logger("hare.cluster.meta")

_EXPIRY_TICK_S = 0.25  # how often leases are checked (etcd's lessor: 0.5 s)
_WATCH_BATCH = 1000  # events per watch answer while catching up (whole revisions)
_MAX_BODY = 2 << 20  # etcd refuses requests over 1.5 MiB
_HEADER_IDS = {"cluster_id": "1", "member_id": "1", "raft_term": "1"}
_TARGETS = {"CREATE": "create_revision", "MOD": "mod_revision", "VERSION": "version",
            "LEASE": "lease", "VALUE": "value"}
_RESULTS = ("EQUAL", "GREATER", "LESS", "NOT_EQUAL")

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _bytes(body: dict[str, Any], name: str) -> bytes:
    try:
        return base64.b64decode(body.get(name) or "", validate=True)
    except (binascii.Error, TypeError) as exc:
        raise MetaError(f"{name}: {exc}") from None


def _int(body: dict[str, Any], name: str) -> int:
    try:
        return int(body.get(name) or 0)
    except (TypeError, ValueError):
        raise MetaError(f"{name}: not an integer: {body.get(name)!r}") from None


def _key(body: dict[str, Any]) -> bytes:
    key = _bytes(body, "key")
    if not key:
        raise MetaError("etcdserver: key is not provided")
    return key


def _kv(key: bytes, r: Record) -> dict[str, Any]:
    out: dict[str, Any] = {"key": _b64(key), "create_revision": str(r.create_revision),
                           "mod_revision": str(r.mod_revision), "version": str(r.version)}
    if r.value:
        out["value"] = _b64(r.value)
    if r.lease:
        out["lease"] = str(r.lease)
    return out


def _event(e: Event) -> dict[str, Any]:
    if e.record is None:
        return {"type": "DELETE", "kv": {"key": _b64(e.key), "mod_revision": str(e.revision)}}
    return {"kv": _kv(e.key, e.record)}


def _range_answer(found: list[tuple[bytes, Record]], head: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"header": head}
    if found:
        out["kvs"] = [_kv(k, r) for k, r in found]
        out["count"] = str(len(found))
    return out


def _request(raw: Any) -> dict[str, Any]:
    """One txn request, decoded for MetaStore.txn."""
    if not isinstance(raw, dict):
        raise MetaError("txn request: not an object")
    if "request_put" in raw:
        put = raw["request_put"]
        return {"put": {"key": _key(put), "value": _bytes(put, "value"),
                        "lease": _int(put, "lease")}}
    if "request_range" in raw:
        r = raw["request_range"]
        return {"range": (_key(r), _bytes(r, "range_end"))}
    if "request_delete_range" in raw:
        r = raw["request_delete_range"]
        return {"delete": (_key(r), _bytes(r, "range_end"))}
    raise MetaError(f"txn request not served here: {sorted(raw)}")


def _compare(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise MetaError("compare: not an object")
    target = raw.get("target", "VERSION")  # the enums' zero values are left out
    result = raw.get("result", "EQUAL")
    if target not in _TARGETS or result not in _RESULTS:
        raise MetaError(f"compare: target {target!r} / result {result!r} not served here")
    name = _TARGETS[target]
    value: bytes | int = _bytes(raw, name) if target == "VALUE" else _int(raw, name)
    return {"key": _key(raw), "range_end": _bytes(raw, "range_end"), "target": target,
            "result": result, "value": value}


class MetaServer:
    """Start with `await MetaServer.start(data_dir)`; give workers `url` and `token`."""

    def __init__(self, data_dir: Path, *, history: int, fsync: bool, snapshot_bytes: int,
                 token: str | None) -> None:
        self.data_dir = Path(data_dir)
        self.token = token or secrets.token_urlsafe(32)
        self.url = ""
        self.store = MetaStore(history)
        self.log = MetaLog(self.data_dir, fsync=fsync)
        self.snapshot_bytes = snapshot_bytes
        self._durable = 0  # the highest revision on disk: what answers and watches may show
        self._pending: list[bytes] = []  # CHANGE records not written yet
        self._changed = asyncio.Condition()  # a flush happened, or closing
        self._wake = asyncio.Event()
        self._failed: str = ""  # a write to the log failed: the state in RAM is not on disk
        self._closing = False
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def start(cls, data_dir: Path, *, host: str = "127.0.0.1", port: int = 0,
                    history: int = 10_000, fsync: bool = True,
                    snapshot_bytes: int = SNAPSHOT_BYTES,
                    token: str | None = None, forget: Forget | None = None) -> MetaServer:
        """Recover the data directory, listen, serve. MetaLogDamaged when its files cannot
        be trusted (the broker must not start on lost definitions). The token is random
        unless given (a server restarted on its port for the same workers). `forget` picks
        the keys that do not outlive a restart (MetaLog.recover)."""
        self = cls(data_dir, history=history, fsync=fsync, snapshot_bytes=snapshot_bytes,
                   token=token)
        torn = await asyncio.to_thread(self.log.recover, self.store, forget)
        if torn:
            log.warning("meta log: torn last record dropped", dir=str(self.data_dir),
                        bytes=torn)
        self._durable = self.store.revision
        app = web.Application(middlewares=[self._guard], client_max_size=_MAX_BODY)
        routes: dict[str, Handler] = {
            "/v3/kv/range": self._range, "/v3/kv/put": self._put,
            "/v3/kv/deleterange": self._deleterange, "/v3/kv/txn": self._txn,
            "/v3/lease/grant": self._grant, "/v3/lease/keepalive": self._keepalive,
            "/v3/lease/revoke": self._revoke,
        }
        for path, handler in routes.items():
            app.router.add_post(path, self._unary(handler))
        app.router.add_post("/v3/watch", self._watch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        await web.SockSite(self._runner, sock).start()
        bound_host, bound_port = sock.getsockname()[:2]
        self.url = f"http://{bound_host}:{bound_port}"
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._writer(), name="meta:writer"),
                       loop.create_task(self._expire(), name="meta:leases")]
        log.info("meta server started", url=self.url, revision=self.store.revision,
                 keys=len(self.store.keys))
        return self

    async def close(self) -> None:
        """Stop serving (watch streams end), write what is pending, close the files."""
        self._closing = True
        async with self._changed:
            self._changed.notify_all()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        writer, expiry = self._tasks
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        self._wake.set()
        await writer  # writes what is pending, then ends (never cut mid-write)
        self._tasks = []
        self.log.close()

    # -- the way in -------------------------------------------------------------------------
    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        given = request.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            log.warning("meta server: request refused, missing or wrong token",
                        peer=request.remote, path=request.path)
            return _error(MetaError("hare meta server: missing or wrong token", code=16,
                                    status=401))
        return await handler(request)

    def _unary(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def serve(request: web.Request) -> web.Response:
            try:
                answer = await handler(await _body(request))
            except MetaError as exc:
                if exc.status == 400:
                    log.warning("meta server: bad request", path=request.path, error=str(exc))
                return _error(exc)
            return web.json_response(answer)
        return serve

    def _head(self, revision: int) -> dict[str, Any]:
        return {**_HEADER_IDS, "revision": str(revision)}

    async def _synced(self, revision: int) -> dict[str, Any]:
        """The header of an answer showing `revision`, once that revision is on disk."""
        await self._wait_past(revision - 1)
        if self._durable < revision:
            raise MetaError(f"hare meta server: {self._failed or 'closing'}", code=14,
                            status=503)
        return self._head(revision)

    async def _wait_past(self, revision: int) -> None:
        """Until a revision after `revision` is on disk, or the server fails or closes."""
        if self._durable <= revision:
            async with self._changed:
                await self._changed.wait_for(
                    lambda: self._durable > revision or bool(self._failed) or self._closing)

    def _changes(self, events: list[Event]) -> None:
        if events:
            self._pending.append(encode_change(events))
            self._wake.set()

    # -- keys -------------------------------------------------------------------------------
    async def _range(self, body: dict[str, Any]) -> dict[str, Any]:
        found = self.store.range(_key(body), _bytes(body, "range_end"))
        return _range_answer(found, await self._synced(self.store.revision))

    async def _put(self, body: dict[str, Any]) -> dict[str, Any]:
        put = {"key": _key(body), "value": _bytes(body, "value"), "lease": _int(body, "lease")}
        _, _, events = self.store.txn([], [{"put": put}], [])
        self._changes(events)
        return {"header": await self._synced(self.store.revision)}

    async def _deleterange(self, body: dict[str, Any]) -> dict[str, Any]:
        request = {"delete": (_key(body), _bytes(body, "range_end"))}
        _, answers, events = self.store.txn([], [request], [])
        self._changes(events)
        out: dict[str, Any] = {"header": await self._synced(self.store.revision)}
        if answers[0]["delete"]:
            out["deleted"] = str(answers[0]["delete"])
        return out

    async def _txn(self, body: dict[str, Any]) -> dict[str, Any]:
        compare = [_compare(c) for c in body.get("compare") or []]
        success = [_request(r) for r in body.get("success") or []]
        failure = [_request(r) for r in body.get("failure") or []]
        ok, answers, events = self.store.txn(compare, success, failure)
        self._changes(events)
        head = await self._synced(self.store.revision)
        inner = {"revision": head["revision"]}
        responses: list[dict[str, Any]] = []
        for answer in answers:
            if "put" in answer:
                responses.append({"response_put": {"header": inner}})
            elif "delete" in answer:
                deleted: dict[str, Any] = {"header": inner}
                if answer["delete"]:
                    deleted["deleted"] = str(answer["delete"])
                responses.append({"response_delete_range": deleted})
            else:
                responses.append({"response_range": _range_answer(answer["range"], inner)})
        out: dict[str, Any] = {"header": head}
        if ok:
            out["succeeded"] = True
        if responses:
            out["responses"] = responses
        return out

    # -- leases -----------------------------------------------------------------------------
    async def _grant(self, body: dict[str, Any]) -> dict[str, Any]:
        lease, ttl = self.store.grant(_int(body, "TTL"), asyncio.get_running_loop().time())
        return {"header": await self._synced(self.store.revision), "ID": str(lease),
                "TTL": str(ttl)}

    async def _keepalive(self, body: dict[str, Any]) -> dict[str, Any]:
        lease = _int(body, "ID")
        ttl = self.store.keepalive(lease, asyncio.get_running_loop().time())
        result: dict[str, Any] = {"header": await self._synced(self.store.revision),
                                  "ID": str(lease)}
        if ttl:
            result["TTL"] = str(ttl)
        return {"result": result}

    async def _revoke(self, body: dict[str, Any]) -> dict[str, Any]:
        self._changes(self.store.revoke(_int(body, "ID")))
        return {"header": await self._synced(self.store.revision)}

    async def _expire(self) -> None:
        """Revoke the leases whose TTL passed: their keys go (a killed worker is down)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(_EXPIRY_TICK_S)
            for lease in self.store.expired(loop.time()):
                self._changes(self.store.revoke(lease))

    # -- the log ----------------------------------------------------------------------------
    async def _writer(self) -> None:
        """Group commit: what came meanwhile is one write and one fsync; then wake the
        answers and watches waiting for it; a snapshot when the log has grown."""
        while not self._closing or self._pending:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                data, revision = b"".join(self._pending), self.store.revision
                self._pending = []
                try:
                    await asyncio.to_thread(self.log.write, data)
                    if self.log.size > self.snapshot_bytes:
                        await asyncio.to_thread(self.log.rewrite, encode_snapshot(self.store))
                except OSError as exc:
                    # what RAM holds is no longer what the disk holds: answer nothing more
                    self._failed = f"meta log write failed: {exc}"
                    log.error("meta server: log write failed, serving no more",
                              error=str(exc))
                else:
                    self._durable = revision
                async with self._changed:
                    self._changed.notify_all()
                if self._failed:
                    return

    # -- watch ------------------------------------------------------------------------------
    async def _watch(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _body(request)
            create = body.get("create_request")
            if not isinstance(create, dict):
                raise MetaError("watch: only create_request is served here")
            key, end = _key(create), _bytes(create, "range_end")
            start = _int(create, "start_revision")
        except MetaError as exc:
            log.warning("meta server: bad request", path=request.path, error=str(exc))
            return _error(exc)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        cursor = start or self._durable + 1
        try:
            await _line(resp, {"header": self._head(self._durable), "created": True})
            while not self._closing and not self._failed:
                if cursor < self.store.compact_revision:
                    await _line(resp, {"header": _HEADER_IDS, "canceled": True,
                                       "compact_revision": str(self.store.compact_revision)})
                    break
                durable = self._durable
                events = [e for e in self.store.events_since(cursor)
                          if e.revision <= durable and in_range(e.key, key, end)]
                cursor = max(cursor, durable + 1)
                for batch in _batches(events):
                    await _line(resp, {"header": self._head(durable),
                                       "events": [_event(e) for e in batch]})
                await self._wait_past(cursor - 1)
        except ConnectionError:
            pass  # the watcher went away
        return resp


def _batches(events: list[Event]) -> list[list[Event]]:
    """Answers of about _WATCH_BATCH events, never splitting a revision (the client resumes
    after the last revision it saw)."""
    out: list[list[Event]] = []
    for e in events:
        if out and (len(out[-1]) < _WATCH_BATCH or out[-1][-1].revision == e.revision):
            out[-1].append(e)
        else:
            out.append([e])
    return out


async def _line(resp: web.StreamResponse, result: dict[str, Any]) -> None:
    await resp.write(json.dumps({"result": result}).encode() + b"\n")


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json(loads=json.loads)
    except ValueError as exc:
        raise MetaError(str(exc)) from None
    if not isinstance(body, dict):
        raise MetaError("request body: not an object")
    return body


def _error(exc: MetaError) -> web.Response:
    return web.json_response({"error": str(exc), "message": str(exc), "code": exc.code},
                             status=exc.status)
