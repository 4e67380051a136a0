"""Offline check of a stopped broker's files (`hare-ctl verify`): a message store's directory
(`verify`), the queue indexes (`verify_queue_indexes`) and the streams (`verify_streams`), read
with the parsers recovery uses. Reads only; never repairs (the next start does that)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.store.msg_store_files import (
    BAD_HEADER,
    CLEAN_MARKER,
    SNAPSHOT,
    TORN_CREATION,
    UNREADABLE,
    StaleSnapshot,
    locate,
    read_clean_snapshot,
    read_segment,
    segment_numbers,
)
from broker.store.msg_store_index import SnapshotError
from broker.store.msg_store_recovery import QUARANTINE_DIR
from broker.store.quarantine import MESSAGE_PREFIX, quarantined_messages
from broker.store.queue_index_files import BAD_HEADER as IDX_BAD_HEADER
from broker.store.queue_index_files import QUARANTINE_DIR as IDX_QUARANTINE_DIR
from broker.store.queue_index_files import UNREADABLE as IDX_UNREADABLE
from broker.store.queue_index_files import index_dirs, read_queue_index
from broker.store.segment import COMPACT_SUFFIX, BadHeader, parse_file_header, segment_name
from broker.store.stream_format import (
    FILE_HEADER_SIZE,
    SEGMENT_MAGIC,
    SegmentDamage,
    list_segments,
    segment_path,
    walk_segment,
)

__all__ = ["IndexVerifyReport", "StreamVerifyReport", "VerifyReport", "verify",
           "verify_queue_indexes", "verify_streams"]


@dataclass(slots=True)
class VerifyReport:
    directory: str
    segments: int = 0
    messages: int = 0  # distinct message ids found in good records
    bytes: int = 0
    duplicates: int = 0
    clean_shutdown: bool = False  # a clean marker is present
    snapshot: str = "absent"  # absent | valid | invalid | stale
    bad_headers: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    torn_tails: list[tuple[str, int, int]] = field(default_factory=list)  # file, offset, bytes
    corrupt_records: list[tuple[str, int, int]] = field(default_factory=list)  # file, off, len
    interrupted_compactions: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)  # segment files moved aside
    # messages set aside when found damaged at read (broker/store/quarantine.py)
    quarantined_messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No damage found (torn tails and interrupted compactions count: a start repairs
        them, but they show the store was not shut down cleanly)."""
        return not (
            self.bad_headers
            or self.unreadable
            or self.torn_tails
            or self.corrupt_records
            or self.interrupted_compactions
            or self.snapshot in ("invalid", "stale")
        )

    def problems(self) -> list[str]:
        out = [f"{name}: bad header" for name in self.bad_headers]
        out += [f"{name}: unreadable" for name in self.unreadable]
        out += [f"{n}: torn tail of {b} bytes at {o}" for n, o, b in self.torn_tails]
        out += [f"{n}: corrupt record at {o} ({b} bytes)" for n, o, b in self.corrupt_records]
        out += [f"{n}: interrupted compaction" for n in self.interrupted_compactions]
        if self.snapshot in ("invalid", "stale"):
            out.append(f"{SNAPSHOT}: {self.snapshot}")
        return out


def verify(directory: Path) -> VerifyReport:
    """Check every segment's header and records, leftover compaction files and the snapshot."""
    directory = Path(directory)
    report = VerifyReport(str(directory))
    numbers = segment_numbers(directory)
    files = []
    for number in numbers:
        seg = read_segment(directory / segment_name(number), number)
        name, scan = seg.path.name, seg.scan
        report.segments += 1
        if seg.fault == UNREADABLE:
            report.unreadable.append(name)
        elif seg.fault == TORN_CREATION:
            report.torn_tails.append((name, 0, seg.size))
        elif seg.fault == BAD_HEADER:
            report.bad_headers.append(name)
        if scan is None:
            continue
        report.bytes += seg.size
        if scan.torn_bytes:
            report.torn_tails.append((name, scan.good_end, scan.torn_bytes))
        report.corrupt_records += [(name, off, n) for off, n in scan.corrupt]
        files.append(seg)
    index, _, report.duplicates = locate(files)
    report.messages = len(index)
    report.interrupted_compactions = sorted(p.name for p in directory.glob(f"*{COMPACT_SUFFIX}"))
    report.clean_shutdown = (directory / CLEAN_MARKER).exists()
    if (directory / SNAPSHOT).exists():
        try:
            read_clean_snapshot(directory, numbers)
            report.snapshot = "valid"
        except StaleSnapshot:
            report.snapshot = "stale"
        except (OSError, SnapshotError):
            report.snapshot = "invalid"
    qdir = directory / QUARANTINE_DIR
    if qdir.is_dir():
        report.quarantined = sorted(
            p.name for p in qdir.iterdir() if not p.name.startswith(MESSAGE_PREFIX))
    report.quarantined_messages = quarantined_messages(directory)
    return report


@dataclass(slots=True)
class IndexVerifyReport:
    """What `verify_queue_indexes` found under a `queues/` directory (file names relative to
    it: `<queue dir>/<segment>`)."""

    directory: str
    queues: int = 0  # queue index directories
    segments: int = 0
    messages: int = 0  # live (un-acked) entries in good records
    bytes: int = 0
    bad_headers: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    torn_tails: list[tuple[str, int, int]] = field(default_factory=list)  # file, offset, bytes
    corrupt_records: list[tuple[str, int, int]] = field(default_factory=list)  # file, off, len
    quarantined: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.bad_headers or self.unreadable or self.torn_tails
                    or self.corrupt_records)

    def problems(self) -> list[str]:
        out = [f"{name}: bad header" for name in self.bad_headers]
        out += [f"{name}: unreadable" for name in self.unreadable]
        out += [f"{n}: torn tail of {b} bytes at {o}" for n, o, b in self.torn_tails]
        out += [f"{n}: corrupt record at {o} ({b} bytes)" for n, o, b in self.corrupt_records]
        return out


def verify_queue_indexes(root: Path) -> IndexVerifyReport:
    """Check every queue index segment under `root` with the parser recovery uses (read only:
    the next start repairs)."""
    root = Path(root)
    report = IndexVerifyReport(str(root))
    for directory in index_dirs(root):
        report.queues += 1
        for seg in read_queue_index(directory):
            name = str(seg.path.relative_to(root))
            report.segments += 1
            report.bytes += seg.size
            if seg.fault == IDX_BAD_HEADER:
                report.bad_headers.append(name)
            elif seg.fault == IDX_UNREADABLE:
                report.unreadable.append(name)
            elif seg.fault:  # a header torn while the file was created
                report.torn_tails.append((name, 0, seg.size))
            if seg.scan is None:
                continue
            report.messages += len(seg.scan.entries)
            if seg.scan.torn_bytes:
                report.torn_tails.append((name, seg.scan.good_end, seg.scan.torn_bytes))
            report.corrupt_records += [(name, o, n) for o, n in seg.scan.corrupt]
        qdir = directory / IDX_QUARANTINE_DIR
        if qdir.is_dir():
            report.quarantined += sorted(str(p.relative_to(root)) for p in qdir.iterdir())
    return report


@dataclass(slots=True)
class StreamVerifyReport:
    """What `verify_streams` found under a `streams/` directory (file names relative to it)."""

    directory: str
    streams: int = 0
    segments: int = 0
    chunks: int = 0
    messages: int = 0
    bytes: int = 0
    bad_headers: list[str] = field(default_factory=list)
    torn_tails: list[tuple[str, int, int]] = field(default_factory=list)  # file, offset, bytes
    corrupt_chunks: list[tuple[str, int, int]] = field(default_factory=list)  # file, off, len
    quarantined: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.bad_headers or self.torn_tails or self.corrupt_chunks)

    def problems(self) -> list[str]:
        out = [f"{name}: bad header" for name in self.bad_headers]
        out += [f"{n}: torn tail of {b} bytes at {o}" for n, o, b in self.torn_tails]
        out += [f"{n}: corrupt chunk at {o} ({b} bytes)" for n, o, b in self.corrupt_chunks]
        return out


def verify_streams(root: Path) -> StreamVerifyReport:
    """Check every chunk of every stream segment under `root` (stream_format.walk_segment, the
    walk the offline reader uses; the broker's recovery cuts torn tails, its readers skip
    corrupt chunks)."""
    root = Path(root)
    report = StreamVerifyReport(str(root))
    streams = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    for directory in streams:
        report.streams += 1
        for first in list_segments(directory):
            path = segment_path(directory, first)
            name = str(path.relative_to(root))
            report.segments += 1
            report.bytes += path.stat().st_size
            try:
                with open(path, "rb") as f:
                    parse_file_header(f.read(FILE_HEADER_SIZE), SEGMENT_MAGIC)
            except BadHeader:
                report.bad_headers.append(name)
                continue
            for got in walk_segment(directory, first):
                if isinstance(got, SegmentDamage):
                    into = report.torn_tails if got.what == "torn tail" else (
                        report.corrupt_chunks)
                    into.append((name, got.position, got.length))
                else:
                    report.chunks += 1
                    report.messages += got[0].messages
        aside = directory / "quarantine"
        if aside.is_dir():
            report.quarantined += sorted(str(p.relative_to(root)) for p in aside.iterdir())
    return report
