"""Micro-benchmark: the queue's share of the hot path -- enqueue a batch, deliver it to the
consumers, ack it -- for a plain queue and for each delivery feature (consumer priorities,
single active consumer, a priority queue), in one process with no sockets.

Run: .venv/bin/python -m hare_bench.bench_queue [--variant plain] [--rounds N]

Prints ns per message. Timings on a shared machine are noisy; for a before/after comparison
count instructions instead, which batching cannot blur here (no event loop, no I/O):

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \\
        .venv/bin/python -m hare_bench.bench_queue --variant plain --rounds 200

and subtract a `--rounds 0` run (start-up) before dividing by rounds x batch."""

from __future__ import annotations

import argparse
import time
from typing import Any

from pamqp import commands

from broker.message import Message
from broker.protocol.channel_state import ChannelState
from broker.queue.amqqueue import AMQQueue
from broker.queue.consumer import Consumer
from broker.queue.variable_queue import VariableQueue
from broker.vhost import VHost

__all__ = ["BATCH", "build", "main", "run"]

BATCH = 500  # messages a queue wake-up takes (one channel batch)


class _Null:
    """Store and index stand-ins: transient messages with no RAM target never touch them."""

    def should_embed(self, size: int) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the benchmark's queue touched its store/index: {name}")


class _Writer:
    paused = False
    full = False


class _Channel:
    """What a queue needs of a channel: can_take's fields and deliver (with the channel's
    own bookkeeping: tag, unacked counts)."""

    def __init__(self) -> None:
        self.writer = _Writer()
        self.state = ChannelState.OPEN
        self.flow_active = True
        self.global_prefetch = 0
        self.consumer_unacked = 0
        self.next_tag = 1
        self.unacked: dict[int, int] = {}

    def deliver(self, consumer: Consumer, queue: AMQQueue, entry: Any) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        self.unacked[tag] = entry[0]
        consumer.unacked += 1
        self.consumer_unacked += 1

    def queue_confirmed(self, queue: AMQQueue, seqs: list[int], rejected: list[int]) -> None:
        pass


def _queue(variant: str) -> tuple[AMQQueue, list[_Channel]]:
    arguments: dict[str, Any] = {}
    if variant == "sac":
        arguments["x-single-active-consumer"] = True
    if variant == "priority-queue":
        arguments["x-max-priority"] = 10
    q = AMQQueue(VHost("bench"), "bench", arguments=arguments)
    null: Any = _Null()
    if variant == "priority-queue":
        from broker.queue.priority_queue import PriorityQueue

        q.bq = PriorityQueue(10, lambda base: VariableQueue(null, null, durable=False,
                                                            seq_base=base))
    else:
        q.bq = VariableQueue(null, null, durable=False)
    channels = [_Channel(), _Channel()]
    for i, ch in enumerate(channels):
        kw: dict[str, Any] = {"arguments": {}}
        if variant == "consumer-priorities":
            kw = {"arguments": {"x-priority": i}, "priority": i}
        q.add_consumer(Consumer(f"c{i}", ch, q, no_ack=False, exclusive=False,  # type: ignore[arg-type]
                                prefetch=0, **kw))
    return q, channels


def build(variant: str) -> tuple[AMQQueue, list[_Channel], list[tuple[Message, int]]]:
    """The queue, its two consumers' channels, and one batch of messages to publish."""
    q, channels = _queue(variant)
    props = [commands.Basic.Properties(priority=p).marshal() if variant == "priority-queue"
             else b"\x00\x00" for p in range(10)]
    items = [(Message("", "bench", props[n % 10], b"x" * 64), 0) for n in range(BATCH)]
    return q, channels, items


def run(variant: str, rounds: int) -> float:
    """Seconds per message over `rounds` batches of BATCH."""
    q, channels, items = build(variant)
    start = time.perf_counter()
    for _ in range(rounds):
        q._process([("pubs", None, items)])
        for ch in channels:
            q.ack(list(ch.unacked.values()))
            ch.unacked.clear()
            ch.consumer_unacked = 0
        for c in q.consumers:
            c.unacked = 0
        q.mailbox.take()  # the wake-ups acks posted
    elapsed = time.perf_counter() - start
    assert len(q.bq) == 0 and q.delivered == rounds * BATCH
    return elapsed / max(1, rounds * BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=(
        "plain", "consumer-priorities", "sac", "priority-queue", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=400)
    a = parser.parse_args()
    variants = ("plain", "consumer-priorities", "sac", "priority-queue") if (
        a.variant == "all") else (a.variant,)
    for v in variants:
        per = run(v, a.rounds)
        if a.rounds:
            print(f"{v:>20}: {per * 1e9:7.0f} ns/message (enqueue + deliver + ack)")


if __name__ == "__main__":
    main()
