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
from broker.store.msg_store_index import (
    FileSummary,
    MsgLocation,
    SnapshotError,
    link_neighbours,
    read_snapshot,
)
from broker.store.segment import (
    COMPACT_SUFFIX,
    FILE_HEADER_SIZE,
    SEGMENT_SUFFIX,
    BadHeader,
    FileWriter,
    encode_file_header,
    fsync_dir,
    parse_file_header,
    scan_records,
    segment_number,
)

__all__ = [
    "CLEAN_MARKER",
    "QUARANTINE_DIR",
    "SNAPSHOT",
    "Recovered",
    "RecoveryReport",
    "is_torn_creation",
    "quarantine",
    "recover",
    "wipe",
]

CLEAN_MARKER = "clean.marker"
SNAPSHOT = "msg_store.snapshot"
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
    marker, snapshot = directory / CLEAN_MARKER, directory / SNAPSHOT
    numbers = _numbers(directory)
    was_clean = marker.exists()
    if was_clean:
        marker.unlink()  # from now on a crash means a dirty start
        fsync_dir(directory)
    if was_clean and not any(directory.glob(f"*{COMPACT_SUFFIX}")):
        try:
            index, summary = read_snapshot(snapshot)
            if _sizes_match(directory, summary, numbers):
                snapshot.unlink()
                report = RecoveryReport(clean=True, messages=len(index), files=len(summary))
                return Recovered(index, summary, report, max(numbers, default=0) + 1)
            log.warning("snapshot_mismatch", reason="segment files differ from the snapshot")
        except (OSError, SnapshotError) as e:
            log.warning("snapshot_unusable", error=str(e))
    snapshot.unlink(missing_ok=True)
    return _scan_all(directory, writer, log, numbers)


def _numbers(directory: Path) -> list[int]:
    found = []
    for path in directory.iterdir():
        n = segment_number(path)
        if n is not None and path.suffix == SEGMENT_SUFFIX:
            found.append(n)
    return sorted(found)


def _sizes_match(directory: Path, summary: dict[int, FileSummary], numbers: list[int]) -> bool:
    if sorted(summary) != numbers:
        return False
    for number, s in summary.items():
        path = directory / f"{number:08d}{SEGMENT_SUFFIX}"
        if not path.is_file() or path.stat().st_size != s.file_size:
            return False
    return True


def is_torn_creation(data: bytes, number: int) -> bool:
    """A file cut short while its header was being written (empty, a prefix of the header,
    or zeros): not damage, just a roll the crash interrupted."""
    if len(data) >= FILE_HEADER_SIZE:  # a whole header is an empty segment, not a torn one
        return False
    return encode_file_header(number).startswith(data) or not any(data)


def _scan_all(directory: Path, writer: FileWriter, log: Any, numbers: list[int]) -> Recovered:
    report = RecoveryReport(clean=False)
    report.compactions = tidy_up(directory, writer)
    for name, action in report.compactions:
        log.warning("compaction_tidied", file=name, action=action)
    index: dict[int, MsgLocation] = {}
    summary: dict[int, FileSummary] = {}
    for number in numbers:
        path = directory / f"{number:08d}{SEGMENT_SUFFIX}"
        try:
            data = path.read_bytes()
            if is_torn_creation(data, number):  # crashed while rolling to this new file
                report.torn_bytes += len(data)
                log.warning("torn_file_dropped", file=path.name, bytes=len(data))
                path.unlink()
                continue
            _, header_number = parse_file_header(data)
            if header_number != number:
                raise BadHeader(f"header names file {header_number}")
        except (OSError, BadHeader) as e:
            moved = quarantine(directory, path)
            report.quarantined.append(moved)
            log.error("segment_quarantined", file=path.name, error=str(e))
            continue
        scan = scan_records(data)
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
        valid = 0
        for msg_id, offset, size in scan.records:
            if msg_id in index:
                report.duplicates += 1
                continue
            index[msg_id] = MsgLocation(1, number, offset, size)
            valid += size
        summary[number] = FileSummary(valid, scan.good_end)
    link_neighbours(summary)
    report.messages, report.files = len(index), len(summary)
    return Recovered(index, summary, report, max(numbers, default=0) + 1)
