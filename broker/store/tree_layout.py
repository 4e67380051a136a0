"""A data directory as a single process lays it out (definitions.sqlite, queues/, the
message stores, ... at its top) or as a multi-worker server's tree (the parent's meta.log and
meta.snapshot, each worker's own directory w<i>/; docs/ARCHITECTURE.md, "Process tree"), and
the one move between them: a first multi-worker start over a single process's directory makes
it worker 1's, so the workers setting can change without losing the broker.

The move is crash-safe: every entry is renamed into `w1.adopting/` (one file system, so no
copy), and `w1.adopting/` is renamed to `w1/` last, the one step that makes it the tree's. A
kill -9 before that leaves `w1.adopting/`, which the next start of either kind moves back
first (`undo_adoption`): the directory is a single process's again, never half of each."""

from __future__ import annotations

import os
import re
from pathlib import Path

from broker.store.layout import DEFINITIONS, LOCK_FILE
from broker.store.segment import fsync_dir

__all__ = ["ADOPTING", "adopt_single_layout", "tree_entries", "undo_adoption"]

ADOPTING = "w1.adopting"
_TREE = re.compile(r"w\d+|meta\..*")  # a worker's directory, the meta server's files
_KEEP = {LOCK_FILE, ADOPTING, "lost+found"}  # held by whoever starts; a file system's own


def tree_entries(data_dir: Path) -> list[str]:
    """The names at the top of `data_dir` that belong to a worker tree (empty: none)."""
    return sorted(p.name for p in data_dir.iterdir() if _TREE.fullmatch(p.name))


def undo_adoption(data_dir: Path) -> bool:
    """Move back what an interrupted adoption had moved; whether there was one."""
    staging = data_dir / ADOPTING
    if not staging.is_dir():
        return False
    for entry in sorted(staging.iterdir()):
        if (data_dir / entry.name).exists():  # cannot come from a rename: refuse to guess
            raise OSError(f"{entry.name} is both in {data_dir} and in {staging}")
        os.rename(entry, data_dir / entry.name)
    fsync_dir(data_dir)
    staging.rmdir()
    fsync_dir(data_dir)
    return True


def adopt_single_layout(data_dir: Path) -> list[str]:
    """Make a single process's data directory worker 1's (`w1/`): the names moved, or [] when
    `data_dir` is no single process's (new, or already a tree). The caller holds its lock."""
    undo_adoption(data_dir)
    if tree_entries(data_dir) or not (data_dir / DEFINITIONS).exists():
        return []
    moved = sorted(p.name for p in data_dir.iterdir() if p.name not in _KEEP)
    staging = data_dir / ADOPTING
    staging.mkdir()
    fsync_dir(data_dir)
    for name in moved:
        os.rename(data_dir / name, staging / name)
    fsync_dir(staging)
    fsync_dir(data_dir)
    os.rename(staging, data_dir / "w1")  # the commit: from here on it is the tree's
    fsync_dir(data_dir)
    return moved
