"""Turning Reports into text: one scenario's figures, and the side-by-side suite table."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hare_perf.scenarios import SCENARIOS, Report

__all__ = ["format_report", "format_table", "gate_failures", "to_json"]


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def format_report(report: Report) -> str:
    scenario = SCENARIOS[report.scenario]
    p = report.params
    amount = f"duration={p['duration_s']:g}s" if p.get("duration_s") else f"count={p['count']}"
    lines = [
        f"{report.scenario}  {report.url}  {amount} size={p['size']} "
        f"runs={p['runs']}  ({scenario.doc})"
    ]
    shown = [(k, label) for k, label in scenario.metrics if k in report.median]
    extra = ("published", "delivered", "sent", "received", "client_cpu", "broker_cpu",
             "others_cpu")
    shown += [(k, k) for k in extra]
    shown = [(k, label) for k, label in shown if k in report.median]
    for key, label in shown:
        runs = " ".join(_fmt(run.get(key)) for run in report.runs)
        lines.append(f"  {label:<16}{_fmt(report.median[key]):>14}   runs: {runs}")
    return "\n".join(lines)


def format_table(reports: list[list[Report]]) -> str:
    """reports[u][s]: URL u's report for scenario s (same scenarios in the same order)."""
    if not reports or not reports[0]:
        return ""
    urls = [r[0].url for r in reports]
    head = ["scenario", "metric", *(f"[{i + 1}]" for i in range(len(urls)))]
    head += [f"[{i + 1}]/[1]" for i in range(1, len(urls))]
    rows = [head]
    for s_index, first in enumerate(reports[0]):
        for key, label in SCENARIOS[first.scenario].metrics:
            values = [r[s_index].median.get(key) if s_index < len(r) else None for r in reports]
            if all(v is None for v in values):
                continue
            row = [first.scenario, label, *(_fmt(v) for v in values)]
            for v in values[1:]:
                base = values[0]
                row.append(f"{v / base:.2f}x" if v is not None and base else "-")
            rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for n, row in enumerate(rows):
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    legend = [f"[{i + 1}] {url}" for i, url in enumerate(urls)]
    return "\n".join([*legend, "", *lines])


def gate_failures(reports: list[list[Report]]) -> list[str]:
    """What the scenarios' gates refuse in the medians, one line per broker and scenario."""
    failed = []
    for per_url in reports:
        for report in per_url:
            gate = SCENARIOS[report.scenario].gate
            reason = gate(report.median) if gate is not None else None
            if reason is not None:
                failed.append(f"{report.scenario} {report.url}: {reason}")
    return failed


def to_json(reports: list[Report]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) for r in reports]


def dumps(reports: list[Report]) -> str:
    return json.dumps(to_json(reports), indent=2)
