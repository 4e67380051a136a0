"""hare-perf end to end: the quick suite against a broker, every scenario with tiny counts.

Against Hare by default (the `broker` fixture). To check the tool itself against another
broker, e.g. RabbitMQ, point it there instead (the PID is optional; it enables the RSS figures):
    HARE_PERF_TEST_URL=amqp://guest:guest@127.0.0.1:5672/ HARE_PERF_TEST_PID=$(pgrep -x beam.smp) \\
        .venv/bin/python -m pytest tests/perf/test_perf_smoke.py
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from hare_perf.report import format_report, format_table, gate_failures
from hare_perf.scenarios import SCENARIOS
from hare_perf.suite import run_suite
from tests.load_gate import within_gate

pytestmark = pytest.mark.slow

RSS_FIGURES = {"kib_per_conn", "bytes_per_msg"}
SMOKE_COUNTS = {name: 2_000 for name in SCENARIOS} | {"idle": 20, "latency": 1_000}


@dataclass
class Target:
    url: str
    pid: int | None


@pytest.fixture
def target(request: pytest.FixtureRequest) -> Target:
    url = os.environ.get("HARE_PERF_TEST_URL")
    if url:
        pid = os.environ.get("HARE_PERF_TEST_PID")
        return Target(url, int(pid) if pid else None)
    broker = request.getfixturevalue("broker")
    return Target(broker.url, broker.pid)


async def test_quick_suite_reports_every_scenario(target: Target) -> None:
    (reports,) = await run_suite(
        [target.url], [target.pid], quick=True, counts=SMOKE_COUNTS, verbose=False
    )
    print(format_table([reports]))
    assert [r.scenario for r in reports] == list(SCENARIOS)
    for report in reports:
        text = format_report(report)
        figures = [key for key, _ in SCENARIOS[report.scenario].metrics]
        # RSS growth over 20 connections or 2,000 messages is within the broker's own noise
        # (a collection can make it negative): check those figures exist, not their sign
        rss = [key for key in figures if key in RSS_FIGURES]
        for key in rss:
            assert (key in report.median) == (target.pid is not None), text
        headline = next(key for key in figures if key not in RSS_FIGURES)
        assert report.median[headline] > 0, text
        if SCENARIOS[report.scenario].duration_s:
            # a steady-state window: whatever was sent is either received or still queued
            assert report.median["received"] > 0, text
            assert report.median["backlog"] <= report.median["sent"], text
            if gate_failures([[report]]):  # again, up to two more runs (tests/load_gate.py)
                _, misses = await within_gate(target.url, target.pid, report.scenario,
                                              attempts=2, counts=SMOKE_COUNTS)
                assert not misses, text + "\n\n" + misses
            continue
        assert report.median["published"] > 0, text
        assert report.median["delivered"] == report.median["published"], text


async def test_alternating_runs_take_turns_and_merge(target: Target) -> None:
    # the same broker twice: each URL's report carries both of its runs and their medians
    reports = await run_suite([target.url, target.url], [target.pid, target.pid], quick=True,
                              runs=2, scenarios=["publish-only"], counts={"publish-only": 500},
                              alternate=True)
    for (report,) in reports:
        assert report.params["runs"] == 2 and len(report.runs) == 2
        low, high = sorted(run["msg_s"] for run in report.runs)
        assert low <= report.median["msg_s"] <= high
