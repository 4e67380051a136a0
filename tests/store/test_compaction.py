"""Garbage collection by combining neighbouring files: disk stays bounded by live data, reads
stay right during a compaction, the left file's good prefix is not rewritten, and a crash at any
step is tidied up at the next start."""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path

from msg_store_helpers import FullDisk, RecordingClient, body

from broker.store.segment import COMPACT_SUFFIX, SEGMENT_SUFFIX, FileWriter, segment_name

LIMIT = 10_000  # ten 1 KiB messages a file (a file rolls once it passes the limit)


def disk_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.glob(f"*{SEGMENT_SUFFIX}"))


async def fill(store, ids) -> None:
    c = RecordingClient()
    for i in ids:
        store.write(i, body(i), c)
    await store.sync()


async def test_gc_keeps_disk_bounded_by_live_data(make_store, tmp_path: Path) -> None:
    store = await make_store(file_size_limit=LIMIT)
    await fill(store, range(300))
    before = disk_bytes(tmp_path / "store")
    live = [i for i in range(300) if i % 10 == 0]
    store.remove_many(i for i in range(300) if i % 10)
    await store.gc_idle()
    stats = store.stats()
    assert stats["compactions"] > 0
    on_disk = disk_bytes(tmp_path / "store")
    assert on_disk == stats["bytes"]
    assert on_disk <= 2 * stats["valid_bytes"] + 2 * LIMIT  # bounded by live data
    assert on_disk < before / 3
    assert stats["garbage_bytes"] / stats["bytes"] <= 0.5 or stats["files"] < 3
    assert all(store.read(i) == body(i) for i in live)
    await store.stop()
    again = await make_store(file_size_limit=LIMIT)
    assert all(again.read(i) == body(i) for i in live)


async def test_emptied_file_is_deleted_without_compaction(make_store, tmp_path: Path) -> None:
    store = await make_store(file_size_limit=LIMIT)
    await fill(store, range(30))
    assert (tmp_path / "store" / segment_name(1)).exists()
    store.remove_many(range(10))  # exactly file 1's messages
    assert not (tmp_path / "store" / segment_name(1)).exists()
    assert store.stats()["compactions"] == 0


async def test_left_prefix_is_not_rewritten(make_store) -> None:
    store = await make_store(file_size_limit=LIMIT, gc_garbage_fraction=0.1)
    await fill(store, range(40))
    prefix = {i: store._index[i].offset for i in range(3)}  # 0..2 stay contiguous at the start
    store.remove_many([3, 5, 7, 9, *range(10, 17)])  # file 1 keeps 6, file 2 keeps 3: they fit
    await store.gc_idle()
    assert store.stats()["compactions"] >= 1
    assert {i: store._index[i].offset for i in range(3)} == prefix
    kept = [0, 1, 2, 4, 6, 8, 17, 18, 19]
    assert all(store._index[i].file == 1 for i in kept)
    offsets = [store._index[i].offset for i in kept]
    assert offsets == sorted(offsets)  # left scattered data moved down, then right's, in order
    assert offsets[3] == prefix[2] + 1025  # 4 moved right after the prefix
    assert all(store.read(i) == body(i) for i in kept)


class GatedWriter(FileWriter):
    """Holds the n-th fsync until released: the compaction is caught mid-way."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reached = threading.Event()
        self.release = threading.Event()

    def fsync(self, fd: int) -> None:
        self.n -= 1
        if self.n == 0:
            self.reached.set()
            self.release.wait()
        super().fsync(fd)


async def test_reads_during_compaction_return_right_bodies(make_store) -> None:
    # fsync="never" keeps the flusher away from fsync, so only the compaction meets the gate:
    # fsync 1 is the .hcmp copy, fsync 2 is the rewritten left file (already overwritten).
    store = await make_store(file_size_limit=LIMIT, fsync="never")
    await fill(store, range(45))
    gate = GatedWriter(2)
    store.file_writer = gate
    live = [i for i in range(45) if i % 3 == 0 or i >= 40]
    store.remove_many(i for i in range(40) if i % 3)
    assert await asyncio.to_thread(gate.reached.wait, 30)  # a guard against hanging, not a timing
    try:
        assert store._moving is not None  # caught with the left file half rewritten
        assert all(store.read(i) == body(i) for i in live)
        c = RecordingClient()
        await fill(store, range(100, 120))  # other files are not blocked
        store.write(200, body(200), c)
        await store.sync()
        assert c.durable == [200] and store.read(200) == body(200)
        store.remove(live.pop(0))  # removes during compaction are fine too
    finally:
        gate.release.set()
    await store.gc_idle()
    assert store.stats()["compactions"] >= 1
    assert all(store.read(i) == body(i) for i in live + list(range(100, 120)))
    assert not store.contains(0)


class FailingApply(FullDisk):
    """Lets the .hcmp copy through, then fails rewriting the left file after `partial` bytes."""

    def __init__(self, partial: int | None) -> None:
        super().__init__()
        self.partial = partial
        self.armed = True

    def fallocate(self, fd: int, length: int) -> None:
        if self.armed and self.partial is None:
            raise OSError(errno.ENOSPC, "no space")
        super().fallocate(fd, length)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        if self.armed and self.partial is not None and len(data) > 5000 and offset > 100:
            super().pwrite(fd, memoryview(data)[: self.partial], offset)  # torn rewrite
            raise OSError(errno.EIO, "device gone")
        super().pwrite(fd, data, offset)


async def _stuck_compaction(make_store, tmp_path: Path, partial: int | None):
    store = await make_store(file_size_limit=LIMIT)
    await fill(store, range(45))
    writer = FailingApply(partial)
    store.file_writer = writer
    live = [i for i in range(45) if i % 3 == 0 or i >= 40]
    store.remove_many(i for i in range(40) if i % 3)
    await store.gc_idle()
    assert list((tmp_path / "store").glob(f"*{COMPACT_SUFFIX}"))  # the durable copy remains
    assert all(store.read(i) == body(i) for i in live)  # still served while stuck
    await store.stop()  # no clean marker: the next start must tidy up
    return live


async def test_compaction_interrupted_before_rewrite_is_redone(make_store, tmp_path) -> None:
    live = await _stuck_compaction(make_store, tmp_path, partial=None)
    again = await make_store(file_size_limit=LIMIT)
    report = again.last_report
    assert not report.clean
    assert report.compactions == [(f"{1:08d}{COMPACT_SUFFIX}", "redone")]
    assert not list((tmp_path / "store").glob(f"*{COMPACT_SUFFIX}"))
    assert all(again.read(i) == body(i) for i in live)


async def test_compaction_interrupted_mid_rewrite_is_redone(make_store, tmp_path) -> None:
    live = await _stuck_compaction(make_store, tmp_path, partial=1500)
    again = await make_store(file_size_limit=LIMIT, refs=lambda: dict.fromkeys(live, 1))
    assert again.last_report.compactions[0][1] == "redone"
    assert again.last_report.duplicates > 0  # the right file still holds its copies
    assert all(again.read(i) == body(i) for i in live)
    assert sorted(i for i in range(45) if again.contains(i)) == live


async def test_incomplete_compaction_copy_is_discarded(make_store, tmp_path: Path) -> None:
    live = await _stuck_compaction(make_store, tmp_path, partial=None)
    (hcmp,) = (tmp_path / "store").glob(f"*{COMPACT_SUFFIX}")
    data = hcmp.read_bytes()
    hcmp.write_bytes(data[:-40])  # the crash hit while the copy was being written
    again = await make_store(file_size_limit=LIMIT)
    assert again.last_report.compactions == [(hcmp.name, "discarded")]
    assert all(again.read(i) == body(i) for i in live)


async def test_compaction_copy_failing_on_full_disk_leaves_files_alone(make_store) -> None:
    store = await make_store(file_size_limit=LIMIT)
    await fill(store, range(45))
    disk = FullDisk()
    disk.full = True
    store.file_writer = disk
    store.remove_many(i for i in range(40) if i % 3)
    await store.gc_idle()
    assert store.stats()["compactions"] == 0
    assert not list(store.directory.glob(f"*{COMPACT_SUFFIX}"))  # the failed copy is gone
    live = [i for i in range(45) if i % 3 == 0 or i >= 40]
    assert all(store.read(i) == body(i) for i in live)
    disk.full = False  # space returns: later removes try again
    await fill(store, range(1000, 1130))
    store.remove_many(range(1000, 1130))
    await store.gc_idle()
    assert store.stats()["compactions"] >= 1
    assert all(store.read(i) == body(i) for i in live)


async def test_compaction_drops_a_live_record_that_fails_its_checksum(make_store) -> None:
    store = await make_store(file_size_limit=LIMIT)
    await fill(store, range(45))
    victim = 6  # live, in file 1 past the prefix (1 and 2 are removed below)
    loc = store._index[victim]
    with open(store.directory / segment_name(1), "r+b") as f:
        f.seek(loc.offset + 100)
        f.write(b"\xff\xfe\xfd")
    live = [i for i in range(45) if i % 3 == 0 or i >= 40]
    store.remove_many(i for i in range(40) if i % 3)
    await store.gc_idle()
    assert store.stats()["compactions"] >= 1
    assert not store.contains(victim)  # never served damaged
    assert store.stats()["corrupt_records"] == 1
    assert all(store.read(i) == body(i) for i in live if i != victim)


def test_pick_pair_takes_the_leftmost_fitting_pair_and_skips_current_and_locked() -> None:
    from broker.store.compaction import pick_pair
    from broker.store.msg_store_index import FileSummary, link_neighbours

    def files(*specs: tuple[int, int, bool]) -> dict[int, FileSummary]:
        out = {}
        for n, (valid, size, locked) in enumerate(specs, start=1):
            out[n] = FileSummary(valid, size)
            out[n].locked = locked
        link_neighbours(out)
        return out

    full, half, tiny = (9000, 9016, False), (4000, 9016, False), (100, 9016, False)
    assert pick_pair(files(full, half, tiny, half), 4, LIMIT) == (2, 3)
    assert pick_pair(files(half, half, tiny), 3, LIMIT) == (1, 2)
    assert pick_pair(files(half, (4000, 9016, True), tiny, tiny), 4, LIMIT) is None  # 2 locked
    assert pick_pair(files(full, full, tiny), 3, LIMIT) is None  # nothing fits, 3 is current
    assert pick_pair(files((100, 116, False), (100, 116, False), tiny), 3, LIMIT) is None
