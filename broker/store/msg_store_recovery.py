"""Starting a message store from what is on disk: wipe (transient), clean start from the
snapshot, or dirty start by scanning every segment. Plain functions run in a worker thread;
the MsgStore applies the queue's reference counts afterwards on its loop."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.store.compaction import tidy_up
from broker.store.msg_store_files import (
    CLEAN_MARKER,
    SNAPSHOT,
    TORN_CREATION,
    StaleSnapshot,
    locate,
    read_clean_snapshot,
    read_segment,
    segment_numbers,
)
from broker.store.msg_store_index import FileSummary, MsgLocation, SnapshotError
from broker.store.segment import (
    COMPACT_SUFFIX,
    SEGMENT_SUFFIX,
    FileWriter,
    fsync_dir,
    segment_name,
)

__all__ = [
    "CLEAN_MARKER",
    "QUARANTINE_DIR",
    "SNAPSHOT",
    "Recovered",
    "RecoveryReport",
    "quarantine",
    "recover",
    "wipe",
]

QUARANTINE_DIR = "quarantine"


@dataclass(slots=True)
class RecoveryReport:
    """What start() found and did."""

    clean: bool  # started from the clean-shutdown snapshot
    wiped: bool = False  # transient store: everything deleted
    messages: int = 0  # messages in the index after recovery
    files: int = 0  # segment files in use
    torn_bytes: int = 0  # bytes of torn tails cut off
    corrupt_records: int = 0  # records skipped because their checksum failed
    duplicates: int = 0  # second copies (left by an interrupted compaction)
    unreferenced: int = 0  # messages on disk nobody refers to any more (now garbage)
    missing: int = 0  # ids the caller refers to that are not on disk
    quarantined: list[str] = field(default_factory=list)
    compactions: list[tuple[str, str]] = field(default_factory=list)  # (file, redone|discarded)


@dataclass(slots=True)
class Recovered:
    index: dict[int, MsgLocation]
    summary: dict[int, FileSummary]
    report: RecoveryReport
    next_file: int  # first unused file number


def wipe(directory: Path) -> None:
    """Delete everything a store keeps in directory (not the quarantine folder)."""
    for path in directory.iterdir():
        if path.suffix in (SEGMENT_SUFFIX, COMPACT_SUFFIX) or path.name in (
            CLEAN_MARKER,
            SNAPSHOT,
        ):
            path.unlink()


def quarantine(directory: Path, path: Path) -> str:
    """Move a damaged file aside (never delete evidence). Returns its new name."""
    target_dir = directory / QUARANTINE_DIR
    target_dir.mkdir(exist_ok=True)
    target = target_dir / path.name
    n = 1
    while target.exists():
        target = target_dir / f"{path.name}.{n}"
        n += 1
    if path.is_dir():
        shutil.move(path, target)
    elif path.exists():
        os.replace(path, target)
    fsync_dir(directory)
    return target.name


def recover(directory: Path, writer: FileWriter, log: Any) -> Recovered:
    """Clean start if the marker, the snapshot and the files agree; else a dirty start."""
    marker = directory / CLEAN_MARKER
    numbers = segment_numbers(directory)
    was_clean = marker.exists()
    if was_clean:
        marker.unlink()  # from now on a crash means a dirty start
        fsync_dir(directory)
    if was_clean and not any(directory.glob(f"*{COMPACT_SUFFIX}")):
        try:
            index, summary = read_clean_snapshot(directory, numbers)
            (directory / SNAPSHOT).unlink()
            report = RecoveryReport(clean=True, messages=len(index), files=len(summary))
            return Recovered(index, summary, report, max(numbers, default=0) + 1)
        except StaleSnapshot as e:
            log.warning("snapshot_mismatch", reason=str(e))
        except (OSError, SnapshotError) as e:
            log.warning("snapshot_unusable", error=str(e))
    (directory / SNAPSHOT).unlink(missing_ok=True)
    return _scan_all(directory, writer, log, numbers)


def _scan_all(directory: Path, writer: FileWriter, log: Any, numbers: list[int]) -> Recovered:
    report = RecoveryReport(clean=False)
    report.compactions = tidy_up(directory, writer)
    for name, action in report.compactions:
        log.warning("compaction_tidied", file=name, action=action)
    files = []
    for number in numbers:
        seg = read_segment(directory / segment_name(number), number)
        path, scan = seg.path, seg.scan
        if seg.fault == TORN_CREATION:  # crashed while rolling to this new file
            report.torn_bytes += seg.size
            log.warning("torn_file_dropped", file=path.name, bytes=seg.size)
            path.unlink()
            continue
        if scan is None:
            moved = quarantine(directory, path)
            report.quarantined.append(moved)
            log.error("segment_quarantined", file=path.name, error=f"{seg.fault}: {seg.detail}")
            continue
        if scan.corrupt:
            report.corrupt_records += len(scan.corrupt)
            log.error("corrupt_records", file=path.name, ranges=scan.corrupt[:10])
        if scan.torn_bytes:
            report.torn_bytes += scan.torn_bytes
            log.warning("torn_tail_dropped", file=path.name, offset=scan.good_end,
                        bytes=scan.torn_bytes)
            with open(path, "r+b") as f:
                f.truncate(scan.good_end)
                os.fsync(f.fileno())
        files.append(seg)
    index, summary, report.duplicates = locate(files)
    report.messages, report.files = len(index), len(summary)
    return Recovered(index, summary, report, max(numbers, default=0) + 1)
