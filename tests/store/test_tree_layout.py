"""broker/store/tree_layout.py on real directories: what is adopted as worker 1's, what is
left alone, and an interrupted move undone."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.store.tree_layout import ADOPTING, adopt_single_layout, tree_entries, undo_adoption


def _single(root: Path) -> Path:
    """A single process's directory as it leaves it (the lock file stays at the top)."""
    root.mkdir()
    for name in ("definitions.sqlite", "definitions.sqlite-wal", "hare.lock", "shovels.json"):
        (root / name).write_text(name)
    for name in ("queues/abc", "msg_store_persistent", "lost+found"):
        (root / name).mkdir(parents=True)
    (root / "queues" / "abc" / "journal").write_text("j")
    return root


def test_everything_but_the_lock_moves_into_w1(tmp_path: Path) -> None:
    root = _single(tmp_path / "data")
    moved = adopt_single_layout(root)
    assert moved == ["definitions.sqlite", "definitions.sqlite-wal", "msg_store_persistent",
                     "queues", "shovels.json"]
    assert sorted(p.name for p in root.iterdir()) == ["hare.lock", "lost+found", "w1"]
    assert (root / "w1" / "queues" / "abc" / "journal").read_text() == "j"
    assert tree_entries(root) == ["w1"]
    assert adopt_single_layout(root) == []  # once


@pytest.mark.parametrize("present", [[], ["meta.log"], ["w2"]])
def test_a_new_directory_or_a_tree_is_left_alone(tmp_path: Path, present: list[str]) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "hare.lock").write_text("")
    if present:
        (root / "definitions.sqlite").write_text("")  # beside a tree: not the tree's to take
    for name in present:
        (root / name).mkdir()
    before = sorted(p.name for p in root.iterdir())
    assert adopt_single_layout(root) == []
    assert sorted(p.name for p in root.iterdir()) == before


def test_an_interrupted_move_is_undone(tmp_path: Path) -> None:
    root = _single(tmp_path / "data")
    (root / ADOPTING).mkdir()
    (root / "queues").rename(root / ADOPTING / "queues")
    assert undo_adoption(root)
    assert not (root / ADOPTING).exists()
    assert (root / "queues" / "abc" / "journal").read_text() == "j"
    assert not undo_adoption(root)
    (root / ADOPTING).mkdir()
    (root / ADOPTING / "queues").mkdir()  # both sides: no rename makes that, so no guess
    with pytest.raises(OSError, match="queues is both in"):
        undo_adoption(root)
