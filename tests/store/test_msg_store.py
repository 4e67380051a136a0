"""MsgStore's write/read/remove path: ref counting, batching and confirms, rolling, the
current-file cache, flying write/remove cancellation, fsync policies, the transient store and
a full disk."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest
from msg_store_helpers import FullDisk, RecordingClient, body

from broker.store.msg_store import MsgStore
from broker.store.segment import SEGMENT_SUFFIX, FileWriter


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SEGMENT_SUFFIX}"))


async def test_write_read_remove(make_store, client: RecordingClient) -> None:
    store = await make_store()
    store.write(1, body(1), client)
    assert store.contains(1)
    assert store.read(1) == body(1)  # readable at once, from the write-back cache
    await store.sync()
    assert client.durable == [1]
    store.remove(1)
    assert not store.contains(1)
    with pytest.raises(KeyError):
        store.read(1)
    assert store.stats()["messages"] == 0


async def test_confirms_are_batched_per_client(make_store) -> None:
    store = await make_store()
    a, b = RecordingClient(), RecordingClient()
    for i in range(100):
        store.write(i, body(i, 100), a if i % 2 else b)
    await store.sync()
    assert sorted(a.durable) == list(range(1, 100, 2))
    assert sorted(b.durable) == list(range(0, 100, 2))
    assert a.calls == 1 and b.calls == 1  # one batch, one callback per client


async def test_same_id_written_three_times_is_stored_once(make_store, tmp_path: Path) -> None:
    store = await make_store()
    clients = [RecordingClient() for _ in range(3)]
    for c in clients:
        store.write(7, body(7), c)
    await store.sync()
    assert all(c.durable == [7] for c in clients)  # every writer is confirmed
    assert store.stats()["valid_bytes"] == len(body(7)) + 25  # one copy on disk
    store.remove(7)
    store.remove(7)
    assert store.read(7) == body(7)
    store.remove(7)
    assert not store.contains(7)
    store.remove(7)  # a fourth remove of an unknown id is ignored
    assert store.stats()["messages"] == 0


async def test_second_write_after_removal_stores_again(make_store, client) -> None:
    store = await make_store()
    store.write(1, body(1), client)
    await store.sync()
    store.remove(1)
    store.write(1, body(1), client)
    await store.sync()
    assert store.read(1) == body(1) and client.durable == [1, 1]


async def test_rolls_to_a_new_file_past_the_limit(make_store, tmp_path: Path, client) -> None:
    store = await make_store(file_size_limit=10_000)
    for i in range(50):
        store.write(i, body(i), client)
    await store.sync()
    files = segment_files(tmp_path / "store")
    assert len(files) >= 5
    assert [f.name for f in files][:2] == ["00000001.hseg", "00000002.hseg"]
    assert all(f.stat().st_size < 10_000 + 1100 for f in files)
    for i in range(50):  # old files from disk, the current one from the cache
        assert store.read(i) == body(i)
    assert store.stats()["cache_messages"] < 50


async def test_cache_holds_only_current_file_bodies(make_store, client) -> None:
    store = await make_store(file_size_limit=5_000)
    for i in range(20):
        store.write(i, body(i), client)
        await store.sync()
    stats = store.stats()
    assert 0 < stats["cache_messages"] <= 5
    assert all(store.read(i) == body(i) for i in range(20))


async def test_flying_write_removed_before_flush_is_never_written(
    make_store, tmp_path: Path, client
) -> None:
    store = await make_store()
    size_before = sum(f.stat().st_size for f in segment_files(tmp_path / "store"))
    store.write(1, body(1), client)
    store.remove(1)  # the flusher has not run yet: the write is cancelled
    store.write(2, body(2), client)
    await store.sync()
    assert sorted(client.durable) == [1, 2]  # the cancelled write is still confirmed
    size_after = sum(f.stat().st_size for f in segment_files(tmp_path / "store"))
    assert size_after - size_before == len(body(2)) + 25  # only message 2 hit the disk
    assert store.stats()["cancelled_writes"] == 1
    assert not store.contains(1)


async def test_flying_cancel_keeps_other_references(make_store, client) -> None:
    store = await make_store()
    other = RecordingClient()
    store.write(1, body(1), client)
    store.write(1, body(1), other)
    store.remove(1)  # one of two references: must still be written
    await store.sync()
    assert store.read(1) == body(1)
    assert store.stats()["cancelled_writes"] == 0
    assert client.durable == [1] and other.durable == [1]


@pytest.mark.parametrize("policy", ["always", "batch", "never"])
async def test_fsync_policies(make_store, client, policy: str) -> None:
    store = await make_store(fsync=policy)
    disk = FullDisk()
    store.file_writer = disk
    for i in range(10):
        store.write(i, body(i), client)
    while len(client.durable) < 10:
        await asyncio.sleep(0)
    expected = {"always": 10, "batch": 1, "never": 0}[policy]
    assert disk.fsyncs == expected  # confirm came after exactly this many fsyncs
    await store.sync()  # sync() fsyncs even under "never"
    assert disk.fsyncs == expected + (1 if policy == "never" else 0)


async def test_bad_fsync_policy_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        MsgStore(tmp_path, fsync="sometimes")


async def test_transient_store_is_emptied_at_start(make_store, tmp_path: Path, client) -> None:
    d = tmp_path / "transient"
    store = await make_store(d, transient=True, name="transient")
    for i in range(10):
        store.write(i, body(i), client)
    await store.sync()
    await store.stop()
    again = await make_store(d, transient=True, name="transient")
    assert again.last_report.wiped
    assert again.stats()["messages"] == 0 and not again.contains(3)
    assert len(segment_files(d)) == 1


async def test_full_disk_fails_the_batch_and_recovers(make_store, tmp_path: Path) -> None:
    store = await make_store()
    disk = FullDisk()
    store.file_writer = disk
    ok, hit = RecordingClient(), RecordingClient()
    for i in range(5):
        store.write(i, body(i), ok)
    await store.sync()
    size = sum(f.stat().st_size for f in segment_files(tmp_path / "store"))
    disk.full = True
    for i in range(5, 10):
        store.write(i, body(i), hit)
    store.write(0, body(0), hit)  # an extra reference to a durable message stays fine
    await store.sync()
    assert sorted(hit.failed) == [5, 6, 7, 8, 9]
    assert hit.durable == [0]
    assert hit.errors[0].errno == errno.ENOSPC
    assert not any(store.contains(i) for i in range(5, 10))
    assert sum(f.stat().st_size for f in segment_files(tmp_path / "store")) == size
    assert all(store.read(i) == body(i) for i in range(5))  # nothing durable lost
    assert store.stats()["write_failures"] == 1
    disk.full = False  # space returns
    store.write(5, body(5), hit)
    await store.sync()
    assert hit.durable == [0, 5] and store.read(5) == body(5)
    await store.stop()
    again = await make_store()
    assert again.last_report.clean
    assert sorted(i for i in range(10) if again.contains(i)) == [0, 1, 2, 3, 4, 5]


async def test_full_disk_on_roll_fails_writers(make_store) -> None:
    store = await make_store(file_size_limit=3000)
    disk = FullDisk()
    store.file_writer = disk
    c = RecordingClient()
    for i in range(3):
        store.write(i, body(i), c)
    await store.sync()
    disk.full = True
    store.write(10, body(10), c)
    await store.sync()
    assert c.failed == [10]
    disk.full = False
    store.write(11, body(11), c)
    await store.sync()
    assert store.read(11) == body(11) and 11 in c.durable


async def test_write_after_stop_is_refused(make_store, client) -> None:
    store = await make_store()
    await store.stop()
    with pytest.raises(RuntimeError):
        store.write(1, b"x", client)


class FailingFsync(FullDisk):
    """The write reaches the page cache, the fsync fails (EIO after a lost write, ENOSPC on
    some filesystems that allocate late)."""

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        FileWriter.pwrite(self, fd, data, offset)


async def test_failed_fsync_fails_the_batch_and_cuts_it_off(make_store, tmp_path: Path) -> None:
    store = await make_store()
    disk = FailingFsync()
    store.file_writer = disk
    c = RecordingClient()
    store.write(1, body(1), c)
    await store.sync()
    size = sum(f.stat().st_size for f in segment_files(tmp_path / "store"))
    disk.full = True
    store.write(2, body(2), c)
    await store.sync()
    assert c.durable == [1] and c.failed == [2]
    assert sum(f.stat().st_size for f in segment_files(tmp_path / "store")) == size
    disk.full = False
    store.write(3, body(3), c)
    await store.sync()
    assert c.durable == [1, 3] and store.read(3) == body(3) and not store.contains(2)


async def test_a_large_backlog_is_written_in_bounded_chunks(make_store) -> None:
    store = await make_store(file_size_limit=64 * 1024 * 1024)
    disk = FullDisk()
    store.file_writer = disk
    c = RecordingClient()
    for i in range(9 * 1024):  # 9 MiB queued before the flusher runs once
        store.write(i, body(i, 1000), c)
    await store.sync()
    assert len(c.durable) == 9 * 1024
    assert c.calls == 2 and disk.fsyncs == 2  # two 8 MiB-bounded chunks, each fsynced


async def test_sync_under_never_fsyncs_every_file_written(make_store) -> None:
    store = await make_store(file_size_limit=3000, fsync="never")
    disk = FullDisk()
    store.file_writer = disk
    c = RecordingClient()
    for i in range(9):  # three files' worth, none fsynced
        store.write(i, body(i), c)
    while len(c.durable) < 9:
        await asyncio.sleep(0)
    assert disk.fsyncs == 0 and store.stats()["files"] == 3
    await store.sync()
    assert disk.fsyncs == 3  # the rolled-out files too, not only the current one
    await store.sync()
    assert disk.fsyncs == 3  # nothing new written: nothing to fsync
