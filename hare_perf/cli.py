"""hare-perf SCENARIO --url URL [--count N] [--size B] [--runs R] [--pid PID] [--json]"""

from __future__ import annotations

import argparse
import sys

import uvloop

from hare_perf.report import dumps, format_report, gate_failures
from hare_perf.scenarios import SCENARIOS, run_scenario

__all__ = ["DEFAULT_URL", "add_duration", "add_wait_quiet", "main"]

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


def add_wait_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="before each run wait up to S seconds for other processes to go quiet "
        "(under 0.2 cores; needs --pid to tell the broker apart)",
    )


def add_duration(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="steady-state scenarios: the window in seconds (15; --quick 2)",
    )


def _parser() -> argparse.ArgumentParser:
    doc = "\n".join(f"  {name:<14}{s.doc}" for name, s in SCENARIOS.items())
    parser = argparse.ArgumentParser(
        prog="hare-perf",
        description="Measure an AMQP 0-9-1 broker.",
        epilog=f"scenarios:\n{doc}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--url", default=DEFAULT_URL, help=f"broker URL (default {DEFAULT_URL})")
    parser.add_argument("--count", type=int, help="messages (idle: connections)")
    parser.add_argument("--size", type=int, help="body bytes (at least 8: the timestamp)")
    parser.add_argument("--runs", type=int, default=1, help="repeat and report medians")
    parser.add_argument("--pid", type=int, help="broker PID, for RSS from /proc/PID/status")
    parser.add_argument("--rate", type=float, default=5000.0, help="latency: msg/s (5000)")
    parser.add_argument("--quick", action="store_true", help="small default counts")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_duration(parser)
    add_wait_quiet(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    report = uvloop.run(
        run_scenario(
            args.scenario,
            args.url,
            count=args.count,
            size=args.size,
            runs=args.runs,
            pid=args.pid,
            quick=args.quick,
            rate=args.rate,
            wait_quiet_s=args.wait_quiet,
            duration_s=args.duration,
        )
    )
    print(dumps([report]) if args.json else format_report(report))
    failed = gate_failures([[report]])
    for line in failed:
        print(f"GATE FAILED: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
