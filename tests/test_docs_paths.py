"""The docs name real files: every path under broker/, hare_perf/, hare_bench/, tests/ or docs/
that a page of docs/ (or the README) names exists in the tree, so a move or a rename that
forgets a page fails here instead of misleading its next reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
PATH = re.compile(r"\b(?:broker|hare_perf|hare_bench|tests|docs)/[\w/.*-]*\w")


def _missing(text: str) -> list[str]:
    return sorted({p for p in PATH.findall(text)
                   if not any(ROOT.glob(p))})


@pytest.mark.parametrize("page", [p for p in PAGES if p.exists()], ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page: Path) -> None:
    missing = _missing(page.read_text())
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_a_missing_path_is_caught() -> None:
    assert _missing("see broker/queue/amqqueue.py and broker/ctl.py, hare_perf/crew.py.") == [
        "broker/ctl.py"]
