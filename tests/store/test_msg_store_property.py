"""Property: any sequence of writes, removes, syncs, clean restarts and crash restarts leaves
the store agreeing with a dict model of {msg_id: references}."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msg_store_helpers import RecordingClient, body

from broker.store.msg_store import MsgStore

IDS = st.integers(min_value=0, max_value=15)
# Weighted towards writes and removes so files fill, empty and get combined.
OPS = st.lists(
    st.tuples(
        st.sampled_from(["write"] * 8 + ["remove"] * 6 + ["sync"] * 3 + ["gc", "restart", "crash"]),
        IDS,
    ),
    min_size=20,
    max_size=80,
)


def payload(i: int) -> bytes:
    return body(i, 40 + (i * 173) % 260)


def options() -> dict[str, object]:
    return {"file_size_limit": 400, "gc_garbage_fraction": 0.3, "fsync": "never"}


async def run(ops: list[tuple[str, int]], directory: Path) -> None:
    model: dict[int, int] = {}
    client = RecordingClient()
    store = MsgStore(directory, **options())
    await store.start()
    try:
        for op, i in ops:
            if op == "write":
                store.write(i, payload(i), client)
                model[i] = model.get(i, 0) + 1
            elif op == "remove":
                store.remove(i)
                if model.get(i, 0) > 0:
                    model[i] -= 1
            elif op == "sync":
                await store.sync()
            elif op == "gc":
                await store.gc_idle()
            elif op == "restart":
                await store.stop()
                store = MsgStore(directory, **options())
                assert (await store.start(lambda: {})).clean  # clean: refs not consulted
            else:  # crash after the last sync: the queue index supplies the ref counts
                await store.sync()
                await store.close_dirty()
                live = {m: n for m, n in model.items() if n > 0}
                store = MsgStore(directory, **options())
                assert not (await store.start(lambda live=live: live)).clean
            await asyncio.sleep(0)  # let the flusher and compaction interleave
            for m in range(16):
                refs = model.get(m, 0)
                assert store.contains(m) == (refs > 0), (op, i, m)
                if refs:
                    assert store.read(m) == payload(m)
        await store.sync()
        assert sorted(set(client.durable)) == sorted({i for op, i in ops if op == "write"})
        live_bytes = sum(len(payload(m)) + 25 for m, n in model.items() if n > 0)
        assert store.stats()["valid_bytes"] == live_bytes
    finally:
        await store.stop()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_store_matches_model(ops: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run(ops, Path(d)))
