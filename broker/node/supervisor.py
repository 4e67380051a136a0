"""The parent of a multi-worker hare-server (`workers` > 1): one broker to its clients, one
process per core inside (docs/ARCHITECTURE.md, "Process tree").

The parent serves no client. It starts the metadata service (the single authority on
definitions and membership, in place of etcd), binds and listens on every port once, and
starts N workers: `python -m broker` with the same arguments plus `_HARE_WORKER` in their
environment, each a node of a private cluster (docs/CLUSTER.md) with its own data directory
(`<data_dir>/w<i>`), accepting on the parent's sockets (inherited file descriptors). It
prints the "listening on port N" lines once every worker serves, restarts a worker that dies
(its queues recover from its data directory), and on SIGTERM stops the workers and exits 0.
A worker whose parent dies is sent SIGTERM by the kernel (PR_SET_PDEATHSIG).

With `cluster_etcd` the server is one member of that etcd cluster instead: the parent runs
no metadata service, and each worker is a node of the etcd cluster in its own right (its
card names the server, docs/CLUSTER.md "Servers")."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import structlog

from broker.cluster.meta_server import MetaServer
from broker.cluster.metadata import cluster_root, transient_keys
from broker.config import MemoryWatermark, Settings
from broker.node.node import bind_listeners
from broker.server.handover import Siblings
from broker.server.listener import BANNERS, Listener, close_all, listen_all
from broker.signals import Stop, unless_stopped
from broker.store import layout

__all__ = ["WORKER_ENV", "Supervisor", "WorkerRole", "watch_parent", "worker_role",
           "worker_settings", "worker_siblings"]

log = structlog.get_logger("hare.supervisor")

# not HARE_*: the settings loader refuses HARE_ names that are not settings
WORKER_ENV = "_HARE_WORKER"
_PR_SET_PDEATHSIG = 1
_READY = "hare-server listening on port"
_START_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 60.0
_QUICK_DEATH_S = 10.0  # a worker dying sooner than this after its start waits longer each time


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """What a worker is told by its parent, through WORKER_ENV (JSON)."""

    index: int  # 1..count
    count: int
    parent: int  # the parent's pid
    fds: dict[str, list[int]]  # protocol -> inherited listening sockets
    # the parent's meta server, and the cluster secret of this run shared by the workers
    # only; all three empty when the server is a member of an etcd cluster (cluster_etcd)
    meta_url: str
    meta_token: str
    secret: str

    def encode(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @property
    def direct_secret(self) -> str:
        """The password of the node's own AMQP clients (AccessControl.direct_secret), one for
        every worker: a shovel's or federation link's connection to this server is accepted
        by whichever worker is free, not always its own."""
        return hmac.new(self.secret.encode(), b"direct login", hashlib.sha256).hexdigest()


def worker_role(env: Mapping[str, str]) -> WorkerRole | None:
    raw = env.get(WORKER_ENV)
    if not raw:
        return None
    fields = json.loads(raw)
    return WorkerRole(**fields)


def server_name(settings: Settings) -> str:
    """The hare-server's name: its node name (the one a single process would have)."""
    return settings.node_name or f"hare@{socket.gethostname()}"


def worker_name(settings: Settings, index: int) -> str:
    return f"{server_name(settings)}-w{index}"


def worker_settings(settings: Settings, role: WorkerRole) -> Settings:
    """The parent's settings made a worker's: its own data directory and node name, the
    server's name on its card, a 1/N share of the memory watermark (each worker watches its
    own RSS, so N shares make the one watermark); a member of the parent's private cluster
    over a loopback link, or with `cluster_etcd` a node of that cluster on the link address
    the server was given, worker i on `cluster_link_port` + i - 1 (0: any free port)."""
    mark = settings.vm_memory_high_watermark
    share = (MemoryWatermark(relative=None, absolute_bytes=mark.absolute_bytes // role.count)
             if mark.absolute_bytes is not None
             else MemoryWatermark(relative=(mark.relative or 0.0) / role.count))
    settings = dataclasses.replace(
        settings,
        workers=1,
        data_dir=layout.worker_dir(settings.data_dir, role.index),
        node_name=worker_name(settings, role.index),
        cluster_server=settings.cluster_server or server_name(settings),
        vm_memory_high_watermark=share,
    )
    if not role.meta_url:
        port = settings.cluster_link_port
        return dataclasses.replace(settings, cluster_link_port=port and port + role.index - 1)
    return dataclasses.replace(
        settings,
        cluster_etcd=role.meta_url,
        cluster_etcd_token=role.meta_token,
        cluster_secret=role.secret,
        cluster_link_host="127.0.0.1",
        cluster_link_port=0,
        cluster_link_advertise="127.0.0.1",
        # the workers share one machine and one disk: a copy on another worker survives
        # nothing the first would not, so a quorum queue is one member, as on one node
        # (x-quorum-initial-group-size still asks for more)
        quorum_initial_group_size=1,
    )


def worker_siblings(settings: Settings, role: WorkerRole) -> Siblings:
    """The server's workers as connection placement knows them (broker/server/handover.py),
    from the parent's settings: their node names, and the parent whose pid names their
    handover sockets."""
    names = tuple(worker_name(settings, i) for i in range(1, role.count + 1))
    return Siblings(role.index, names, role.parent)


def watch_parent(parent: int) -> None:
    """Be sent SIGTERM (a clean stop) when the parent dies, even by kill -9; if it died
    before this call, stop now."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


async def start_meta(data_dir: Path, cluster_name: str) -> MetaServer:
    """The metadata service of this process tree: the parent's own (meta_server.py, etcd's
    JSON gateway subset on loopback, behind a token), its log in <data_dir>/meta.log, so the
    durable definitions and the workers' names outlive a restart of the whole server; the
    non-durable ones (exchanges, queues, their bindings) go, as a single process's do. A
    worker's restart does not touch them: the server was up."""
    return await MetaServer.start(
        data_dir, forget=partial(transient_keys, cluster_root(cluster_name)))


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: asyncio.subprocess.Process | None = None
        self.started = 0.0
        self.delay = 0.5
        self.drain: asyncio.Task[None] | None = None


class Supervisor:
    def __init__(self, settings: Settings, count: int, argv: list[str]) -> None:
        self.settings = settings
        self.count = count
        self.argv = argv
        self.secret = secrets.token_hex(16)
        self.workers = [_Worker(i) for i in range(1, count + 1)]
        self.listeners: list[Listener] = []
        self.meta: MetaServer | None = None
        self.stopping = False

    async def run(self) -> int:
        stop = Stop()
        loop = asyncio.get_running_loop()
        try:
            self.listeners = bind_listeners(self.settings)
            listen_all(self.listeners)
            if not self.settings.cluster_etcd:  # else the workers are nodes of that cluster
                self.meta = await start_meta(self.settings.data_dir,
                                               self.settings.cluster_name)
            # SIGTERM while the workers start: each is sent SIGTERM at once, which stops its
            # own start at its next step (broker/cli.py), instead of waiting for them to serve
            started, _ = await unless_stopped(stop, self._start_workers())
        except Exception as exc:  # a worker or the meta service that did not start
            print(f"hare-server: {exc}", file=sys.stderr)
            await self._stop_all()
            return 1
        if not started:
            log.info("shutdown requested while starting")
            self.stopping = True
            await self._stop_all()
            return 0
        for listener in self.listeners:
            print(f"{BANNERS[listener.protocol]} listening on port {listener.port}",
                  flush=True)
        log.info("workers serving", workers=self.count,
                 pids=[w.proc.pid for w in self.workers if w.proc])
        watches = [loop.create_task(self._watch(w)) for w in self.workers]
        await stop.wait()
        log.info("shutdown requested")
        self.stopping = True
        for task in watches:
            task.cancel()
        await self._stop_all()
        return 0

    async def _start_workers(self) -> None:
        # the first worker alone seeds the empty metadata with its definitions
        await self._start(self.workers[0])
        await asyncio.gather(*(self._start(w) for w in self.workers[1:]))

    def _role(self, worker: _Worker) -> WorkerRole:
        fds = {x.protocol: [s.fileno() for s in x.sockets] for x in self.listeners}
        if self.meta is None:  # nodes of the etcd cluster, with the server's own secret
            return WorkerRole(worker.index, self.count, os.getpid(), fds, "", "", "")
        return WorkerRole(worker.index, self.count, os.getpid(), fds, self.meta.url,
                          self.meta.token, self.secret)

    async def _start(self, worker: _Worker) -> None:
        """Start the worker and wait for its "listening" line: then it serves."""
        role = self._role(worker)
        env = {**os.environ, WORKER_ENV: role.encode()}
        worker.proc = proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker", *self.argv, env=env,
            stdout=asyncio.subprocess.PIPE,
            pass_fds=[fd for fds in role.fds.values() for fd in fds],
            # a process group of its own: a terminal's Ctrl-C goes to the parent alone, which
            # stops the workers in order (in the parent's group they would stop first and look
            # like crashes). The parent's session, not a new one: the kernel's autogroup
            # shares CPU between sessions, and a worker in a session of its own took a core's
            # share against the clients of the same machine (its consumers, starved, fell
            # behind; under load it was ahead of a one-process broker for the wrong reason).
            # uvloop takes no process_group argument; setpgrp alone is safe after fork.
            preexec_fn=os.setpgrp)
        worker.started = time.monotonic()
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(_START_TIMEOUT_S):
                while True:
                    line = (await proc.stdout.readline()).decode()
                    if not line:
                        raise RuntimeError(f"worker {worker.index} exited at start "
                                           f"(code {await proc.wait()})")
                    if line.startswith(_READY):
                        break
        except TimeoutError:
            raise RuntimeError(f"worker {worker.index} did not start in "
                               f"{_START_TIMEOUT_S:.0f} s") from None
        # its other lines (the other listeners) are read and dropped, so the pipe never fills
        worker.drain = asyncio.get_running_loop().create_task(self._drain(proc))

    @staticmethod
    async def _drain(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while await proc.stdout.readline():
            pass

    async def _watch(self, worker: _Worker) -> None:
        """Restart the worker whenever it exits while the broker runs: it recovers its
        queues from its data directory and rejoins under its name."""
        while True:
            assert worker.proc is not None
            code = await worker.proc.wait()
            if self.stopping:
                return
            lived = time.monotonic() - worker.started
            worker.delay = min(worker.delay * 2, 10.0) if lived < _QUICK_DEATH_S else 0.5
            log.warning("worker exited; restarting", worker=worker.index, code=code,
                        lived_s=round(lived, 1), delay_s=worker.delay)
            await asyncio.sleep(worker.delay)
            try:
                await self._start(worker)
                log.info("worker restarted", worker=worker.index, pid=worker.proc.pid)
            except RuntimeError as exc:
                log.error("worker restart failed", worker=worker.index, error=str(exc))

    async def _stop_all(self) -> None:
        """SIGTERM to every worker (each stops cleanly: clients closed, stores flushed),
        SIGKILL to any still running after the timeout; then the meta service."""
        procs = [w.proc for w in self.workers if w.proc and w.proc.returncode is None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                async with asyncio.timeout(_STOP_TIMEOUT_S):
                    await proc.wait()
            except TimeoutError:
                log.error("worker did not stop; killing it", pid=proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for w in self.workers:
            if w.drain is not None:
                w.drain.cancel()
        close_all(self.listeners)
        if self.meta is not None:
            await self.meta.close()
