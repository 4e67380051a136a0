"""The data directory's names and the lock probe the offline tools use."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from broker.store.layout import LOCK_FILE, lock_holder, queue_dir_name


def test_lock_holder_sees_a_held_lock_and_changes_nothing(tmp_path: Path) -> None:
    assert lock_holder(tmp_path) is None
    assert not (tmp_path / LOCK_FILE).exists()  # the probe creates nothing
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"4242\n")
        assert lock_holder(tmp_path) is None  # the file alone is not a lock (kill -9 leaves it)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as broker.cli holds it
        assert lock_holder(tmp_path) == "4242"
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert lock_holder(tmp_path) is None
    finally:
        os.close(fd)


def test_queue_dir_names_are_stable_and_distinct() -> None:
    assert queue_dir_name("/", "q") == queue_dir_name("/", "q")
    assert len({queue_dir_name("/", "q"), queue_dir_name("/x", "q"), queue_dir_name("/", "qx"),
                queue_dir_name("/q", "")}) == 4
    assert all(c in "0123456789abcdef" for c in queue_dir_name("v", "ünïcode/../name"))
