"""hare-server: run the broker in the foreground (the docker way).

SIGTERM/SIGINT stop it in order: stop accepting, close clients with 320 CONNECTION_FORCED,
flush the stores, exit 0. A configuration error, a port in use, a certificate that cannot be
read or an unwritable data directory is one clear line on stderr and a non-zero exit, never a
traceback."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import sys
import time

import structlog

from broker.config import ConfigError, Settings, load_settings
from broker.logs import configure_logging
from broker.store.layout import LOCK_FILE

__all__ = ["main", "run"]

log = structlog.get_logger("hare.cli")


async def run(settings: Settings, ready: asyncio.Event | None = None,
              inherited: dict[str, list[int]] | None = None,
              direct_secret: str | None = None) -> int:
    from broker.cluster import ClusterUnavailable, NodeNameTaken
    from broker.federation import Federation
    from broker.mgmt import Management
    from broker.node import Node
    from broker.server.listener import BANNERS, ListenerError
    from broker.server.tls import TlsError
    from broker.shovel import Shovels

    node = Node(settings, inherited)
    if direct_secret is not None:  # a worker's: the same on every worker of the server
        node.auth.direct_secret = direct_secret
    node.add_plugin(Management())  # serves when a management listener is on
    node.add_plugin(Shovels())  # dynamic shovels, built in (RabbitMQ's shovel plugin)
    node.add_plugin(Federation())  # federated exchanges and queues (the federation plugin)
    try:
        await node.start()
    except (ListenerError, TlsError, NodeNameTaken, ClusterUnavailable) as exc:
        print(f"hare-server: {exc}", file=sys.stderr)
        return 1
    # a cluster node's own quorum queues elect it again after a restart: served before "listening"
    await node.cluster.settled(10.0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
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
    try:
        settings = load_settings(argv)
        _check_plugins(settings)
    except ConfigError as exc:
        print(f"hare-server: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, str(settings.log_format))
    from broker.node.supervisor import watch_parent, worker_role, worker_settings

    role = worker_role(os.environ)
    workers = 1
    if role is not None:  # a worker of a multi-worker hare-server (broker/node/supervisor.py)
        watch_parent(role.parent)
        settings = worker_settings(settings, role)
    else:
        from broker.config.cpus import usable_cpus

        workers = settings.workers or usable_cpus()
        if workers > 1 and settings.cluster_etcd:
            # a multi-worker server as one member of an etcd cluster is not built yet: its
            # workers' metadata is the parent's (docs/ARCHITECTURE.md, "Process tree")
            print("hare-server: workers > 1 cannot be combined with cluster_etcd yet; set "
                  "workers = 1 on a cluster node", file=sys.stderr)
            return 2
    problem = _check_data_dir(settings)
    lock_fd = -1
    if not problem:
        # a worker's old process may still be stopping (its parent was killed and this one
        # started at once): it is waited for, a single broker's namesake is not
        lock_fd, problem = _lock_data_dir(settings, 30.0 if role is not None else 0.0)
    if problem:
        print(f"hare-server: {problem}", file=sys.stderr)
        return 1
    try:
        import uvloop

        if workers > 1:
            from broker.node.supervisor import Supervisor

            argv = sys.argv[1:] if argv is None else argv
            return uvloop.run(Supervisor(settings, workers, argv).run())
        if role is not None:
            return uvloop.run(run(settings, inherited=role.fds,
                                  direct_secret=role.direct_secret))
        return uvloop.run(run(settings))
    except KeyboardInterrupt:
        return 0
    finally:
        os.close(lock_fd)  # the lock goes with it


if __name__ == "__main__":
    sys.exit(main())
