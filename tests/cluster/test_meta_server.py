"""The parent's meta server (broker/cluster/meta_server.py) with the real etcd client: every
call and edge the cluster code relies on, the same answers as a real etcd for the same calls
(the module's private etcd), durability across restarts (snapshot, log, torn tail, kill -9),
and the token."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker.cluster.etcd import (
    TOKEN_HEADER,
    Etcd,
    EtcdUnavailable,
    KeyValue,
    TxnResult,
    WatchCompacted,
    WatchEvent,
)
from broker.cluster.meta_log import LOG_FILE, SNAPSHOT_FILE, MetaLogDamaged
from broker.cluster.meta_server import MetaServer

from .helpers import EtcdProc, MetaProc


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProc]:
    """Always a real etcd here (whatever HARE_TEST_METADATA says): the reference."""
    e = EtcdProc(tmp_path_factory.mktemp("etcd")).start()
    yield e
    e.stop()


class Recording(Etcd):
    """The real client, keeping every answer (or refusal) it got, for parity checks."""

    def __init__(self, url: str, token: str = "") -> None:
        super().__init__([url], token=token)
        self.answers: list[Any] = []

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            answer = await super().call(path, body)
        except EtcdUnavailable as exc:
            self.answers.append((path, "refused", re.sub(r"^etcd \S+: ", "", str(exc))))
            raise
        self.answers.append((path, answer))
        return answer


@contextlib.asynccontextmanager
async def meta(data_dir: Path, **kwargs: Any) -> AsyncIterator[tuple[MetaServer, Recording]]:
    server = await MetaServer.start(data_dir, **kwargs)
    client = Recording(server.url, server.token)
    try:
        yield server, client
    finally:
        await client.close()
        await server.close()


class Normal:
    """Makes two servers' answers comparable: revisions counted from the sequence's start,
    lease ids by order of appearance, the member's ids left out."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.leases: dict[str, str] = {}

    def __call__(self, x: Any) -> Any:
        if isinstance(x, dict):
            out = {}
            for k, v in x.items():
                if k in ("cluster_id", "member_id", "raft_term"):
                    continue
                if k in ("revision", "create_revision", "mod_revision", "compact_revision"):
                    v = int(v) - self.base
                elif k in ("ID", "lease"):
                    v = self.leases.setdefault(str(v), f"L{len(self.leases) + 1}")
                else:
                    v = self(v)
                out[k] = v
            return out
        if isinstance(x, list | tuple):
            return [self(v) for v in x]
        if isinstance(x, bool | str | bytes | None):
            return x
        if isinstance(x, int):  # the client's results: revisions (a TTL goes as a string)
            return x - self.base if x else 0
        if isinstance(x, WatchEvent):
            return (x.kind, self(x.kv), self(x.revision))
        if isinstance(x, KeyValue):
            return (x.key, x.value, self(x.create_revision), self(x.mod_revision),
                    self({"lease": x.lease}) if x.lease else 0)
        if isinstance(x, TxnResult):
            return (x.succeeded, self(x.revision), self(x.kvs))
        raise AssertionError(f"cannot compare {x!r}")


Sequence = Callable[[Etcd, str], Awaitable[list[Any]]]


async def parity(etcd: EtcdProc, tmp_path: Path, sequence: Sequence) -> list[Any]:
    """Run `sequence` against the real etcd and against a fresh meta server; both must give
    the same answers, raw JSON and the client's results alike. Returns the meta server's."""
    results = []
    prefix = f"/parity/{uuid.uuid4().hex}/"
    async with meta(tmp_path / "meta") as (_, on_meta):
        on_etcd = Recording(etcd.url)
        try:
            for client in (on_etcd, on_meta):
                _, base = await client.get_prefix(prefix)
                client.answers.clear()
                norm = Normal(base)
                got = await sequence(client, prefix)
                results.append((norm(got), norm(client.answers)))
        finally:
            await on_etcd.close()
    (etcd_got, etcd_raw), (meta_got, meta_raw) = results
    assert meta_raw == etcd_raw
    assert meta_got == etcd_got
    return meta_got


async def refused(call: Awaitable[Any]) -> str:
    try:
        await call
    except EtcdUnavailable:
        return "refused"
    return "accepted"


# -- keys and txn: the same answers as etcd ---------------------------------------------------
async def test_keys_as_etcd(etcd: EtcdProc, tmp_path: Path) -> None:
    async def sequence(e: Etcd, p: str) -> list[Any]:
        out: list[Any] = [await e.put(p + "a", "1"), await e.put(p + "b", b"")]
        out += [await e.put(p + "a", "2"), await e.put(p + "c/x", "3"), await e.get(p + "a")]
        out += [await e.get(p + "missing"), await e.get_prefix(p), await e.get_prefix(p + "c/")]
        out += [await e.delete(p + "missing"), await e.delete(p + "b"), await e.get_prefix(p)]
        return out

    got = await parity(etcd, tmp_path, sequence)
    assert got[:4] == [1, 2, 3, 4]  # one revision per write, a missing delete makes none
    assert got[8:10] == [4, 5]


async def test_txn_as_etcd(etcd: EtcdProc, tmp_path: Path) -> None:
    async def sequence(e: Etcd, p: str) -> list[Any]:
        a, b = p + "a", p + "b"
        out: list[Any] = [
            await e.txn([Etcd.absent(a)], [Etcd.op_put(a, "1"), Etcd.op_get(a)], [Etcd.op_get(a)]),
            await e.txn([Etcd.absent(a)], [Etcd.op_put(a, "2")], [Etcd.op_get(a)]),
        ]
        kv = await e.get(a)
        assert kv is not None
        out += [
            await e.txn([Etcd.unchanged(a, kv.mod_revision)], [Etcd.op_put(a, "3")], []),
            await e.txn([Etcd.unchanged(a, kv.mod_revision)], [Etcd.op_put(a, "4")], []),
            await e.txn([Etcd.value_is(a, "3")], [Etcd.op_put(b, "x")], []),
            await e.txn([Etcd.value_is(a, "9")], [], [Etcd.op_get(b)]),
            await e.txn([Etcd.value_is(p + "none", "")], [Etcd.op_put(b, "y")], []),
            await e.txn([], [Etcd.op_put(p + "v/1", "1"), Etcd.op_put(p + "v/2", "2")], []),
            await e.txn([], [Etcd.op_delete(p + "v/", prefix=True), Etcd.op_get(p + "v/1")],
                        []),
            await e.txn([], [Etcd.op_delete(p + "none")], []),
            await refused(e.txn([], [Etcd.op_put(a, "1"), Etcd.op_delete(a)], [])),
            await refused(e.txn([], [Etcd.op_put(p + "v/3", "1"),
                                     Etcd.op_delete(p + "v/", prefix=True)], [])),
            await refused(e.txn([], [Etcd.op_put(a, "1"), Etcd.op_put(a, "2")], [])),
            await refused(e.txn([], [Etcd.op_put(f"{p}n{i}", "") for i in range(129)], [])),
            await e.get_prefix(p),
        ]
        return out

    got = await parity(etcd, tmp_path, sequence)
    assert [r[0] for r in got[:7]] == [True, False, True, False, True, False, False]
    assert got[10:14] == ["refused"] * 4


async def test_leases_as_etcd(etcd: EtcdProc, tmp_path: Path) -> None:
    async def sequence(e: Etcd, p: str) -> list[Any]:
        lease = await e.grant(1)  # below the minimum: granted 2 s
        other = await e.grant(30)
        out: list[Any] = [
            f"ttl {await e.keepalive(lease)}", f"ttl {await e.keepalive(12345)}",
            await e.put(p + "held", "x", lease=lease), await e.put(p + "kept", "y"),
            await e.txn([Etcd.absent(p + "card")], [Etcd.op_put(p + "card", "c", other)], []),
            await refused(e.put(p + "bad", "z", lease=12345)),
            await refused(e.revoke(12345)),
            await e.get_prefix(p),
        ]
        await e.revoke(other)
        out.append(await e.get_prefix(p))
        # the short lease left to expire: its key goes as one delete event
        async for events in e.watch(p, out[-1][1] + 1):
            out.append(events)
            break
        out += [f"ttl {await e.keepalive(lease)}", await e.get_prefix(p)]
        return out

    got = await parity(etcd, tmp_path, sequence)
    assert got[:2] == ["ttl 2", "ttl 0"]
    assert [kv[0][-4:] for kv in got[-1][0]] == ["kept"]


async def test_watch_as_etcd(etcd: EtcdProc, tmp_path: Path) -> None:
    """A watch from an old revision gets every event since, in order, then live ones."""
    async def sequence(e: Etcd, p: str) -> list[Any]:
        _, start = await e.get_prefix(p)
        await e.put(p + "a", "1")
        await e.put("/elsewhere/" + p, "not watched")
        await e.txn([], [Etcd.op_put(p + "b", "2"), Etcd.op_put(p + "c", "3")], [])
        await e.delete(p + "a")
        events: list[WatchEvent] = []
        async for batch in e.watch(p, start + 1):
            events += batch
            if len(events) == 4:
                await e.put(p + "live", "4")
            if len(events) == 5:
                break
        return events

    got = await parity(etcd, tmp_path, sequence)
    assert [(kind, kv[0].rsplit("/", 1)[1]) for kind, kv, _ in got] == [
        ("put", "a"), ("put", "b"), ("put", "c"), ("delete", "a"), ("put", "live")]


async def test_watch_compacted(etcd: EtcdProc, tmp_path: Path) -> None:
    """A start revision older than the history held ends the watch as etcd's compaction
    does, which the client raises as WatchCompacted; the held ones are served."""
    async with meta(tmp_path / "m", history=3) as (_, client):
        for i in range(6):
            await client.put(f"/c/{i}", str(i))  # revisions 2..7; 5, 6, 7 held
        with pytest.raises(WatchCompacted):
            async for _ in client.watch("/c/", 4):
                pass
        async for batch in client.watch("/c/", 5):
            assert [e.kv.key for e in batch] == ["/c/3", "/c/4", "/c/5"]
            break
    on_etcd = Recording(etcd.url)
    try:
        prefix = f"/compact/{uuid.uuid4().hex}/"
        first = await on_etcd.put(prefix + "0", "0")
        last = await on_etcd.put(prefix + "1", "1")
        await on_etcd.call("/v3/kv/compaction", {"revision": str(last)})
        with pytest.raises(WatchCompacted):
            async for _ in on_etcd.watch(prefix, first):
                pass
    finally:
        await on_etcd.close()


async def test_watch_sees_every_revision_in_order(tmp_path: Path) -> None:
    """Writers racing: the watcher gets each revision once, in order, none missing."""
    async with meta(tmp_path / "m") as (_, client):
        _, start = await client.get_prefix("/w/")
        seen: list[int] = []

        async def watch() -> None:
            async for batch in client.watch("/w/", start + 1):
                seen.extend(e.revision for e in batch)
                if len(seen) >= 200:
                    return

        watcher = asyncio.ensure_future(watch())
        writers = [Etcd([client.endpoints[0]], token=client._headers[TOKEN_HEADER])
                   for _ in range(4)]
        try:
            await asyncio.gather(*(w.put(f"/w/{n}/{i}", str(i))
                                   for i in range(50) for n, w in enumerate(writers)))
            await asyncio.wait_for(watcher, 30)
        finally:
            for w in writers:
                await w.close()
        assert seen == list(range(start + 1, start + 201))


async def test_watch_batches_never_split_a_revision(tmp_path: Path) -> None:
    """Catching up comes in answers of about 1000 events, but one revision's events stay in
    one answer: the client resumes after the last revision it saw, so a split one would
    lose the rest of it."""
    async with meta(tmp_path / "m") as (_, client):
        _, start = await client.get_prefix("/big/")
        for t in range(12):
            await client.txn([], [Etcd.op_put(f"/big/{t}/{i}", "x") for i in range(100)], [])
        await client.txn([], [Etcd.op_delete("/big/", prefix=True)], [])  # 1200 events
        batches: list[list[int]] = []
        async for batch in client.watch("/big/", start + 1):
            batches.append([e.revision for e in batch])
            if sum(map(len, batches)) == 2400:
                break
        assert len(batches) > 1
        for one, later in itertools.pairwise(batches):
            assert one[-1] < later[0]
        assert batches[-1].count(start + 13) == 1200


# -- the token, bad input -------------------------------------------------------------------
async def test_wrong_token_refused(tmp_path: Path) -> None:
    async with meta(tmp_path / "m") as (server, client):
        await client.put("/t/a", "1")
        for token in ("", "not-the-token"):
            stranger = Etcd([server.url], token=token)
            try:
                with pytest.raises(EtcdUnavailable, match="401"):
                    await stranger.put("/t/a", "stolen")
                with pytest.raises(EtcdUnavailable, match="401"):
                    await stranger.get("/t/a")
                with pytest.raises(EtcdUnavailable, match="401"):
                    async for _ in stranger.watch("/t/", 1):
                        pass
            finally:
                await stranger.close()
        kv = await client.get("/t/a")
        assert kv is not None and kv.value == b"1"
        assert server.url.startswith("http://127.0.0.1:")


async def test_bad_input_is_400_and_costs_nothing(tmp_path: Path) -> None:
    async with meta(tmp_path / "m") as (server, client), aiohttp.ClientSession(
            headers={TOKEN_HEADER: server.token}) as http:
        for path, body in [("/v3/kv/range", b"{bad json"), ("/v3/kv/range", b'{"key": "!!"}'),
                           ("/v3/kv/put", b'{"value": "eA=="}'), ("/v3/kv/put", b"[]"),
                           ("/v3/kv/txn", b'{"compare": [{"key": "YQ==", "target": "X"}]}'),
                           ("/v3/lease/grant", b'{"TTL": "soon"}'),
                           ("/v3/watch", b'{"cancel_request": {}}')]:
            async with http.post(server.url + path, data=body) as resp:
                answer = await resp.json(content_type=None)
                assert (resp.status, answer["code"]) == (400, 3), (path, body, answer)
        assert await client.put("/ok", "1") == 2  # nothing was written meanwhile


# -- durability -----------------------------------------------------------------------------
async def test_restart_keeps_keys_and_drops_leased(tmp_path: Path) -> None:
    async with meta(tmp_path / "m") as (_, client):
        lease = await client.grant(30)
        await client.put("/d/a", "1")
        await client.put("/d/a", "2")
        await client.put("/d/b", "3")
        await client.put("/d/card", "me", lease=lease)
        await client.txn([], [Etcd.op_delete("/d/b"), Etcd.op_put("/d/c", "4")], [])
        before, revision = await client.get_prefix("/d/")
    async with meta(tmp_path / "m") as (_, client):
        after, new_revision = await client.get_prefix("/d/")
        assert after == [kv for kv in before if kv.key != "/d/card"]
        assert new_revision == revision + 1  # the leased key's deletion
        assert await client.keepalive(lease) == 0
        assert await client.put("/d/z", "5") == new_revision + 1
        with pytest.raises(WatchCompacted):  # no history from before the restart
            async for _ in client.watch("/d/", revision):
                pass


async def test_snapshot_when_the_log_grows(tmp_path: Path) -> None:
    data = tmp_path / "m"
    async with meta(data, snapshot_bytes=4096) as (_, client):
        for i in range(200):
            await client.put(f"/s/{i % 20}", "v" * i)
        await client.delete("/s/0")
        before = await client.get_prefix("/s/")
        assert (data / LOG_FILE).stat().st_size < 4096 + 300
        assert (data / SNAPSHOT_FILE).stat().st_size > 1000
    async with meta(data) as (_, client):
        assert await client.get_prefix("/s/") == before


async def test_torn_tail_dropped_damage_refused(tmp_path: Path) -> None:
    data = tmp_path / "m"
    async with meta(data) as (_, client):
        await client.put("/torn/a", "1")
        await client.put("/torn/b", "2")
    log_file = data / LOG_FILE
    whole = log_file.read_bytes()
    log_file.write_bytes(whole[:-3])  # the last record cut mid-way, as a crash mid-write
    async with meta(data) as (_, client):
        kvs, _ = await client.get_prefix("/torn/")
        assert [kv.key for kv in kvs] == ["/torn/a"]
        await client.put("/torn/c", "3")
        await client.put("/torn/d", "4")
    whole = bytearray(log_file.read_bytes())
    first = whole.index(b"/torn/c")
    whole[first] ^= 0xFF  # a flipped byte with a good record after it: damage
    log_file.write_bytes(bytes(whole))
    with pytest.raises(MetaLogDamaged, match="damaged"):
        await MetaServer.start(data)


async def test_kill_9_loses_nothing_answered(tmp_path: Path) -> None:
    """Every put that got its answer is there after the process is killed mid-stream."""
    server = MetaProc(tmp_path).start()
    try:
        clients = [Etcd([server.url], token=server.token) for _ in range(4)]
        answered: list[str] = []

        async def write(n: int) -> None:
            for i in range(100_000):
                await clients[n].put(f"/k/{n}/{i}", json.dumps(i))
                answered.append(f"/k/{n}/{i}")

        writers = [asyncio.ensure_future(write(n)) for n in range(4)]
        while len(answered) < 300 and not any(w.done() for w in writers):
            await asyncio.sleep(0.01)
        assert server.proc is not None
        server.proc.kill()
        results = await asyncio.gather(*writers, return_exceptions=True)
        assert all(isinstance(r, EtcdUnavailable) for r in results)
        for c in clients:
            await c.close()
    finally:
        server.stop()
    async with meta(tmp_path / "meta") as (_, client):
        kvs, _ = await client.get_prefix("/k/")
        assert set(answered) <= {kv.key for kv in kvs}


async def test_failed_log_write_stops_serving(tmp_path: Path) -> None:
    """A write the disk refuses (here the process's file size limit): that call and every
    later one is refused, reads included (RAM would show what the disk does not hold); a
    restart serves every put that was answered."""
    server = MetaProc(tmp_path, file_size_limit=64 << 10).start()
    client = Etcd([server.url], token=server.token)
    answered: list[str] = []
    try:
        with pytest.raises(EtcdUnavailable, match="503"):
            for i in range(10_000):
                await client.put(f"/f/{i}", "v" * 100)
                answered.append(f"/f/{i}")
        with pytest.raises(EtcdUnavailable, match="503"):
            await client.get_prefix("/f/")
        with pytest.raises(EtcdUnavailable, match="503"):
            await client.put("/f/later", "x")
    finally:
        await client.close()
        server.stop()
    assert len(answered) > 100
    async with meta(tmp_path / "meta") as (_, client):
        kvs, _ = await client.get_prefix("/f/")
        assert set(answered) <= {kv.key for kv in kvs}
        assert "/f/later" not in {kv.key for kv in kvs}
