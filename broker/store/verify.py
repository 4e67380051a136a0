"""Offline check of a stopped message store's directory (`hare-ctl verify`). Reads only; never
repairs (the next start does that)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from broker.store.msg_store_index import SnapshotError, read_snapshot
from broker.store.msg_store_recovery import (
    CLEAN_MARKER,
    QUARANTINE_DIR,
    SNAPSHOT,
    is_torn_creation,
)
from broker.store.segment import (
    COMPACT_SUFFIX,
    SEGMENT_SUFFIX,
    BadHeader,
    parse_file_header,
    scan_records,
    segment_number,
)

__all__ = ["VerifyReport", "verify"]


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
    quarantined: list[str] = field(default_factory=list)

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
    seen: set[int] = set()
    sizes: dict[int, int] = {}
    for path in sorted(directory.glob(f"*{SEGMENT_SUFFIX}")):
        number = segment_number(path)
        if number is None:
            continue
        report.segments += 1
        try:
            data = path.read_bytes()
        except OSError:
            report.unreadable.append(path.name)
            continue
        if is_torn_creation(data, number):
            report.torn_tails.append((path.name, 0, len(data)))
            continue
        try:
            _, header_number = parse_file_header(data)
            if header_number != number:
                raise BadHeader("number mismatch")
        except (BadHeader, struct.error):
            report.bad_headers.append(path.name)
            continue
        sizes[number] = len(data)
        report.bytes += len(data)
        scan = scan_records(data)
        if scan.torn_bytes:
            report.torn_tails.append((path.name, scan.good_end, scan.torn_bytes))
        report.corrupt_records += [(path.name, off, n) for off, n in scan.corrupt]
        for msg_id, _, _ in scan.records:
            if msg_id in seen:
                report.duplicates += 1
            seen.add(msg_id)
    report.messages = len(seen)
    report.interrupted_compactions = sorted(p.name for p in directory.glob(f"*{COMPACT_SUFFIX}"))
    report.clean_shutdown = (directory / CLEAN_MARKER).exists()
    if (directory / SNAPSHOT).exists():
        try:
            _, summary = read_snapshot(directory / SNAPSHOT)
            fresh = {n: s.file_size for n, s in summary.items()} == sizes
            report.snapshot = "valid" if fresh else "stale"
        except (OSError, SnapshotError):
            report.snapshot = "invalid"
    qdir = directory / QUARANTINE_DIR
    if qdir.is_dir():
        report.quarantined = sorted(p.name for p in qdir.iterdir())
    return report
