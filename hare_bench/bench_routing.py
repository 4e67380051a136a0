"""Micro-benchmark: topic routing cost with 10 vs 10,000 bindings (and direct for scale).

Run: .venv/bin/python -m hare_bench.bench_routing

Bindings are a realistic mix of literal, `*` and `#` keys over many symbols; the routing key
matches a handful of them. A trie's cost depends on the key and the trie's shape, so the ratio
between the two sizes should stay near 1."""

from __future__ import annotations

import timeit

from pamqp import commands

from broker.message import Message
from broker.routing import Exchange, make_exchange, route

__all__ = ["main"]

_PATTERNS = ("stock.{s}.nyse", "stock.{s}.*", "*.{s}.#", "stock.#.{s}", "#.{s}")


def topic_exchange(n_bindings: int) -> Exchange:
    x = make_exchange("bench", "topic")
    i = 0
    while i < n_bindings:
        sym = f"S{i // len(_PATTERNS)}"
        x.bind(f"q{i}", _PATTERNS[i % len(_PATTERNS)].format(s=sym))
        i += 1
    x.bind("hash-all", "#")
    return x


def _per_call_ns(fn: object, number: int) -> float:
    best = min(timeit.repeat(fn, number=number, repeat=5))  # type: ignore[arg-type]
    return best / number * 1e9


def main() -> None:
    props = commands.Basic.Properties(delivery_mode=2).marshal()
    key = "stock.S1.nyse"
    message = Message("bench", key, props, b"x")
    lookup = {}.get
    results: dict[int, float] = {}
    for n in (10, 10_000):
        x = topic_exchange(n)
        matched = route(x, message, lookup)
        assert "q5" in matched and "hash-all" in matched, matched
        results[n] = _per_call_ns(lambda x=x: route(x, message, lookup), 50_000)
        print(f"topic, {n:>6} bindings: {results[n]:7.0f} ns/route ({len(matched)} queues matched)")
    print(f"ratio 10,000 / 10 bindings: {results[10_000] / results[10]:.2f}")

    d = make_exchange("direct", "direct")
    for i in range(10_000):
        d.bind(f"q{i}", f"key{i}")
    dm = Message("direct", "key42", props, b"x")
    ns = _per_call_ns(lambda: route(d, dm, lookup), 200_000)
    print(f"direct, 10,000 bindings: {ns:7.0f} ns/route")


if __name__ == "__main__":
    main()
