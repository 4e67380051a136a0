"""A plugin's own records file (shovels.json, federation.json): a handful of small JSON
records that the plugin owns, read whole at start and written whole on each change. The
node's definitions database knows no plugin, so each plugin keeps its file beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["load_records", "save_records"]


def load_records(path: Path) -> list[dict[str, Any]]:
    """The records saved at `path`; none when there is no file yet."""
    try:
        records = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    return records if isinstance(records, list) else []


def save_records(path: Path, records: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(records))
    os.replace(tmp, path)  # a crash leaves the old file or the new one, never half
