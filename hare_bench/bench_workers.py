"""Figures for a multi-worker hare-server (docs/BENCHMARKS.md, "Workers"): hare-perf's
scenarios against `hare-server --workers 1` and `--workers N`, alternating, each run with the
load the machine's other processes put on it (others_cpu) beside its figure.

    python -m hare_bench.bench_workers --rounds 3 --scenario steady-4x4 --duration 15
    python -m hare_bench.bench_workers --scenario publish-only-4 \
        --extra=--queue-master-locator=balanced

Each run starts a fresh broker (a temp data dir), runs one hare-perf scenario with --pid (so
its CPU and RSS are the whole process tree's), and stops the broker."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hare_bench.server import Server, hare_server

__all__ = ["main"]


def _run(workers: int, args: argparse.Namespace, root: Path) -> dict[str, float]:
    data = root / f"w{workers}"
    shutil.rmtree(data, ignore_errors=True)
    with hare_server(data, ["--workers", str(workers), *args.extra]) as broker:
        cmd = [sys.executable, "-c", "import sys; from hare_perf.cli import main; sys.exit(main())",
               args.scenario, "--url", broker.url, "--pid", str(broker.pid), "--json"]
        if args.duration:
            cmd += ["--duration", str(args.duration)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        try:  # a steady run whose backlog grew fails hare-perf's gate: its figures still count
            median: dict[str, float] = json.loads(done.stdout[:done.stdout.rindex("]") + 1]
                                                  )[0]["median"]
        except ValueError:
            raise RuntimeError(f"hare-perf failed: {done.stderr[-1500:]}") from None
        median["gate_failed"] = float(done.returncode != 0)
        median.update(_placement(broker))
        return median


def _placement(broker: Server) -> dict[str, float]:
    """Connections the workers handed over (moved) and kept although their queues were on
    another worker (stayed), summed over the workers (/api/nodes; none for one process)."""
    rows = broker.api("/api/nodes")
    return {"moved": float(sum(r.get("connections_moved_out", 0) for r in rows)),
            "stayed": float(sum(r.get("connections_stayed", 0) for r in rows))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hare_bench.bench_workers")
    parser.add_argument("--scenario", default="steady-4x4")
    parser.add_argument("--workers", type=int, default=2, help="against --workers 1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=0.0)
    parser.add_argument("--extra", action="append", default=[],
                        help="a broker flag for both set-ups (repeat)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="hare-workers-bench-"))
    results: dict[int, list[dict[str, float]]] = {1: [], args.workers: []}
    try:
        for r in range(args.rounds):
            order = [1, args.workers] if r % 2 == 0 else [args.workers, 1]
            for n in order:
                fig = _run(n, args, root)
                results[n].append(fig)
                print(f"round {r + 1} workers={n}: msg_s={fig.get('msg_s', 0):,.0f} "
                      f"broker_cpu={fig.get('broker_cpu', 0):.2f} "
                      f"others_cpu={fig.get('others_cpu', 0):.2f} "
                      f"backlog={fig.get('backlog', 0):,.0f} "
                      f"moved={fig['moved']:.0f} stayed={fig['stayed']:.0f}"
                      f"{' (gate failed)' if fig['gate_failed'] else ''}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    one = statistics.median(x["msg_s"] for x in results[1])
    many = statistics.median(x["msg_s"] for x in results[args.workers])
    print(f"{args.scenario}: workers=1 {one:,.0f} msg/s, workers={args.workers} "
          f"{many:,.0f} msg/s: {many / one:.2f}x (medians of {args.rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
