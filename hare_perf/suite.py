"""python -m hare_perf.suite --url URL [--url URL2 ...] [--pid PID ...] [--quick] [--out FILE]

Runs every scenario against each URL in turn (never two brokers at once: they share the
machine's cores) and prints one table with the ratios of each URL to the first."""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import uvloop

from hare_perf.cli import DEFAULT_URL, add_duration, add_wait_quiet
from hare_perf.report import format_report, format_table, gate_failures, to_json
from hare_perf.scenarios import SCENARIOS, Report, run_scenario

__all__ = ["main", "run_suite"]


async def run_suite(
    urls: list[str],
    pids: list[int | None] | None = None,
    quick: bool = False,
    runs: int = 1,
    scenarios: list[str] | None = None,
    counts: dict[str, int] | None = None,
    verbose: bool = False,
    wait_quiet_s: float = 0.0,
    duration_s: float | None = None,
    alternate: bool = False,
) -> list[list[Report]]:
    """reports[u][s] for URL u and scenario s. `counts` overrides a scenario's count. With
    `alternate`, each scenario's runs take turns between the URLs (run 1 on every URL, then
    run 2, ...), so a shared machine's load changes land on every broker alike."""
    pids = pids or [None] * len(urls)
    names = scenarios or list(SCENARIOS)
    counts = counts or {}
    results: list[list[Report]] = [[] for _ in urls]
    for name in names if alternate else []:
        merged: list[Report] = []
        for round_ in range(max(1, runs)):
            for u, (url, pid) in enumerate(zip(urls, pids, strict=True)):
                report = await _one(url, pid, name, counts, 1, quick, wait_quiet_s, duration_s)
                if round_:
                    _merge(merged[u], report)
                else:
                    merged.append(report)
        for u, report in enumerate(merged):
            if verbose:
                print(format_report(report), flush=True)
            results[u].append(report)
    for u, (url, pid) in enumerate(zip(urls, pids, strict=True)) if not alternate else []:
        for name in names:
            report = await _one(url, pid, name, counts, runs, quick, wait_quiet_s, duration_s)
            if verbose:
                print(format_report(report), flush=True)
            results[u].append(report)
    return results


async def _one(url: str, pid: int | None, name: str, counts: dict[str, int], runs: int,
               quick: bool, wait_quiet_s: float, duration_s: float | None) -> Report:
    return await run_scenario(name, url, count=counts.get(name), runs=runs, pid=pid,
                              quick=quick, wait_quiet_s=wait_quiet_s, duration_s=duration_s)


def _merge(into: Report, more: Report) -> None:
    """`more`'s runs join `into`'s; the medians are over all of them."""
    into.runs += more.runs
    into.params["runs"] = len(into.runs)
    keys = [k for k in into.runs[0] if all(k in run for run in into.runs)]
    into.median = {k: float(statistics.median(run[k] for run in into.runs)) for k in keys}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hare_perf.suite", description=__doc__)
    parser.add_argument("--url", action="append", help=f"repeatable (default {DEFAULT_URL})")
    parser.add_argument("--pid", action="append", type=int, help="broker PID per --url")
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    parser.add_argument("--runs", type=int, default=1, help="repeat and report medians")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="repeatable")
    parser.add_argument("--out", help="also write the reports as JSON to this file")
    parser.add_argument("--alternate", action="store_true",
                        help="take turns between the URLs run by run (medians as usual)")
    add_duration(parser)
    add_wait_quiet(parser)
    args = parser.parse_args(argv)
    urls = args.url or [DEFAULT_URL]
    pids: list[int | None] = list(args.pid or [])
    if len(pids) > len(urls):
        parser.error("more --pid than --url")
    pids += [None] * (len(urls) - len(pids))
    only = [name for name in SCENARIOS if name in args.only] if args.only else None
    results = uvloop.run(
        run_suite(
            urls, pids, args.quick, args.runs, only, verbose=True, wait_quiet_s=args.wait_quiet,
            duration_s=args.duration, alternate=args.alternate,
        )
    )
    print()
    print(format_table(results))
    if args.out:
        with open(args.out, "w") as out:
            json.dump([to_json(r) for r in results], out, indent=2)
    failed = gate_failures(results)
    for line in failed:
        print(f"GATE FAILED: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
