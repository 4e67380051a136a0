"""The scenario table and the scenarios. Each declares its queues and exchanges on a control
connection, starts publisher and consumer processes, lines them up (all ready, then go),
collects their timings, and deletes what it declared (hare_perf/crew.py).

A run returns flat figures (floats); `run_scenario` repeats it and keeps the medians."""

from __future__ import annotations

import asyncio
import statistics
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hare_perf.client import BrokerClosed
from hare_perf.crew import Control, Crew, with_control
from hare_perf.host import cpu_snapshot, others_busy, settled_rss, wait_quiet
from hare_perf.wire import parse_url
from hare_perf.workers import (
    ConsumerSpec,
    IdleSpec,
    PublisherSpec,
    consumer_main,
    idle_main,
    publisher_main,
)

__all__ = ["SCENARIOS", "Params", "Report", "Scenario", "run_scenario"]



@dataclass(slots=True)
class Params:
    url: str
    count: int
    size: int
    pid: int | None = None
    rate: float = 5000.0
    connections: int = 800
    duration_s: float = 0.0  # steady-state scenarios: the measuring window

    @property
    def timeout_s(self) -> float:
        # bounded, yet generous for a slow broker: a minute plus 1 ms per message
        return 60.0 + self.count / 1000.0 + self.duration_s


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    doc: str
    run: Callable[[Params], Awaitable[dict[str, float]]]
    count: int  # default message count (for idle: connections)
    size: int
    quick_count: int
    metrics: tuple[tuple[str, str], ...]  # (key, label) shown in tables; the first is headline
    duration_s: float = 0.0  # steady state: a fixed window instead of a message count
    quick_duration_s: float = 0.0
    gate: Callable[[dict[str, float]], str | None] | None = None  # what a run must not show


@dataclass(slots=True)
class Report:
    scenario: str
    url: str
    params: dict[str, Any]
    runs: list[dict[str, float]] = field(default_factory=list)
    median: dict[str, float] = field(default_factory=dict)


# -- figures ------------------------------------------------------------------------------
def _rate(count: int, t0: int, t1: int) -> float:
    return count / max(t1 - t0, 1) * 1e9


def _latency(blobs: list[bytes]) -> dict[str, float]:
    values = array("q")
    for blob in blobs:
        values.frombytes(blob)
    if not values:
        return {}
    ordered = sorted(values)
    last = len(ordered) - 1

    def pick(q: float) -> float:
        return ordered[round(q * last)] / 1e6

    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": ordered[-1] / 1e6}


def _cpu(*results: dict[str, Any]) -> dict[str, float]:
    """The busiest load process's CPU share of one core over the run: near 1.0 would mean
    hare-perf, not the broker, set the pace."""
    return {"client_cpu": max(r["cpu_share"] for r in results)}


def _publisher(p: Params, exchange: str, keys: list[str], **kw: Any) -> PublisherSpec:
    return PublisherSpec(p.url, exchange, keys, p.count, p.size, p.timeout_s, **kw)


async def _fill(crew: Crew, p: Params, queue: str) -> dict[str, Any]:
    """Publish p.count messages to `queue` and wait until the broker holds them all."""
    pub = crew.start(publisher_main, _publisher(p, "", [queue], wait_queue=queue), "filler")
    await crew.ready([pub])
    crew.go([pub])
    return await crew.result(pub)


# -- the scenarios ------------------------------------------------------------------------
async def publish_only(p: Params) -> dict[str, float]:
    async def body(ctl: Control, crew: Crew) -> dict[str, float]:
        queue = await ctl.queue()
        r = await _fill(crew, p, queue)
        return {
            **_cpu(r),
            "msg_s": _rate(p.count, r["t_start"], r["t_done"]),
            "write_msg_s": _rate(p.count, r["t_start"], r["t_written"]),
            "published": p.count,
            "delivered": float(await ctl.depth(queue)),
        }

    return await with_control(p.url, p.timeout_s, "publish-only", body)


async def publish_only_4(p: Params) -> dict[str, float]:
    """publish-only with 4 publishers, each a process and a connection of its own, each to
    a queue of its own: p.count messages each; the rate is all of them over the first
    publisher's start to the last one's round trip (a broker using several cores shows)."""

    async def body(ctl: Control, crew: Crew) -> dict[str, float]:
        names = [await ctl.queue(f"q{i}") for i in range(4)]
        pubs = [crew.start(publisher_main, _publisher(p, "", [name], wait_queue=name),
                           f"publisher-{i}") for i, name in enumerate(names)]
        await crew.ready(pubs)
        crew.go(pubs)
        rs = [await crew.result(x) for x in pubs]
        t0 = min(r["t_start"] for r in rs)
        return {
            **_cpu(*rs),
            "msg_s": _rate(4 * p.count, t0, max(r["t_done"] for r in rs)),
            "write_msg_s": _rate(4 * p.count, t0, max(r["t_written"] for r in rs)),
            "published": 4 * p.count,
            "delivered": float(sum(await _depths(ctl, names))),
        }

    return await with_control(p.url, p.timeout_s, "publish-only-4", body)


async def drain(p: Params) -> dict[str, float]:
    async def body(ctl: Control, crew: Crew) -> dict[str, float]:
        queue = await ctl.queue()
        await _fill(crew, p, queue)
        # timestamps off: a backlog's age says nothing about the broker
        spec = ConsumerSpec(
            p.url, [queue], [p.count], p.timeout_s, consume_on_go=True, timestamps=False
        )
        con = crew.start(consumer_main, spec, "consumer")
        await crew.ready([con])
        crew.go([con])
        r = await crew.result(con)
        return {
            **_cpu(r),
            "msg_s": _rate(r["delivered"], r["t_go"], r["t_last"]),
            "published": p.count,
            "delivered": r["delivered"],
        }

    return await with_control(p.url, p.timeout_s, "drain", body)


async def _pubsub(p: Params, scenario: str, rate: float) -> dict[str, float]:
    async def body(ctl: Control, crew: Crew) -> dict[str, float]:
        queue = await ctl.queue()
        con = crew.start(
            consumer_main, ConsumerSpec(p.url, [queue], [p.count], p.timeout_s), "consumer"
        )
        pub = crew.start(publisher_main, _publisher(p, "", [queue], rate=rate), "publisher")
        await crew.ready()
        crew.go()
        rp = await crew.result(pub)
        rc = await crew.result(con)
        return {
            **_cpu(rp, rc),
            "msg_s": _rate(rc["delivered"], rp["t_start"], rc["t_last"]),
            **_latency([rc["latencies_ns"]]),
            "published": rp["published"],
            "delivered": rc["delivered"],
        }

    return await with_control(p.url, p.timeout_s, scenario, body)


async def pubsub(p: Params) -> dict[str, float]:
    return await _pubsub(p, "pubsub", 0.0)


async def latency(p: Params) -> dict[str, float]:
    return await _pubsub(p, "latency", p.rate)


_TOPIC_QUEUES = 50
_TOPIC_GROUPS = 5  # queue i is bound to group i % 5, so each message reaches 10 queues


async def topic(p: Params) -> dict[str, float]:
    async def body(ctl: Control, crew: Crew) -> dict[str, float]:
        exchange = await ctl.exchange("topic")
        queues = [await ctl.queue(f"q{i}") for i in range(_TOPIC_QUEUES)]
        for i, queue in enumerate(queues):
            # wildcard bindings (* and #): the broker's topic matching is part of the cost
            await ctl.bind(queue, exchange, f"*.g{i % _TOPIC_GROUPS}.#")
        keys = [f"perf.g{g}.tick" for g in range(_TOPIC_GROUPS)]
        per_group = [
            p.count // _TOPIC_GROUPS + (1 if g < p.count % _TOPIC_GROUPS else 0)
            for g in range(_TOPIC_GROUPS)
        ]
        expected = [per_group[i % _TOPIC_GROUPS] for i in range(_TOPIC_QUEUES)]
        con = crew.start(
            consumer_main, ConsumerSpec(p.url, queues, expected, p.timeout_s), "consumers"
        )
        pub = crew.start(publisher_main, _publisher(p, exchange, keys), "publisher")
        await crew.ready()
        crew.go()
        rp = await crew.result(pub)
        rc = await crew.result(con)
        return {
            **_cpu(rp, rc),
            "msg_s": _rate(rc["delivered"], rp["t_start"], rc["t_last"]),
            **_latency([rc["latencies_ns"]]),
            # deliveries expected: each message reaches 10 queues
            "published": rp["published"] * (_TOPIC_QUEUES // _TOPIC_GROUPS),
            "delivered": rc["delivered"],
        }

    return await with_control(p.url, p.timeout_s, "topic", body)


async def idle_connections(p: Params) -> dict[str, float]:
    async def body(ctl: Control, crew: Crew) -> dict[str, float]:
        before = await settled_rss(p.pid) if p.pid else 0
        idle = crew.start(idle_main, IdleSpec(p.url, p.connections, p.timeout_s), "idle")
        (info,) = await crew.ready([idle])
        after = await settled_rss(p.pid) if p.pid else 0
        crew.go([idle])
        r = await crew.result(idle)
        figures = {
            "conn_s": _rate(r["opened"], info["t0"], info["t_open"]),
            "published": float(p.connections),
            "delivered": float(r["alive"]),
        }
        if p.pid:
            figures = {"kib_per_conn": (after - before) / p.connections, **figures}
        return figures

    return await with_control(p.url, p.timeout_s, "idle", body)


async def persistent_confirms(p: Params) -> dict[str, float]:
    async def body(ctl: Control, crew: Crew) -> dict[str, float]:
        queue = await ctl.queue(durable=True)
        spec = _publisher(p, "", [queue], persistent=True, confirms=True, max_inflight=1000)
        pub = crew.start(publisher_main, spec, "publisher")
        await crew.ready([pub])
        crew.go([pub])
        r = await crew.result(pub)
        return {
            **_cpu(r),
            "msg_s": _rate(p.count, r["t_start"], r["t_done"]),
            "published": p.count,
            "delivered": float(r["confirmed"]),
        }

    return await with_control(p.url, p.timeout_s, "persistent", body)


async def backlog_memory(p: Params) -> dict[str, float]:
    async def body(ctl: Control, crew: Crew) -> dict[str, float]:
        queue = await ctl.queue()
        before = await settled_rss(p.pid) if p.pid else 0
        r = await _fill(crew, p, queue)
        after = await settled_rss(p.pid) if p.pid else 0
        spec = ConsumerSpec(
            p.url, [queue], [p.count], p.timeout_s, consume_on_go=True, timestamps=False
        )
        con = crew.start(consumer_main, spec, "consumer")
        await crew.ready([con])
        crew.go([con])
        rc = await crew.result(con)
        figures = {
            **_cpu(r, rc),
            "publish_msg_s": _rate(p.count, r["t_start"], r["t_done"]),
            "drain_s": (rc["t_last"] - rc["t_go"]) / 1e9,
            "drain_msg_s": _rate(rc["delivered"], rc["t_go"], rc["t_last"]),
            "published": p.count,
            "delivered": rc["delivered"],
        }
        if p.pid:
            figures = {"bytes_per_msg": (after - before) * 1024 / p.count, **figures}
        return figures

    return await with_control(p.url, p.timeout_s, "backlog", body)


async def stream(p: Params) -> dict[str, float]:
    """A stream queue: publish with confirms (1000 in flight), the broker's RSS holding it,
    then one consumer replaying it from the first offset (prefetch 1000, ack every 500)."""
    async def body(ctl: Control, crew: Crew) -> dict[str, float]:
        queue = await ctl.stream()
        before = await settled_rss(p.pid) if p.pid else 0
        spec = _publisher(p, "", [queue], persistent=True, confirms=True, max_inflight=1000)
        pub = crew.start(publisher_main, spec, "publisher")
        await crew.ready([pub])
        crew.go([pub])
        r = await crew.result(pub)
        held = await settled_rss(p.pid) if p.pid else 0
        con = crew.start(consumer_main, ConsumerSpec(
            p.url, [queue], [p.count], p.timeout_s, ack_every=500, consume_on_go=True,
            timestamps=False, arguments={"x-stream-offset": "first"}), "consumer")
        await crew.ready([con])
        crew.go([con])
        rc = await crew.result(con)
        figures = {
            **_cpu(r, rc),
            "publish_msg_s": _rate(p.count, r["t_start"], r["t_done"]),
            "replay_msg_s": _rate(rc["delivered"], rc["t_go"], rc["t_last"]),
            "published": p.count,
            "delivered": rc["delivered"],
        }
        if p.pid:
            figures = {**figures, "rss_mib": held / 1024, "rss_growth_mib": (held - before) / 1024}
        return figures

    return await with_control(p.url, p.timeout_s, "stream", body)


_NO_END = 1 << 62  # a steady consumer's "expected": it stops at the window's end instead


def _depths(ctl: Control, queues: list[str]) -> Awaitable[list[int]]:
    return asyncio.gather(*(ctl.depth(q) for q in queues))


async def _steady(p: Params, scenario: str, queues: int, persistent: bool) -> dict[str, float]:
    """`queues` publishers and consumers, one pair per queue, at full speed for a fixed window:
    what the consumers received per second in it, what the publishers wrote, the latency of
    what was received, and the messages the queues held at the end (sampled every second)."""

    async def body(ctl: Control, crew: Crew) -> dict[str, float]:
        names = [await ctl.queue(f"q{i}", durable=persistent) for i in range(queues)]
        spec = ConsumerSpec(p.url, names, [_NO_END] * queues, p.timeout_s,
                            duration_s=p.duration_s)
        con = crew.start(consumer_main, spec, "consumers")
        pubs = [
            crew.start(
                publisher_main,
                _publisher(p, "", [name], persistent=persistent, confirms=persistent,
                           duration_s=p.duration_s),
                f"publisher-{i}",
            )
            for i, name in enumerate(names)
        ]
        await crew.ready()
        crew.go()
        t0 = time.monotonic()
        samples: list[int] = []
        second = 0.0
        while second < p.duration_s:
            second = min(second + 1.0, p.duration_s)
            await asyncio.sleep(max(0.0, t0 + second - time.monotonic()))
            samples.append(sum(await _depths(ctl, names)))
        rc = await crew.result(con)
        rps = [await crew.result(i) for i in pubs]
        window_s = max((rc["t_last"] - rc["t_go"]) / 1e9, 1e-9)
        published = sum(r["published"] for r in rps)
        return {
            **_cpu(*rps, rc),
            "msg_s": rc["delivered"] / window_s,
            "pub_msg_s": sum(r["published"] / max((r["t_done"] - r["t_start"]) / 1e9, 1e-9)
                             for r in rps),
            "backlog": float(samples[-1]),
            "backlog_max": float(max(samples)),
            **_latency([rc["latencies_ns"]]),
            "sent": float(published),
            "received": float(rc["delivered"]),
        }

    return await with_control(p.url, p.timeout_s, scenario, body)


async def steady(p: Params) -> dict[str, float]:
    return await _steady(p, "steady", 1, False)


async def steady_4x4(p: Params) -> dict[str, float]:
    return await _steady(p, "steady-4x4", 4, False)


async def steady_persistent(p: Params) -> dict[str, float]:
    return await _steady(p, "steady-persistent", 1, True)


BACKLOG_LIMIT = 20_000  # messages a steady-state run may leave in its queues at the end


def bounded_backlog(figures: dict[str, float]) -> str | None:
    """The steady-state gate: ingress must not outrun egress for the whole window."""
    backlog = figures.get("backlog")
    if backlog is None or backlog < BACKLOG_LIMIT:
        return None
    return f"backlog at the end {backlog:,.0f} >= {BACKLOG_LIMIT:,} messages"


_RATE = (("msg_s", "msg/s"),)
_LAT = (("msg_s", "msg/s"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"))
_STEADY = (
    ("msg_s", "consumed/s"),
    ("pub_msg_s", "published/s"),
    ("backlog", "backlog at end"),
    ("backlog_max", "backlog max"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
)
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "publish-only",
            "transient publishes to a queue with no consumer, confirms off",
            publish_only,
            300_000,
            256,
            2_000,
            (*_RATE, ("write_msg_s", "written msg/s")),
        ),
        Scenario(
            "publish-only-4",
            "publish-only with 4 publishers on 4 queues, count messages each",
            publish_only_4,
            150_000,
            256,
            2_000,
            (*_RATE, ("write_msg_s", "written msg/s")),
        ),
        Scenario(
            "drain",
            "consume a backlog: prefetch 1000, multiple ack every 100",
            drain,
            300_000,
            256,
            2_000,
            _RATE,
        ),
        Scenario(
            "pubsub",
            "one publisher and one consumer at full speed (deliveries/s)",
            pubsub,
            300_000,
            256,
            2_000,
            _LAT,
        ),
        Scenario(
            "latency",
            "paced publisher (--rate, 5000 msg/s) and a consumer: end-to-end",
            latency,
            50_000,
            256,
            1_000,
            (("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), *_RATE),
        ),
        Scenario(
            "topic",
            "topic exchange, 50 queues, 10-way fan-out, 50 consumers (deliveries/s)",
            topic,
            30_000,
            256,
            1_000,
            _LAT,
        ),
        Scenario(
            "idle",
            "open idle connections (one channel each); broker RSS per connection",
            idle_connections,
            800,
            0,
            20,
            (("kib_per_conn", "KiB/conn"), ("conn_s", "conn/s")),
        ),
        Scenario(
            "persistent",
            "durable queue, delivery_mode 2, confirms, 1000 in flight",
            persistent_confirms,
            100_000,
            1024,
            2_000,
            _RATE,
        ),
        Scenario(
            "backlog",
            "transient backlog, no consumer: RSS per message, then drain",
            backlog_memory,
            1_000_000,
            1024,
            2_000,
            (
                ("bytes_per_msg", "B/msg"),
                ("publish_msg_s", "publish msg/s"),
                ("drain_msg_s", "drain msg/s"),
                ("drain_s", "drain s"),
            ),
        ),
        Scenario(
            "stream",
            "a stream: publish with confirms (1000 in flight), RSS holding it, replay from "
            "the first offset",
            stream,
            1_000_000,
            1024,
            2_000,
            (
                ("publish_msg_s", "publish msg/s"),
                ("replay_msg_s", "replay msg/s"),
                ("rss_mib", "RSS MiB holding it"),
                ("rss_growth_mib", "RSS growth MiB"),
            ),
        ),
        Scenario(
            "steady",
            "1 publisher + 1 consumer (prefetch 1000, ack every 100) at full speed for a "
            "fixed window: consumed/s, backlog at the end",
            steady,
            0,
            256,
            0,
            _STEADY,
            duration_s=15.0,
            quick_duration_s=2.0,
            gate=bounded_backlog,
        ),
        Scenario(
            "steady-4x4",
            "4 publishers + 4 consumers on 4 queues, steady state as `steady`",
            steady_4x4,
            0,
            256,
            0,
            _STEADY,
            duration_s=15.0,
            quick_duration_s=2.0,
            gate=bounded_backlog,
        ),
        Scenario(
            "steady-persistent",
            "steady state as `steady`, durable queue, delivery_mode 2, confirms "
            "(1000 in flight)",
            steady_persistent,
            0,
            256,
            0,
            _STEADY,
            duration_s=15.0,
            quick_duration_s=2.0,
            gate=bounded_backlog,
        ),
    )
}


async def run_scenario(
    name: str,
    url: str,
    count: int | None = None,
    size: int | None = None,
    runs: int = 1,
    pid: int | None = None,
    quick: bool = False,
    rate: float = 5000.0,
    wait_quiet_s: float = 0.0,
    duration_s: float | None = None,
) -> Report:
    """Run a scenario `runs` times and keep per-figure medians. For `idle`, count is the
    number of connections. With `wait_quiet_s`, each run first waits (at most that long) for
    a second in which other processes keep less than host.QUIET_CORES busy."""
    scenario = SCENARIOS[name]
    n = count if count is not None else (scenario.quick_count if quick else scenario.count)
    if duration_s is None or not scenario.duration_s:
        duration_s = scenario.quick_duration_s if quick else scenario.duration_s
    params = Params(
        url=url,
        count=n,
        size=size if size is not None else scenario.size,
        pid=pid,
        rate=rate,
        connections=n,
        duration_s=duration_s,
    )
    report = Report(
        scenario=name,
        url=parse_url(url).redacted(),
        params={"count": params.count, "size": params.size, "runs": runs, "pid": pid,
                "duration_s": duration_s},
    )
    for _ in range(max(1, runs)):
        if wait_quiet_s > 0:
            await wait_quiet(pid, wait_quiet_s)
        before = cpu_snapshot(pid)
        try:
            figures = await scenario.run(params)
        except BrokerClosed as exc:
            raise RuntimeError(f"{name}: {exc}") from exc
        report.runs.append({**figures, **others_busy(before, cpu_snapshot(pid))})
    keys = [k for k in report.runs[0] if all(k in run for run in report.runs)]
    report.median = {k: float(statistics.median(run[k] for run in report.runs)) for k in keys}
    return report
