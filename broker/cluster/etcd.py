"""A small etcd v3 client over etcd's JSON gateway (the /v3/* HTTP API), on aiohttp.

Why not a gRPC client from PyPI: the maintained asyncio ones pull in grpcio (a large native
wheel) for the six calls Hare makes, and aiohttp is already a dependency. The gateway speaks
the same protobuf messages as JSON: keys and values are base64, 64-bit integers are strings,
fields at their default value (0, false, empty) are left out of answers. Every call is one
POST; a watch is one long POST whose answer streams one JSON object per line.

Every failure to reach etcd (refused, timed out, a 5xx, a gRPC error in the body) is one
exception type, EtcdUnavailable, so callers have one thing to handle."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from broker.cluster.local import ClusterUnavailable

TOKEN_HEADER = "X-Hare-Token"

__all__ = ["TOKEN_HEADER", "Etcd", "EtcdUnavailable", "KeyValue", "TxnResult", "WatchCompacted",
           "WatchEvent", "prefix_end"]


class EtcdUnavailable(ClusterUnavailable):
    """etcd could not be reached or refused the call."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: str  # "put" | "delete"
    kv: KeyValue
    revision: int  # the event's mod_revision


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    kvs: list[KeyValue]  # what the range requests of the branch taken returned


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def prefix_end(prefix: str) -> str:
    """The range_end that makes [prefix, end) every key starting with prefix."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    raw[-1] += 1
    return raw.decode("latin-1")


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        base64.b64decode(raw["key"]).decode(),
        base64.b64decode(raw.get("value", "")),
        int(raw.get("create_revision", 0)),
        int(raw.get("mod_revision", 0)),
        int(raw.get("lease", 0)),
    )


def _end(range_end: str) -> str:
    return base64.b64encode(range_end.encode("latin-1")).decode("ascii")


class Etcd:
    """One etcd endpoint (or several: a failing one hands over to the next)."""

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 3.0,
                 token: str = "") -> None:
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout_s = timeout_s
        # the parent's meta server (meta_server.py) wants it on every call; etcd ignores it
        self._headers = {TOKEN_HEADER: token} if token else {}
        self._session: aiohttp.ClientSession | None = None
        self._current = 0

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        last: Exception | None = None
        for _ in range(len(self.endpoints)):
            url = self.endpoints[self._current] + path
            try:
                timeout = aiohttp.ClientTimeout(total=self.timeout_s)
                async with self._http().post(url, json=body, timeout=timeout) as resp:
                    answer = await resp.json(content_type=None)
                    if resp.status >= 500 or (isinstance(answer, dict) and "error" in answer
                                               and resp.status != 200):
                        raise EtcdUnavailable(f"etcd {url}: {resp.status} {answer}")
                    if resp.status != 200:
                        raise EtcdUnavailable(f"etcd {url}: {resp.status} {answer}")
                    return answer if isinstance(answer, dict) else {}
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError,
                    EtcdUnavailable) as exc:
                last = exc
                self._current = (self._current + 1) % len(self.endpoints)
        raise EtcdUnavailable(str(last) or type(last).__name__)

    # -- keys -------------------------------------------------------------------------------
    async def get(self, key: str) -> KeyValue | None:
        answer = await self.call("/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under prefix, and the store's revision they were read at."""
        answer = await self.call(
            "/v3/kv/range", {"key": _b64(prefix), "range_end": _end(prefix_end(prefix))}
        )
        revision = int(answer.get("header", {}).get("revision", 0))
        return [_kv(raw) for raw in answer.get("kvs") or []], revision

    async def put(self, key: str, value: bytes | str, *, lease: int = 0) -> int:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        answer = await self.call("/v3/kv/put", body)
        return int(answer.get("header", {}).get("revision", 0))

    async def delete(self, key: str) -> int:
        answer = await self.call("/v3/kv/deleterange", {"key": _b64(key)})
        return int(answer.get("header", {}).get("revision", 0))

    async def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
                  failure: list[dict[str, Any]]) -> TxnResult:
        answer = await self.call(
            "/v3/kv/txn", {"compare": compare, "success": success, "failure": failure}
        )
        kvs: list[KeyValue] = []
        for response in answer.get("responses") or []:
            for raw in (response.get("response_range") or {}).get("kvs") or []:
                kvs.append(_kv(raw))
        revision = int(answer.get("header", {}).get("revision", 0))
        return TxnResult(bool(answer.get("succeeded", False)), revision, kvs)

    # request and compare builders for txn()
    @staticmethod
    def op_put(key: str, value: bytes | str, lease: int = 0) -> dict[str, Any]:
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        return {"request_put": put}

    @staticmethod
    def op_get(key: str) -> dict[str, Any]:
        return {"request_range": {"key": _b64(key)}}

    @staticmethod
    def op_delete(key: str, *, prefix: bool = False) -> dict[str, Any]:
        body = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _end(prefix_end(key))
        return {"request_delete_range": body}

    @staticmethod
    def absent(key: str) -> dict[str, Any]:
        return {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}

    @staticmethod
    def unchanged(key: str, mod_revision: int) -> dict[str, Any]:
        return {"key": _b64(key), "target": "MOD", "result": "EQUAL",
                "mod_revision": str(mod_revision)}

    @staticmethod
    def value_is(key: str, value: str | bytes) -> dict[str, Any]:
        return {"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(value)}

    # -- leases -----------------------------------------------------------------------------
    async def grant(self, ttl_s: int) -> int:
        answer = await self.call("/v3/lease/grant", {"TTL": str(ttl_s)})
        return int(answer["ID"])

    async def keepalive(self, lease: int) -> int:
        """Refresh a lease once; its TTL left, 0 when the lease has expired."""
        answer = await self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int((answer.get("result") or {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        await self.call("/v3/lease/revoke", {"ID": str(lease)})

    # -- watch ------------------------------------------------------------------------------
    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Batches of events under prefix from start_revision on, as etcd sends them; ends
        with EtcdUnavailable when the stream breaks (the caller resumes from where it got)."""
        request = {"create_request": {"key": _b64(prefix), "range_end": _end(prefix_end(prefix)),
                                      "start_revision": str(start_revision)}}
        url = self.endpoints[self._current] + "/v3/watch"
        try:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s)
            async with self._http().post(url, json=request, timeout=timeout) as resp:
                if resp.status != 200:
                    raise EtcdUnavailable(f"etcd watch: {resp.status}")
                buffer = b""
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            events = _watch_events(json.loads(line))
                            if events is not None:
                                yield events
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            self._current = (self._current + 1) % len(self.endpoints)
            raise EtcdUnavailable(f"etcd watch: {exc!r}") from exc
        raise EtcdUnavailable("etcd watch: stream ended")


class WatchCompacted(EtcdUnavailable):
    """The revision to resume from was compacted away: read everything again."""


def _watch_events(message: dict[str, Any]) -> list[WatchEvent] | None:
    result = message.get("result")
    if result is None:
        raise EtcdUnavailable(f"etcd watch: {message.get('error')}")
    if result.get("compact_revision"):
        raise WatchCompacted(f"etcd watch: compacted at {result['compact_revision']}")
    if result.get("canceled"):
        raise EtcdUnavailable(f"etcd watch canceled: {result.get('cancel_reason')}")
    raw_events = result.get("events")
    if not raw_events:
        return None  # the created answer, or progress notifications
    out = []
    for raw in raw_events:
        kv = _kv(raw["kv"])
        out.append(WatchEvent("delete" if raw.get("type") == "DELETE" else "put", kv,
                              kv.mod_revision))
    return out


async def sleep_backoff(attempt: int) -> None:
    """Retry pause after a failed call: 0.2 s doubling up to 2 s."""
    await asyncio.sleep(min(2.0, 0.2 * (2 ** min(attempt, 4))))
