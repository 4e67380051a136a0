"""The nemesis run (guarantee 5 of issue 21): a publisher with confirms and an acking consumer
on each of three nodes, all on one quorum queue, while a loop kills (-9), restarts, stops
cleanly and pauses (SIGSTOP past the lease) nodes at random, one at a time, for a bounded
time. Then every node runs again, the consumers drain the queue, and the checker says how many
confirmed messages were lost (the bar: 0), delivered twice (redeliveries after a failover,
counted) and reordered.

    .venv/bin/python -m tests.cluster.nemesis --seconds 600     # `make nemesis`

A short run is a test (tests/cluster/test_quorum.py)."""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .test_quorum import Trio

from .helpers import wait_for
from .quorum_clients import Consumer, Publisher, Verdict, check


def _disturb(trio: Trio, rng: random.Random, lease_s: float, log: list[str]) -> None:
    node = rng.choice(list(trio.nodes.values()))
    action = rng.choice(("kill", "kill", "pause", "restart", "calm"))
    started = time.monotonic()
    if action == "kill":
        node.kill()
        time.sleep(rng.uniform(0.5, 2 * lease_s))
        node.start(timeout=60)
    elif action == "pause":
        os.kill(node.pid, signal.SIGSTOP)
        time.sleep(rng.uniform(0.5, 2.5 * lease_s))
        os.kill(node.pid, signal.SIGCONT)
    elif action == "restart":
        node.stop()
        node.start(timeout=60)
    else:
        time.sleep(rng.uniform(0.5, lease_s))
    log.append(f"{action} {node.name} {time.monotonic() - started:.1f}s")
    time.sleep(rng.uniform(0.2, 1.0))


def run_nemesis(trio: Trio, name: str, *, seconds: float, seed: int,
                out: list[str] | None = None) -> Verdict:
    from .test_quorum import LEASE_S, declare, url

    rng = random.Random(seed)
    actions: list[str] = [] if out is None else out
    actions.append(f"seed {seed}")
    nodes = list(trio.nodes.values())
    declare(nodes[0], name)
    publishers = [Publisher(lambda n=n: url(n), name, n.name) for n in nodes]
    consumers = [Consumer(lambda n=n: url(n), name, f"consumer-{n.name}") for n in nodes]
    for t in (*publishers, *consumers):
        t.start()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            _disturb(trio, rng, LEASE_S, actions)
    finally:
        trio.heal()
    # everything running: a little more traffic, then the publishers stop and the consumers
    # drain what is left
    count = sum(len(p.confirmed) for p in publishers)
    wait_for(lambda: sum(len(p.confirmed) for p in publishers) > count + 30, 120,
               "publishing after the nemesis")
    for p in publishers:
        p.stop()
    for p in publishers:
        p.join(30)
    try:
        wait_for(lambda: not check(publishers, consumers).lost, 120,
                   "every confirmed message delivered")
    except AssertionError:
        pass  # the verdict says what is missing
    for c in consumers:
        c.stop()
    for c in consumers:
        c.join(30)
    verdict = check(publishers, consumers)
    actions.append(verdict.line() + f"; consumer cancels {sum(c.cancels for c in consumers)}"
                   f", publishes refused {sum(p.refused for p in publishers)}")
    return verdict


def main(argv: list[str] | None = None) -> int:
    from .helpers import EtcdProc
    from .test_quorum import Trio, _running, wait_for

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hare-nemesis-") as tmp:
        root = Path(tmp)
        (root / "etcd").mkdir()
        etcd = EtcdProc(root / "etcd").start()
        trio = Trio(root, etcd)
        try:
            for n in trio.nodes.values():
                n.start()
            wait_for(lambda: all(_running(n) == 3 for n in trio.nodes.values()), timeout=60,
                     what="three nodes up")
            out: list[str] = []
            started = time.monotonic()
            verdict = run_nemesis(trio, "nemesis", seconds=args.seconds, seed=args.seed,
                                  out=out)
            for line in out:
                print(line)
            kinds: dict[str, int] = {}
            for line in out[1:-1]:
                kinds[line.split()[0]] = kinds.get(line.split()[0], 0) + 1
            print(f"ran {time.monotonic() - started:.0f}s; disturbances: {kinds}")
        finally:
            for n in trio.nodes.values():
                if n.proc is not None:
                    os.kill(n.pid, signal.SIGCONT)
                    n.kill()
            etcd.stop()
    return 0 if not verdict.lost else 1


if __name__ == "__main__":
    sys.exit(main())
