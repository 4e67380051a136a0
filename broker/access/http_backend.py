"""An HTTP auth backend, as RabbitMQ's rabbitmq_auth_backend_http defines it.

Every question goes to an HTTP service (GET with a query string, or POST with a form body) at
one of four paths:

    user_path      username, password (absent for EXTERNAL)     -> "allow [tag ...]" | "deny"
    vhost_path     username, vhost, ip                           -> "allow" | "deny"
    resource_path  username, vhost, resource, name, permission   -> "allow" | "deny"
    topic_path     username, vhost, resource=topic, name (the exchange), permission,
                   routing_key, variable_map.username, variable_map.vhost -> "allow" | "deny"

Anything but a 200 with one of those bodies, a refused connection or no answer within
`timeout_s` is a refusal: logged with the path and the cause, never cached, never an open door.
Answers are cached for `cache_ttl_s` (rabbitmq_auth_backend_cache's job in RabbitMQ);
concurrent identical questions share one request. Cached logins are keyed by a SHA-256 of the
password, never the password itself."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import structlog

from broker.access.backends import Backend, LoginResult, Query

__all__ = ["HttpBackend"]

log = structlog.get_logger("hare.auth")


class HttpBackend(Backend):
    name = "http"

    def __init__(self, *, user_path: str, vhost_path: str, resource_path: str,
                 topic_path: str = "", method: str = "get", timeout_s: float = 5.0,
                 cache_ttl_s: float = 5.0) -> None:
        self.paths = {"user": user_path, "vhost": vhost_path, "resource": resource_path,
                      "topic": topic_path}
        self.method = method.lower()
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.timeout_s = timeout_s
        self.ttl = cache_ttl_s
        self._cache: dict[Query, tuple[float, Any]] = {}
        self._fresh: dict[Query, Any] = {}  # fetched, not yet read (what a zero TTL needs)
        self._inflight: dict[Query, asyncio.Future[Any]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._fetches = 0

    @property
    def generation(self) -> int:
        # cached answers expire every TTL, so must what channels cached from them
        if self.ttl > 0:
            return int(time.monotonic() / self.ttl)
        return self._fetches

    def decide(self, query: Query, password: str | None = None) -> Any:
        fresh = self._fresh.pop(query, None)
        if fresh is not None:
            return fresh
        hit = self._cache.get(query)
        if hit is not None:
            if hit[0] > time.monotonic():
                return hit[1]
            del self._cache[query]
        if query[0] == "topic" and not self.paths["topic"]:
            return True  # no topic path: routing keys are not checked
        return None

    def topic_checked(self, username: str, vhost: str, exchange: str) -> bool:
        return bool(self.paths["topic"])

    async def fetch(self, query: Query, password: str | None = None) -> None:
        pending = self._inflight.get(query)
        if pending is not None:
            answer = await asyncio.shield(pending)
        else:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._inflight[query] = future
            try:
                answer, cacheable = await self._ask(query, password)
                cacheable = cacheable and self.ttl > 0
                if cacheable:
                    self._cache[query] = (time.monotonic() + self.ttl, answer)
                future.set_result(answer)
            except BaseException as exc:  # cancelled: whoever shares the request is told
                future.set_exception(exc)
                future.exception()  # retrieved: no "never retrieved" warning if nobody waits
                raise
            finally:
                del self._inflight[query]
                self._fetches += 1
        if query not in self._cache:
            if len(self._fresh) > 1000:  # answers nobody came back for (closed channels)
                self._fresh.clear()
            self._fresh[query] = answer

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- one request ------------------------------------------------------------------------
    async def _ask(self, query: Query, password: str | None) -> tuple[Any, bool]:
        """(answer, whether it may be cached). Failures are refusals, not cached."""
        kind = query[0]
        params = _params(query, password)
        try:
            status, body = await self._request(self.paths[kind], params)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            cause = f"no answer within {self.timeout_s:g} s" if isinstance(
                exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            return self._failed(kind, query, cause), False
        if status != 200:
            return self._failed(kind, query, f"HTTP {status}"), False
        words = body.split()
        verdict = words[0] if words else ""
        if verdict == "deny":
            return (LoginResult(False, reason="denied by the HTTP auth service")
                    if kind == "user" else False), True
        if verdict == "allow":
            return (LoginResult(True, tuple(words[1:])) if kind == "user" else True), True
        return self._failed(kind, query, f"unexpected answer {body[:60]!r}"), False

    async def _request(self, url: str, params: dict[str, str]) -> tuple[int, str]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        if self.method == "post":
            request = self._session.post(url, data=params)
        else:
            request = self._session.get(url, params=params)
        async with request as resp:
            return resp.status, (await resp.text()).strip()

    def _failed(self, kind: str, query: Query, cause: str) -> Any:
        log.warning("HTTP auth service failed: access refused", path=self.paths[kind],
                    query=kind, user=query[1], cause=cause)
        return LoginResult(False, reason=f"HTTP auth service failed: {cause}") \
            if kind == "user" else False


def _params(query: Query, password: str | None) -> dict[str, str]:
    kind = query[0]
    if kind == "user":
        params = {"username": query[1]}
        if password is not None:
            params["password"] = password
        return params
    if kind == "vhost":
        return {"username": query[1], "vhost": query[2], "ip": query[3]}
    if kind == "resource":
        _, username, vhost, resource, name, permission = query
        return {"username": username, "vhost": vhost, "resource": resource, "name": name,
                "permission": permission}
    _, username, vhost, exchange, routing_key, permission = query
    return {"username": username, "vhost": vhost, "resource": "topic", "name": exchange,
            "permission": permission, "routing_key": routing_key,
            "variable_map.username": username, "variable_map.vhost": vhost}
