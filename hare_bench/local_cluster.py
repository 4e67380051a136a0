"""A Hare cluster on this machine: a private etcd and N nodes on consecutive ports, for
`make cluster` and the cluster benchmarks (bench_cluster.py).

    python -m hare_bench.local_cluster --nodes 3 --port 5700

Node i (1..N) is hare-i: AMQP on port+i-1, management on 10000+port+i-1, the link on
20000+port+i-1; etcd's client port is port-1 (peer port-2). Data lives in --dir (a temp dir
by default, removed at exit). Ctrl-C stops the nodes, then etcd."""

from __future__ import annotations

import argparse
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

__all__ = ["DevCluster", "main"]


class DevCluster:
    def __init__(self, root: Path, nodes: int, port: int, *, cluster: str = "dev",
                 extra: list[str] | None = None) -> None:
        self.root = root
        self.count = nodes
        self.port = port
        self.cluster = cluster
        self.extra = list(extra or [])
        self.secret = secrets.token_hex(16)
        self.etcd: subprocess.Popen[bytes] | None = None
        self.nodes: list[subprocess.Popen[bytes]] = []

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.port - 1}"

    def amqp_url(self, i: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port + i}/"

    def start_etcd(self) -> None:
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        peer = f"http://127.0.0.1:{self.port - 2}"
        log = open(self.root / "etcd.log", "ab")  # noqa: SIM115 - owned by the process
        self.etcd = subprocess.Popen(
            [etcd, "--name", "dev", "--data-dir", str(self.root / "etcd"),
             "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"dev={peer}", "--log-level", "warn"],
            stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.etcd_url + "/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"etcd did not start; see {self.root / 'etcd.log'}")

    def start_node(self, i: int) -> subprocess.Popen[bytes]:
        data = self.root / f"hare-{i + 1}"
        data.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"hare-{i + 1}.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "--data-dir", str(data),
             "--port", str(self.port + i), "--management-port", str(10000 + self.port + i),
             "--cluster-etcd", self.etcd_url, "--cluster-name", self.cluster,
             "--node-name", f"hare-{i + 1}", "--cluster-secret", self.secret,
             "--cluster-link-host", "127.0.0.1",
             "--cluster-link-port", str(20000 + self.port + i), *self.extra],
            stdout=subprocess.PIPE, stderr=log)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if "listening" not in line:
            proc.kill()
            raise RuntimeError(f"hare-{i + 1} did not start; see {self.root}/hare-{i + 1}.log")
        return proc

    def start(self) -> DevCluster:
        self.start_etcd()
        self.nodes = [self.start_node(i) for i in range(self.count)]
        return self

    def stop(self) -> None:
        for proc in self.nodes:
            proc.send_signal(signal.SIGTERM)
        for proc in self.nodes:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.nodes = []
        if self.etcd is not None:
            self.etcd.terminate()
            self.etcd.wait(10)
            self.etcd = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hare_bench.local_cluster",
                                     description="etcd and N Hare nodes on this machine")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--port", type=int, default=5672, help="AMQP port of hare-1")
    parser.add_argument("--dir", help="data directory (default: a temp dir, removed at exit)")
    args = parser.parse_args(argv)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hare-cluster-"))
    root.mkdir(parents=True, exist_ok=True)
    cluster = DevCluster(root, args.nodes, args.port)
    try:
        cluster.start()
        print(f"etcd {cluster.etcd_url}; logs and data in {root}")
        for i in range(args.nodes):
            print(f"hare-{i + 1}: {cluster.amqp_url(i)}  management "
                  f"http://127.0.0.1:{10000 + args.port + i}/  (pid {cluster.nodes[i].pid})")
        print("Ctrl-C stops the cluster", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
