"""What a node keeps where in its data directory: the names, in one place, for the broker
(node/durable.py, cli.py), `hare-ctl verify` and the offline reader (broker.spark)."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

__all__ = [
    "DEFINITIONS",
    "LOCK_FILE",
    "MSG_STORE_PERSISTENT",
    "MSG_STORE_TRANSIENT",
    "NODE_ID",
    "QUEUES",
    "STREAMS",
    "TRANSIENT_QUEUES",
    "lock_holder",
    "node_dirs",
    "queue_dir_name",
    "worker_dir",
]

LOCK_FILE = "hare.lock"  # flock held by the running broker (cli.py)
DEFINITIONS = "definitions.sqlite"  # durable topology, users, permissions (SQLite, WAL)
QUEUES = "queues"  # queues/<queue_dir_name>/: the index of each durable queue
STREAMS = "streams"  # streams/<queue_dir_name>/: each stream queue's log (stream_log.py)
TRANSIENT_QUEUES = "transient_queues"  # page-outs of non-durable queues: wiped at every start
MSG_STORE_PERSISTENT = "msg_store_persistent"  # bodies of persistent messages, durable queues
MSG_STORE_TRANSIENT = "msg_store_transient"  # paged-out bodies: wiped at every start
NODE_ID = "node_id"  # this directory's identity in a cluster (broker/cluster)


def worker_dir(data_dir: Path, index: int) -> Path:
    """Worker `index`'s own node directory in a multi-worker server's data directory (the
    top keeps the parent's meta.log)."""
    return Path(data_dir) / f"w{index}"


def node_dirs(data_dir: Path) -> list[Path]:
    """The node directories a data directory holds: each worker's of a multi-worker tree,
    by index, else the directory itself (a single process's)."""
    found = {int(p.name[1:]): p for p in Path(data_dir).glob("w[0-9]*")
             if p.name[1:].isdigit() and p.is_dir()}
    return [found[i] for i in sorted(found)] or [Path(data_dir)]


def queue_dir_name(vhost: str, name: str) -> str:
    """The directory name of a durable queue's index: a hash, so any queue name is a safe file
    name. The definitions database maps it back (hash every queue it names)."""
    return hashlib.sha256(f"{vhost}\0{name}".encode()).hexdigest()[:32]


def lock_holder(data_dir: Path) -> str | None:
    """The pid written in the lock file if a broker holds the directory's lock, else None.
    Probes with a shared flock on a read-only descriptor: creates and writes nothing."""
    try:
        fd = os.open(Path(data_dir) / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
