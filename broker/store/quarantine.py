"""Messages set aside: a body whose record is found damaged when it is read (after a clean
shutdown the store trusts its snapshot, so damage inside a segment shows only then) is kept in
the store's quarantine/ folder instead of being lost without a trace:

    quarantine/msg-<msg_id, 32 hex>.rec    the record's bytes as they were read
    quarantine/msg-<msg_id, 32 hex>.json   what and where: store, queue, segment, offset, size,
                                           the checksum error, when

The store forgets the message (its queue goes on with the next one); `hare-ctl verify`, the
management API (`/api/quarantine`) and `/metrics` list and count what is here."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from broker.store.msg_store_recovery import QUARANTINE_DIR

__all__ = ["MESSAGE_PREFIX", "quarantine_record", "quarantined_messages"]

MESSAGE_PREFIX = "msg-"


def quarantine_record(
    directory: Path, msg_id: int, record: bytes, **details: Any
) -> dict[str, Any]:
    """Write a damaged record and what is known of it into `directory`/quarantine/; returns the
    description written."""
    target = directory / QUARANTINE_DIR
    target.mkdir(exist_ok=True)
    stem = f"{MESSAGE_PREFIX}{msg_id:032x}"
    meta = {
        "msg_id": f"{msg_id:032x}",
        "size": len(record),
        "quarantined_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **details,
        "file": f"{stem}.rec",
    }
    _write(target / f"{stem}.rec", record)
    _write(target / f"{stem}.json", json.dumps(meta, sort_keys=True).encode())
    return meta


def quarantined_messages(directory: Path) -> list[dict[str, Any]]:
    """The descriptions of the messages set aside in `directory`/quarantine/, by name."""
    target = directory / QUARANTINE_DIR
    if not target.is_dir():
        return []
    out = []
    for path in sorted(target.glob(f"{MESSAGE_PREFIX}*.json")):
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            meta = {"file": path.name, "error": f"unreadable description: {exc}"}
        out.append(meta)
    return out


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
