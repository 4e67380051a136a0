"""hare-server: run the broker in the foreground (the docker way).

SIGTERM/SIGINT stop it in order: stop accepting, close clients with 320 CONNECTION_FORCED,
flush the stores, exit 0; while it is still starting, at the start's next step (the cluster
left, the stores closed, exit 0). A configuration error, a port in use, a certificate that cannot be
read or an unwritable data directory is one clear line on stderr and a non-zero exit, never a
traceback."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
import time
from typing import TYPE_CHECKING

import structlog

from broker.config import ConfigError, Settings, load_settings
from broker.logs import configure_logging
from broker.signals import Stop, note_signals, unless_stopped
from broker.store.layout import DEFINITIONS, LOCK_FILE

if TYPE_CHECKING:
    from broker.server.handover import Siblings

__all__ = ["main", "run"]

log = structlog.get_logger("hare.cli")


async def run(settings: Settings, ready: asyncio.Event | None = None,
              inherited: dict[str, list[int]] | None = None,
              direct_secret: str | None = None, siblings: Siblings | None = None) -> int:
    from broker.cluster import ClusterUnavailable, NodeNameTaken
    from broker.federation import Federation
    from broker.mgmt import Management
    from broker.node.node import Node, StartAborted
    from broker.server.listener import BANNERS, ListenerError
    from broker.server.tls import TlsError
    from broker.shovel import Shovels

    node = Node(settings, inherited, siblings)
    if direct_secret is not None:  # a worker's: the same on every worker of the server
        node.auth.direct_secret = direct_secret
    node.add_plugin(Management())  # serves when a management listener is on
    node.add_plugin(Shovels())  # dynamic shovels, built in (RabbitMQ's shovel plugin)
    node.add_plugin(Federation())  # federated exchanges and queues (the federation plugin)
    # on before the start: SIGTERM while recovering or joining stops it at its next step
    stop = Stop()
    try:
        await node.start(abort=stop.requested)
    except StartAborted:
        log.info("shutdown requested while starting")
        return 0
    except (ListenerError, TlsError, NodeNameTaken, ClusterUnavailable) as exc:
        print(f"hare-server: {exc}", file=sys.stderr)
        return 1
    # a cluster node's own quorum queues elect it again after a restart: served before "listening"
    settled, _ = await unless_stopped(stop, node.cluster.settled(10.0))
    if settled:
        # tests and supervisors read the bound ports from here when port 0 was asked for; the
        # AMQP line always comes first, then management HTTP, AMQPS, management HTTPS when on
        for listener in node.listeners:
            print(f"{BANNERS[listener.protocol]} listening on port {listener.port}", flush=True)
        if ready is not None:
            ready.set()
        await stop.wait()
    log.info("shutdown requested")
    await node.stop()
    return 0


def _check_plugins(settings: Settings) -> None:
    """What the config file holds for a plugin, judged by the plugin before anything starts:
    a bad static shovel is a configuration error like any other (exit 2)."""
    from broker.shovel.definition import check_static

    check_static(settings.shovels)


def _check_data_dir(settings: Settings) -> str | None:
    path = settings.data_dir
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"data directory {path} cannot be created: {exc.strerror}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"data directory {path} is not writable"
    return None


def _settle_layout(settings: Settings, workers: int) -> str | None:
    """The data directory as this start lays it out (broker/store/tree_layout.py), under
    its lock: a first multi-worker start makes a single process's directory worker 1's; a
    single process refuses a worker tree's (its definitions are the parent's meta.log, its
    queues spread over the workers' directories) rather than start empty beside it. Both
    side by side (a tree started there before adoption existed): each kind keeps its own."""
    from broker.store.tree_layout import adopt_single_layout, tree_entries, undo_adoption

    path = settings.data_dir
    try:
        if workers > 1:
            if moved := adopt_single_layout(path):
                log.warning("single-process data directory adopted as worker 1's",
                            data_dir=str(path), moved=moved)
            elif (path / DEFINITIONS).exists():
                log.warning("a single process's data beside the worker tree is left alone",
                            data_dir=str(path))
            return None
        undo_adoption(path)
        tree = tree_entries(path)
    except OSError as exc:
        return f"data directory {path} cannot be laid out for workers = {workers}: {exc}"
    if not tree:
        return None
    if (path / DEFINITIONS).exists():
        log.warning("a worker tree's data beside this single process's is left alone",
                    data_dir=str(path), tree=tree)
        return None
    return (f"data directory {path} holds a multi-worker server ({', '.join(tree)}); start "
            f"it with --workers 2 or more (or workers = auto), or give one process a new "
            f"data directory")


def _lock_data_dir(settings: Settings, wait_s: float = 0.0) -> tuple[int, str | None]:
    """One broker per data directory: an flock held for the life of the process (released
    by the kernel even after kill -9, so a crash never leaves a stale lock). `wait_s`: how
    long a previous holder may take to let go (a worker whose old self is still stopping)."""
    path = settings.data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        return -1, f"cannot open lock file {path}: {exc.strerror}"
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
    except OSError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        return -1, (f"data directory {settings.data_dir} is in use by another broker "
                    f"(pid {other}); refusing to start")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd, None


def main(argv: list[str] | None = None) -> int:
    note_signals()  # a SIGTERM from here on stops the start cleanly (broker/signals.py)
    try:
        settings = load_settings(argv)
        _check_plugins(settings)
    except ConfigError as exc:
        print(f"hare-server: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, str(settings.log_format))
    from broker.node.supervisor import (
        watch_parent,
        worker_role,
        worker_settings,
        worker_siblings,
    )

    role = worker_role(os.environ)
    workers = 1
    siblings = None
    if role is not None:  # a worker of a multi-worker hare-server (broker/node/supervisor.py)
        watch_parent(role.parent)
        siblings = worker_siblings(settings, role)
        settings = worker_settings(settings, role)
    else:
        from broker.config.cpus import usable_cpus

        workers = settings.workers or usable_cpus()
    problem = _check_data_dir(settings)
    lock_fd = -1
    if not problem:
        # a worker's old process may still be stopping (its parent was killed and this one
        # started at once): it is waited for, a single broker's namesake is not
        lock_fd, problem = _lock_data_dir(settings, 30.0 if role is not None else 0.0)
    if problem:
        print(f"hare-server: {problem}", file=sys.stderr)
        return 1
    if role is None and (problem := _settle_layout(settings, workers)):
        os.close(lock_fd)
        print(f"hare-server: {problem}", file=sys.stderr)
        return 2
    try:
        import uvloop

        if workers > 1:
            from broker.node.supervisor import Supervisor

            argv = sys.argv[1:] if argv is None else argv
            return uvloop.run(Supervisor(settings, workers, argv).run())
        if role is not None:
            return uvloop.run(run(settings, inherited=role.fds,
                                  direct_secret=role.direct_secret, siblings=siblings))
        return uvloop.run(run(settings))
    except KeyboardInterrupt:
        return 0
    finally:
        os.close(lock_fd)  # the lock goes with it


if __name__ == "__main__":
    sys.exit(main())
