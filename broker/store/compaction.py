"""Combining two neighbouring segment files (rabbit_msg_store's GC), crash safe.

The left (elder) file receives the right file's good data. Its contiguous good prefix is never
rewritten; its scattered good data is moved down right after the prefix, then the right file's
good data is appended. Steps, each a plain function run in a worker thread:

1. `prepare`: scan both files, pick the live records (those the index still points at), write
   them to `<left>.hcmp` (header with left, right and the prefix end; the records; a commit
   record) and fsync it and the directory. Nothing else is touched yet, so a crash here leaves
   both files intact and recovery simply deletes the incomplete .hcmp.
2. `apply`: reserve the final size of the left file, overwrite it from the prefix end with the
   .hcmp records, cut it to size, fsync, delete the .hcmp. Every moved record exists in the
   .hcmp (moved-left data) or the untouched right file, so a crash mid-way loses nothing:
   recovery finds the complete .hcmp and redoes step 2 (`tidy_up`).
3. The store (on its loop) repoints the index, merges the summaries and deletes the right file.
   A crash before that leaves duplicates in the right file, which a dirty scan counts once.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from broker.store.msg_store_index import FileSummary, MsgLocation
from broker.store.segment import (
    COMPACT_SUFFIX,
    FILE_HEADER_SIZE,
    REC_COMMIT,
    RECORD_HEADER_SIZE,
    BadHeader,
    FileWriter,
    encode_file_header,
    encode_record_header,
    fsync_dir,
    parse_file_header,
    scan_records,
    segment_name,
)

__all__ = [
    "CompactionCopy",
    "CompactionPlan",
    "apply",
    "compaction_path",
    "pick_pair",
    "prepare",
    "read_compaction",
    "tidy_up",
]

_CMP_MAGIC = b"HCMP"
_CMP_EXTRA = struct.Struct(">QQ")  # right file, prefix end
_CMP_HEADER_SIZE = FILE_HEADER_SIZE + _CMP_EXTRA.size
_COMMIT = struct.Struct(">IQ")  # record count, bytes of records


def pick_pair(
    summary: dict[int, FileSummary], current: int, file_size_limit: int
) -> tuple[int, int] | None:
    """The leftmost two neighbouring files, neither current nor locked, whose live data fits in
    one file and that hold some garbage. Left first, so data keeps moving left and a message is
    rewritten a bounded number of times."""
    limit = file_size_limit - FILE_HEADER_SIZE
    for left in sorted(summary):
        ls = summary[left]
        right = ls.right
        if right is None or current in (left, right):
            continue
        rs = summary[right]
        if ls.locked or rs.locked or ls.valid_total_size + rs.valid_total_size > limit:
            continue
        holes = ls.file_size + rs.file_size - ls.valid_total_size - rs.valid_total_size
        if holes > 2 * FILE_HEADER_SIZE:  # the headers are not garbage
            return left, right
    return None


def compaction_path(directory: Path, left: int) -> Path:
    return directory / f"{left:08d}{COMPACT_SUFFIX}"


@dataclass(slots=True)
class CompactionPlan:
    left: int
    right: int
    prefix_end: int
    body: bytes  # the records to place at prefix_end in the left file
    # (msg_id, loc, old file, old offset, new offset) for every record moved
    moved: list[tuple[int, MsgLocation, int, int, int]] = field(default_factory=list)
    moving: dict[int, bytes] = field(default_factory=dict)  # moved left payloads, for reads
    lost: list[tuple[int, MsgLocation]] = field(default_factory=list)  # live but unreadable

    @property
    def final_size(self) -> int:
        return self.prefix_end + len(self.body)


def _live(index: dict[int, MsgLocation], msg_id: int, file: int, offset: int) -> MsgLocation | None:
    # Runs in a worker thread: dict.get is atomic under the GIL, and the loop thread changes a
    # location's file/offset only when committing this very compaction.
    loc = index.get(msg_id)
    if loc is not None and loc.file == file and loc.offset == offset:
        return loc
    return None


def prepare(
    directory: Path,
    left: int,
    right: int,
    index: dict[int, MsgLocation],
    writer: FileWriter,
) -> CompactionPlan:
    """Step 1: choose the records to move and make their durable copy (.hcmp)."""
    lbuf = (directory / segment_name(left)).read_bytes()
    rbuf = (directory / segment_name(right)).read_bytes()
    lscan = scan_records(lbuf)
    rscan = scan_records(rbuf)
    prefix_end = FILE_HEADER_SIZE
    in_prefix = True
    parts: list[bytes] = []
    plan = CompactionPlan(left, right, 0, b"")
    pending: list[tuple[int, MsgLocation, int, int, bytes, bool]] = []
    for msg_id, offset, size in lscan.records:
        loc = _live(index, msg_id, left, offset)
        if in_prefix and loc is not None and offset == prefix_end:
            prefix_end += size
            continue
        in_prefix = False
        if loc is not None:
            pending.append((msg_id, loc, left, offset, lbuf[offset : offset + size], True))
    for msg_id, offset, size in rscan.records:
        loc = _live(index, msg_id, right, offset)
        if loc is not None:
            pending.append((msg_id, loc, right, offset, rbuf[offset : offset + size], False))
    new_off = prefix_end
    for msg_id, loc, old_file, old_off, rec, from_left in pending:
        plan.moved.append((msg_id, loc, old_file, old_off, new_off))
        if from_left:
            plan.moving[msg_id] = rec[RECORD_HEADER_SIZE:]
        parts.append(rec)
        new_off += len(rec)
    if lscan.corrupt or lscan.torn_bytes or rscan.corrupt or rscan.torn_bytes:
        # Damaged records cannot be copied; find the live ones the scan could not see.
        seen = {(f, o) for _, _, f, o, _ in plan.moved}
        for msg_id, loc in list(index.items()):  # list(): one atomic copy under the GIL
            in_pair = loc.file == right or (loc.file == left and loc.offset >= prefix_end)
            if in_pair and (loc.file, loc.offset) not in seen:
                plan.lost.append((msg_id, loc))
    plan.prefix_end = prefix_end
    plan.body = b"".join(parts)
    _write_compaction_file(directory, plan, len(parts), writer)
    return plan


def _write_compaction_file(
    directory: Path, plan: CompactionPlan, count: int, writer: FileWriter
) -> None:
    path = compaction_path(directory, plan.left)
    head = encode_file_header(plan.left, kind=1, magic=_CMP_MAGIC) + _CMP_EXTRA.pack(
        plan.right, plan.prefix_end
    )
    commit = _COMMIT.pack(count, len(plan.body))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        writer.pwrite(fd, head, 0)
        writer.pwrite(fd, plan.body, len(head))
        writer.pwrite(fd, encode_record_header(0, commit, REC_COMMIT) + commit,
                      len(head) + len(plan.body))
        writer.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    fsync_dir(directory)


def apply(directory: Path, plan: CompactionPlan, writer: FileWriter) -> None:
    """Step 2: rewrite the left file from the prefix end, then drop the .hcmp."""
    _rewrite_left(directory / segment_name(plan.left), plan.prefix_end, plan.body, writer)
    compaction_path(directory, plan.left).unlink()
    fsync_dir(directory)


def _rewrite_left(path: Path, prefix_end: int, body: bytes, writer: FileWriter) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        writer.fallocate(fd, prefix_end + len(body))
        writer.pwrite(fd, body, prefix_end)
        os.ftruncate(fd, prefix_end + len(body))
        writer.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class CompactionCopy:
    """A .hcmp file as found: which compaction it belongs to and whether it is complete."""

    left: int
    right: int
    prefix_end: int
    body: bytes  # the records to place at prefix_end in the left file
    complete: bool  # the commit record is last and its counts match

    body_offset = _CMP_HEADER_SIZE  # where `body` starts in the .hcmp file


def read_compaction(path: Path) -> CompactionCopy | None:
    """Parse a compaction copy (read only); None if it is not one (wrong magic, too short)."""
    data = path.read_bytes()
    try:
        _, left = parse_file_header(data, magic=_CMP_MAGIC)
        right, prefix_end = _CMP_EXTRA.unpack_from(data, FILE_HEADER_SIZE)
    except (BadHeader, struct.error):
        return None
    scan = scan_records(data, _CMP_HEADER_SIZE)
    body_end = scan.commits[-1][0] if scan.commits else -1
    complete = (
        len(scan.commits) == 1
        and len(scan.commits[0][1]) == _COMMIT.size
        and not scan.corrupt
        and scan.good_end == len(data)
        and _COMMIT.unpack(scan.commits[0][1]) == (len(scan.records), body_end - _CMP_HEADER_SIZE)
    )
    body = data[_CMP_HEADER_SIZE:body_end] if complete else b""
    return CompactionCopy(left, right, prefix_end, body, complete)


def tidy_up(directory: Path, writer: FileWriter) -> list[tuple[str, str]]:
    """Finish or discard compactions a crash interrupted. Returns (file, action) pairs, action
    being "redone" (complete copy: step 2 repeated) or "discarded" (incomplete copy deleted)."""
    done: list[tuple[str, str]] = []
    for path in sorted(directory.glob(f"*{COMPACT_SUFFIX}")):
        copy = read_compaction(path)
        action = "discarded"
        if copy is not None and copy.complete:
            left_path = directory / segment_name(copy.left)
            if left_path.exists():
                _rewrite_left(left_path, copy.prefix_end, copy.body, writer)
                action = "redone"
        path.unlink()
        done.append((path.name, action))
    if done:
        fsync_dir(directory)
    return done
