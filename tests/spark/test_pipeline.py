"""examples/pipeline.py (`make pipeline`), run small on the tests' SparkSession, so the example
a user copies cannot rot: every event is counted once in the Parquet totals, the consumer
prints the same totals, and the backlog report reads the stopped broker's directory."""

from __future__ import annotations

import importlib.util
import re
from collections import Counter, defaultdict
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline.py"
EVENTS = 1300  # event time runs ten seconds per 100 events: three minutes


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hare_pipeline_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pipeline_example(spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = load_example()
    args = pipeline.parse_args(["--events", str(EVENTS), "--seconds", "1",
                                "--work", str(tmp_path)])
    pipeline.run(spark, args, tmp_path)
    out = capsys.readouterr().out

    # What the events add up to, per routing key and minute of event time.
    expected: dict[tuple[str, int], list[float]] = defaultdict(list)
    for key, order in pipeline.orders(EVENTS):
        expected[key, int(order["ts"]) // 60].append(float(order["amount"]))
    want = sorted((key, len(a), round(sum(a), 2)) for (key, _), a in expected.items())

    # The Parquet totals: the latest update of each key and minute counts every event once.
    latest = pipeline.latest_totals(spark.read.parquet(str(tmp_path / "out" / "totals")))
    got = sorted((r.routing_key, r.orders, r.amount) for r in latest.collect())
    assert [(k, n) for k, n, _ in got] == [(k, n) for k, n, _ in want]
    assert [a for _, _, a in got] == pytest.approx([a for _, _, a in want], abs=0.011)

    # The consumer printed each update as it came; its last one per key and minute is the same.
    printed = {}
    for minute, key, orders, amount in re.findall(
            r"totals  (\S+ \S+)  (\S+) +(\d+) orders +([\d.]+)", out):
        printed[minute, key] = (key, int(orders), float(amount))
    assert sorted(printed.values()) == got

    # The replay from the stream: every event once, offsets 0..EVENTS-1.
    feed = spark.read.parquet(str(tmp_path / "out" / "feed"))
    assert sorted(r.offset for r in feed.select("offset").collect()) == list(range(EVENTS))
    assert f"replayed {EVENTS} events from stream {pipeline.FEED!r}" in out

    # The backlog report: the stopped broker still holds the paid orders nobody consumes,
    # and the stream every event.
    assert "backlog of the stopped broker" in out
    backlog = spark.read.format("hare-store").load(str(tmp_path / "hare-data"))
    held = Counter(r.queue for r in backlog.select("queue").collect())
    paid = sum(1 for key, _ in pipeline.orders(EVENTS) if key.endswith(".paid"))
    assert held == {pipeline.AUDIT_QUEUE: paid, pipeline.FEED: EVENTS}
