"""Queue index segment files as files: repairing them at recovery, quarantine, the clean
marker, appends that never leave a partial record, and the scans over all queue indexes that
the message store and the boot sequence need (`msg_refs`, `remove_orphans`).

Recovery of one segment file:
* a file shorter than its header (torn while being created) is removed;
* a header that is not ours, of another segment, or a read error: the file moves to
  ``quarantine/`` and its entries are lost;
* a damaged record with good ones after it: skipped; the original is linked into
  ``quarantine/`` and the segment rewritten with its good live entries;
* a torn tail (a last record short or failing its CRC): the file is truncated before it.
Each is logged and counted in a `RecoveryStats`."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import struct
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import structlog

from broker.store.queue_index_format import (
    FILE_HEADER_SIZE,
    SEGMENT_MAGIC,
    SEGMENT_SUFFIX,
    BadHeader,
    SegmentScan,
    encode_header,
    encode_pub,
    parse_header,
    scan_segment,
    segment_file_number,
)

__all__ = [
    "BAD_HEADER",
    "CLEAN_MARKER",
    "QUARANTINE_DIR",
    "TORN_HEADER",
    "UNREADABLE",
    "IndexSegmentFile",
    "RecoveryStats",
    "append",
    "existing_segment_entries",
    "fsync_dir",
    "index_dirs",
    "msg_refs",
    "quarantine",
    "read_index_segment",
    "read_queue_index",
    "recover_file",
    "remove_orphans",
    "rewrite_segment",
    "segment_files",
    "take_clean_marker",
    "write_all",
    "write_clean_marker",
]

log = structlog.get_logger("broker.store.queue_index")

DEFAULT_SEGMENT_ENTRIES = 16384  # the setting's default (queue_index_segment_entries)
CLEAN_MARKER = "clean.dot"  # RabbitMQ's name for the same thing
QUARANTINE_DIR = "quarantine"
_CLEAN = struct.Struct(">4sQI")  # magic, next seq_id, crc32 of the two
_CLEAN_MAGIC = b"HQIC"


@dataclass(slots=True)
class RecoveryStats:
    """What recovery had to repair; counted so management and tests can see it."""

    torn_records: int = 0  # segments whose torn tail was cut off
    corrupt_records: int = 0  # damaged records skipped in the middle of a segment
    quarantined_segments: int = 0  # files moved (or copied) into quarantine/


@dataclass(slots=True)
class IndexSegmentFile:
    """What one segment file holds. `scan` is None when nothing in it is usable; `fault` and
    `detail` then say why."""

    number: int
    path: pathlib.Path
    size: int = 0
    scan: SegmentScan | None = None
    fault: str = ""  # TORN_HEADER | UNREADABLE | BAD_HEADER
    detail: str = ""


# why nothing of a segment file is usable (IndexSegmentFile.fault)
TORN_HEADER = "torn header"  # shorter than its header: torn while being created
UNREADABLE = "unreadable"  # the read failed (EIO, permissions)
BAD_HEADER = "bad header"  # not ours, or the header of another segment or segment size


def read_index_segment(
    path: pathlib.Path, number: int, segment_entries: int
) -> IndexSegmentFile:
    """Read and replay one segment file, changing nothing. Shared by recovery (which then
    repairs), `msg_refs` and the offline reader."""
    seg = IndexSegmentFile(number, path)
    try:
        data = path.read_bytes()
    except OSError as e:
        seg.fault, seg.detail = UNREADABLE, e.strerror or str(e)
        return seg
    seg.size = len(data)
    if len(data) < FILE_HEADER_SIZE and SEGMENT_MAGIC.startswith(data[:4]):
        seg.fault, seg.detail = TORN_HEADER, f"{len(data)} bytes"
        return seg
    try:
        scan = scan_segment(data)
        if scan.number != number or scan.segment_entries != segment_entries:
            raise BadHeader(f"header says segment {scan.number} of {scan.segment_entries} entries")
    except BadHeader as e:
        seg.fault, seg.detail = BAD_HEADER, str(e)
        return seg
    seg.scan = scan
    return seg


def recover_file(
    path: pathlib.Path, number: int, segment_entries: int, stats: RecoveryStats
) -> SegmentScan | None:
    """Scan one segment file and repair it on disk (see the module docstring); None when
    nothing of it is usable."""
    seg = read_index_segment(path, number, segment_entries)
    scan = seg.scan
    if seg.fault == TORN_HEADER:  # the header itself never made it to disk
        log.warning("queue_index.torn_header_dropped", path=str(path), size=seg.size)
        stats.torn_records += 1
        path.unlink()
        return None
    if scan is None:  # EIO, or not ours: keep the queue, lose this segment
        log.error("queue_index.segment_unreadable", path=str(path), error=seg.detail)
        if seg.fault == UNREADABLE:
            with contextlib.suppress(OSError):
                quarantine(path, stats, keep=False)
        else:
            quarantine(path, stats, keep=False)
        return None
    if scan.corrupt:
        stats.corrupt_records += len(scan.corrupt)
        stats.torn_records += bool(scan.torn_bytes)
        log.error(
            "queue_index.corrupt_records_skipped",
            path=str(path),
            records=scan.corrupt,
            torn_bytes=scan.torn_bytes,
        )
        rewrite_segment(path, scan, stats)  # the damage must not sit before future appends
        rewritten = scan_segment(path.read_bytes())
        scan.positions = rewritten.positions
    elif scan.torn_bytes:
        stats.torn_records += 1
        log.warning(
            "queue_index.torn_record_dropped",
            path=str(path),
            offset=scan.good_end,
            bytes=scan.torn_bytes,
        )
        os.truncate(path, scan.good_end)
    return scan


def rewrite_segment(path: pathlib.Path, scan: SegmentScan, stats: RecoveryStats) -> None:
    """Replace a damaged segment by one holding only its good live entries; the original
    goes to quarantine first, so each step leaves a readable file in place."""
    buf = bytearray(encode_header(scan.number, scan.segment_entries))
    base = scan.number * scan.segment_entries
    for rel in sorted(scan.entries):
        msg_id, payload = scan.entries[rel]
        encode_pub(buf, base + rel, msg_id, payload, rel in scan.delivered)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, buf)
        os.fsync(fd)
    finally:
        os.close(fd)
    quarantine(path, stats, keep=True)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def quarantine(path: pathlib.Path, stats: RecoveryStats, *, keep: bool) -> None:
    qdir = path.parent / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    dest = qdir / f"{path.name}.{time.time_ns()}"
    if keep:
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)
    else:
        os.replace(path, dest)
    fsync_dir(qdir)
    fsync_dir(path.parent)
    stats.quarantined_segments += 1
    log.error("queue_index.segment_quarantined", path=str(path), moved_to=str(dest))


def read_queue_index(
    directory: pathlib.Path, segment_entries: int | None = None
) -> Iterator[IndexSegmentFile]:
    """Every segment file of one queue index directory, ascending, read as recovery reads them
    (same segment size rule, same header checks), changing nothing."""
    entries = existing_segment_entries(directory, segment_entries)
    for number, path in segment_files(directory):
        yield read_index_segment(path, number, entries)


def index_dirs(root: pathlib.Path) -> list[pathlib.Path]:
    """The queue index directories under `root` (those holding a segment file), sorted."""
    root = pathlib.Path(root)
    found = {
        path.parent
        for path in root.rglob("*" + SEGMENT_SUFFIX)
        if QUARANTINE_DIR not in path.relative_to(root).parts
    }
    return sorted(found)


def msg_refs(root: pathlib.Path, segment_entries: int | None = None) -> dict[int, int]:
    """How many un-acked, non-embedded index entries reference each msg_id, over every queue
    index directory under `root` (read only; damaged records and files are skipped as recovery
    would). The message store rebuilds its reference counts from this after a dirty stop."""
    counts: dict[int, int] = {}
    for directory in index_dirs(root):
        for seg in read_queue_index(directory, segment_entries):
            if seg.scan is None:
                continue
            for msg_id, payload in seg.scan.entries.values():
                if payload is None:
                    counts[msg_id] = counts.get(msg_id, 0) + 1
    return counts


def remove_orphans(root: pathlib.Path, keep: Iterable[pathlib.Path]) -> list[pathlib.Path]:
    """Delete the queue index directories under `root` that are not in `keep` (the directories
    of the durable queues the definitions database knows), as RabbitMQ does at boot with its
    durable queue names. A queue deleted during a crash leaves such a directory; run this before
    `msg_refs`, so its entries neither keep bodies alive nor come back under a new queue of the
    same name. Returns what was removed."""
    root = pathlib.Path(root)
    kept = {pathlib.Path(p).resolve() for p in keep}
    found: set[pathlib.Path] = set()
    for pattern in ("*" + SEGMENT_SUFFIX, CLEAN_MARKER):
        for path in root.rglob(pattern):
            if QUARANTINE_DIR not in path.relative_to(root).parts:
                found.add(path.parent)
    removed = []
    for d in sorted(found):
        if d.resolve() not in kept:
            shutil.rmtree(d, ignore_errors=True)
            log.warning("queue_index.orphan_removed", directory=str(d))
            removed.append(d)
    return removed


# -- file helpers -------------------------------------------------------------------------------
def segment_files(directory: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    found = []
    for path in directory.iterdir():
        number = segment_file_number(path.name)
        if number is not None and path.is_file():
            found.append((number, path))
    found.sort()
    return found


def existing_segment_entries(directory: pathlib.Path, configured: int | None) -> int:
    """The segment size the files on disk were written with (seq ids must keep their files):
    `configured` if any readable header agrees with it, else the size most headers agree on,
    so one damaged header cannot re-map every other segment. Without `configured` (an offline
    reader does not know the setting) the size most headers agree on."""
    seen: Counter[int] = Counter()
    for _, path in segment_files(directory):
        try:
            with path.open("rb") as f:
                seen[parse_header(f.read(FILE_HEADER_SIZE))[1]] += 1
        except (BadHeader, OSError):
            continue  # recovery quarantines it
    if configured is not None and (not seen or configured in seen):
        return configured
    return seen.most_common(1)[0][0] if seen else DEFAULT_SEGMENT_ENTRIES


def take_clean_marker(directory: pathlib.Path) -> tuple[bool, int]:
    """(was the last stop clean, next seq_id it recorded); removes the marker durably."""
    path = directory / CLEAN_MARKER
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return False, 0
    path.unlink()
    fsync_dir(directory)
    if len(data) != _CLEAN.size:
        return False, 0
    magic, next_seq, crc = _CLEAN.unpack(data)
    if magic != _CLEAN_MAGIC or zlib.crc32(data[:-4]) != crc:
        return False, 0
    return True, next_seq


def write_clean_marker(directory: pathlib.Path, next_seq: int) -> None:
    head = _CLEAN.pack(_CLEAN_MAGIC, next_seq, 0)[:-4]
    data = head + struct.pack(">I", zlib.crc32(head))
    tmp = directory / (CLEAN_MARKER + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / CLEAN_MARKER)
    fsync_dir(directory)


def append(fd: int, data: bytes | bytearray) -> int:
    """Append all of `data` and return where it starts or, on failure (ENOSPC, EFBIG, EIO),
    cut the file back to where it was, so no partial record sits before the next append."""
    size = os.lseek(fd, 0, os.SEEK_END)
    try:
        write_all(fd, data)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise
    return size


def write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
