"""A private etcd (temp dir, free ports) and Hare nodes joined to it, for the cluster tests."""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, held_port, worker_share
from tests.mgmt.helpers import MgmtBroker

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class EtcdProc:
    """One etcd member on loopback; stop/start keep its data and ports."""

    token = ""  # what the nodes must send (the meta server's)

    def __init__(self, root: Path) -> None:
        self.root = root
        self.client_port = held_port(self)  # kept across stop/start
        self.peer_port = held_port(self)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 20.0) -> EtcdProc:
        if not Path(ETCD).exists():
            pytest.skip("etcd is not installed (Debian's etcd-server)")
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.root / "etcd.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [ETCD, "--name", "test", "--data-dir", str(self.root / "etcd"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"test={peer}", "--log-level", "warn"],
            stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("etcd did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


_META = """
import asyncio, sys
from broker.cluster.meta_server import MetaServer
from broker.logs import configure_logging
configure_logging("info", "console")  # to stderr: stdout only says where it serves
async def main():
    server = await MetaServer.start(sys.argv[1], port=int(sys.argv[2]), token=sys.argv[3])
    print("serving", server.url, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


class MetaProc(EtcdProc):
    """The parent's meta server (broker/cluster/meta_server.py) in a process of its own, in
    etcd's place: same port and token across stop/start, as an etcd keeps its URL."""

    def __init__(self, root: Path, *, file_size_limit: int = 0) -> None:
        super().__init__(root)
        self.token = uuid.uuid4().hex
        self.file_size_limit = file_size_limit  # RLIMIT_FSIZE: a disk that fails writes

    def _limits(self) -> None:
        if self.file_size_limit:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG from write() instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_size_limit,) * 2)

    def start(self, timeout: float = 20.0) -> MetaProc:
        log = open(self.root / "meta.log.txt", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _META, str(self.root / "meta"), str(self.client_port),
             self.token], stdout=subprocess.PIPE, stderr=log, cwd=ROOT,
            preexec_fn=self._limits)
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:  # the line comes after the log's own lines
            line = self.proc.stdout.readline()
            if line.startswith(b"serving "):
                self.proc.stdout.close()
                return self
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError("the meta server did not start")


def metadata_store(root: Path) -> EtcdProc:
    """The cluster tests' metadata store: a private etcd, or the meta server when
    HARE_TEST_METADATA=meta (the tests are the same: both speak etcd's gateway)."""
    if os.environ.get("HARE_TEST_METADATA", "etcd") == "meta":
        return MetaProc(root)
    return EtcdProc(root)


class ClusterNode(MgmtBroker):
    """A Hare node of cluster `cluster` on `etcd`, management on a free port."""

    def __init__(self, data_dir: Path, etcd: EtcdProc, cluster: str, name: str,
                 args: list[str] | None = None) -> None:
        super().__init__(data_dir, ["--cluster-etcd", etcd.url, "--cluster-name", cluster,
                                    "--node-name", name, "--cluster-lease-ttl-s", "3",
                                    "--cluster-secret", "test-secret",
                                    "--cluster-link-host", "127.0.0.1",
                                    "--cluster-link-port", "0", *(args or [])])
        if etcd.token:
            self.env = {"HARE_CLUSTER_ETCD_TOKEN": etcd.token}
        self.name = name


@contextlib.contextmanager
def node_pair(root: Path, etcd: EtcdProc, cluster: str
              ) -> Iterator[tuple[ClusterNode, ClusterNode]]:
    """Nodes `<cluster>-a` and `<cluster>-b` of `cluster`, started, and stopped after."""
    a = ClusterNode(root / "a", etcd, cluster, f"{cluster}-a").start()
    try:
        b = ClusterNode(root / "b", etcd, cluster, f"{cluster}-b").start()
        try:
            yield a, b
        finally:
            b.stop()
    finally:
        a.stop()


def wait_for(check, timeout: float = 10.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll `check()` until it returns something true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def ctl(node: MgmtBroker, *args: str) -> subprocess.CompletedProcess[str]:
    """hare-ctl against `node`'s management API."""
    env = {**os.environ, "HARE_MANAGEMENT_URL": node.http}
    return subprocess.run([sys.executable, "-m", "broker.ctl", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=30)


def free_base() -> int:
    """A base port whose etcd, AMQP, management and link ports are all free now, every one
    below the kernel's ephemeral range (32768 and up): there, any other test's free port or
    outgoing connection could take one between this check and the node's bind. Each xdist
    worker draws from its own slice, so two clusters of a parallel run never overlap."""
    for _ in range(50):
        base = random.choice(worker_share(3000, 12000))  # link ports 23000..32001
        ports = [base - 2, base - 1, base, base + 1, 10000 + base, 10001 + base,
                 20000 + base, 20001 + base]
        try:
            for port in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")
