"""A message store's directory read without changing a byte: its segment files, the clean-stop
snapshot and interrupted compactions.

The formats have one parser each (segment.py for segments, msg_store_index.py for the snapshot,
compaction.py for the .hcmp copy); this module walks the files with them. Its users decide what
to do with what it finds: recovery repairs (truncates, quarantines), `verify` reports, and the
offline reader (`read_store`, for broker.spark) sees the store as the next start would, without
repairing anything. Plain functions: no event loop, no writes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from broker.store.compaction import CompactionCopy, read_compaction
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
    ScanResult,
    encode_file_header,
    parse_file_header,
    scan_records,
    segment_name,
    segment_number,
)

__all__ = [
    "BAD_HEADER",
    "CLEAN_MARKER",
    "SNAPSHOT",
    "TORN_CREATION",
    "UNREADABLE",
    "Damage",
    "SegmentFile",
    "StaleSnapshot",
    "StoreView",
    "is_torn_creation",
    "locate",
    "read_clean_snapshot",
    "read_segment",
    "read_store",
    "segment_numbers",
]

CLEAN_MARKER = "clean.marker"
SNAPSHOT = "msg_store.snapshot"

# why nothing of a segment file is usable (SegmentFile.fault)
TORN_CREATION = "torn creation"  # cut short while its header was written: a roll a crash cut
UNREADABLE = "unreadable"  # the read failed (EIO, permissions)
BAD_HEADER = "bad header"  # not our magic/version, or the header names another file


class StaleSnapshot(SnapshotError):
    """A snapshot that checks out but describes other segment files than those present."""


@dataclass(slots=True)
class SegmentFile:
    """What one segment file holds. `scan` is None when nothing in it is usable; `fault` and
    `detail` then say why."""

    number: int
    path: Path
    size: int = 0
    scan: ScanResult | None = None
    fault: str = ""
    detail: str = ""


def segment_numbers(directory: Path) -> list[int]:
    """The numbers of the segment files in directory, ascending."""
    found = []
    for path in directory.iterdir():
        n = segment_number(path)
        if n is not None and path.suffix == SEGMENT_SUFFIX:
            found.append(n)
    return sorted(found)


def is_torn_creation(data: bytes, number: int) -> bool:
    """A file cut short while its header was being written (empty, a prefix of the header,
    or zeros): not damage, just a roll the crash interrupted."""
    if len(data) >= FILE_HEADER_SIZE:  # a whole header is an empty segment, not a torn one
        return False
    return encode_file_header(number).startswith(data) or not any(data)


def read_segment(path: Path, number: int, data: bytes | None = None) -> SegmentFile:
    """Read and scan one segment file (or `data`, an image standing for it)."""
    seg = SegmentFile(number, path)
    try:
        if data is None:
            data = path.read_bytes()
    except OSError as e:
        seg.fault, seg.detail = UNREADABLE, e.strerror or str(e)
        return seg
    seg.size = len(data)
    if is_torn_creation(data, number):
        seg.fault, seg.detail = TORN_CREATION, f"{len(data)} bytes"
        return seg
    try:
        _, header_number = parse_file_header(data)
        if header_number != number:
            raise BadHeader(f"header names file {header_number}")
    except BadHeader as e:
        seg.fault, seg.detail = BAD_HEADER, str(e)
        return seg
    seg.scan = scan_records(data)
    return seg


def locate(
    files: Iterable[SegmentFile],
) -> tuple[dict[int, MsgLocation], dict[int, FileSummary], int]:
    """(index, file summary, duplicates) from scanned files in ascending order, as a dirty start
    builds them: every good record once, the first copy of an id wins (a later one is left by an
    interrupted compaction), one reference each."""
    index: dict[int, MsgLocation] = {}
    summary: dict[int, FileSummary] = {}
    duplicates = 0
    for seg in files:
        if seg.scan is None:
            continue
        number, valid = seg.number, 0
        for msg_id, offset, size in seg.scan.records:
            if msg_id in index:
                duplicates += 1
                continue
            index[msg_id] = MsgLocation(1, number, offset, size)
            valid += size
        summary[number] = FileSummary(valid, seg.scan.good_end)
    link_neighbours(summary)
    return index, summary, duplicates


def read_clean_snapshot(
    directory: Path, numbers: list[int]
) -> tuple[dict[int, MsgLocation], dict[int, FileSummary]]:
    """The tables of the clean-stop snapshot, if the segment files are exactly those it
    describes (same numbers, same sizes). SnapshotError if it is damaged (OSError if it cannot
    be read), StaleSnapshot if the files differ."""
    index, summary = read_snapshot(directory / SNAPSHOT)
    if sorted(summary) != numbers:
        raise StaleSnapshot("segment files differ from the snapshot")
    for number, s in summary.items():
        path = directory / segment_name(number)
        if not path.is_file() or path.stat().st_size != s.file_size:
            raise StaleSnapshot(f"{path.name} differs from the snapshot")
    return index, summary


@dataclass(slots=True)
class Damage:
    """A stretch of a file that holds no usable record."""

    file: str  # name within the store directory
    offset: int
    length: int
    what: str  # "corrupt record", "torn tail", or a SegmentFile fault


@dataclass(slots=True)
class StoreView:
    """The store as its next start would see it: where the good copy of every message is now
    (file name in the directory, offset, record size) and what is damaged."""

    clean: bool  # from the clean-stop snapshot (nothing scanned)
    locations: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    damage: list[Damage] = field(default_factory=list)
    duplicates: int = 0


def read_store(directory: Path) -> StoreView:
    """Read-only counterpart of recovery: the snapshot when a start would trust it, else a scan
    of every segment in which a complete interrupted compaction counts as redone (its moved
    records are read from the .hcmp copy, where they are until a start rewrites the file)."""
    directory = Path(directory)
    numbers = segment_numbers(directory)
    compactions = sorted(directory.glob(f"*{COMPACT_SUFFIX}"))
    if (directory / CLEAN_MARKER).exists() and not compactions:
        with contextlib.suppress(OSError, SnapshotError):
            index, _ = read_clean_snapshot(directory, numbers)
            view = StoreView(clean=True)
            view.locations = {
                msg_id: (segment_name(loc.file), loc.offset, loc.total_size)
                for msg_id, loc in index.items()
            }
            return view
    redone: dict[int, tuple[CompactionCopy, Path]] = {}
    for path in compactions:
        copy = read_compaction(path)
        if copy is not None and copy.complete and (directory / segment_name(copy.left)).exists():
            redone[copy.left] = (copy, path)
    view = StoreView(clean=False)
    files = []
    for number in numbers:
        path = directory / segment_name(number)
        image = None
        if number in redone:
            copy, _ = redone[number]
            with contextlib.suppress(OSError):
                image = path.read_bytes()[: copy.prefix_end] + copy.body
        seg = read_segment(path, number, image)
        if seg.scan is None:
            view.damage.append(Damage(path.name, 0, seg.size, f"{seg.fault}: {seg.detail}"))
            continue
        view.damage += [Damage(path.name, o, n, "corrupt record") for o, n in seg.scan.corrupt]
        if seg.scan.torn_bytes:
            view.damage.append(
                Damage(path.name, seg.scan.good_end, seg.scan.torn_bytes, "torn tail")
            )
        files.append(seg)
    index, _, view.duplicates = locate(files)
    for msg_id, loc in index.items():
        name, offset = segment_name(loc.file), loc.offset
        if loc.file in redone:
            copy, cpath = redone[loc.file]
            if offset >= copy.prefix_end:  # a moved record: still only in the copy
                name, offset = cpath.name, offset - copy.prefix_end + copy.body_offset
        view.locations[msg_id] = (name, offset, loc.total_size)
    return view
