"""The sampler's arithmetic: per-second rates over the sample interval, and node totals that
keep what deleted queues and closed channels counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pika

from broker.mgmt.stats import Stats
from tests.mgmt.helpers import MgmtBroker


class FakeQueue:
    def __init__(self) -> None:
        self.published = self.delivered = self.acked = self.redelivered = 0
        self.ready = self.unacked = 0

    def info(self) -> dict[str, Any]:
        return {"messages": self.ready + self.unacked, "messages_ready": self.ready,
                "messages_unacknowledged": self.unacked}


class Obj:
    """A stand-in with attributes, hashable by identity (as the real objects are)."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def make_node() -> tuple[Any, dict[str, FakeQueue], dict[int, Any]]:
    queues: dict[str, FakeQueue] = {}
    chans: dict[int, Any] = {}
    node = Obj(vhosts={"/": Obj(queues=queues)}, connections={Obj(channels=chans)})
    return node, queues, chans


def test_rates_are_per_second_over_the_interval() -> None:
    now = [100.0]
    node, queues, _ = make_node()
    q = queues["a"] = FakeQueue()
    stats = Stats(node, clock=lambda: now[0])
    stats.sample()
    assert stats.rate(q, "publish") == 0.0  # one sample: no rate yet
    q.published, q.delivered, q.acked, q.ready = 50, 20, 10, 30
    now[0] += 5.0
    stats.sample()
    assert stats.rate(q, "publish") == 10.0
    assert stats.rate(q, "deliver_get") == 4.0
    assert stats.rate(q, "ack") == 2.0
    assert stats.rate(q, "messages") == 6.0
    assert stats.node_rate("publish_in") == 10.0
    now[0] += 5.0
    q.ready = 0
    stats.sample()
    assert stats.rate(q, "publish") == 0.0
    assert stats.rate(q, "messages") == -6.0


def test_totals_keep_deleted_queues_and_closed_channels() -> None:
    now = [0.0]
    node, queues, chans = make_node()
    q = queues["a"] = FakeQueue()
    ch = chans[1] = Obj(published=7)
    stats = Stats(node, clock=lambda: now[0])
    q.published = q.acked = 3
    stats.sample()
    assert stats.totals()["publish"] == 7 and stats.totals()["publish_in"] == 3
    del queues["a"]
    del chans[1]
    now[0] += 5
    stats.sample()
    totals = stats.totals()
    assert (totals["publish"], totals["publish_in"], totals["ack"]) == (7, 3, 3)
    # the channel-closed hook counts a channel's final numbers even between samples
    ch2 = chans[2] = Obj(published=5, confirmed=4, returned=1)
    stats.channel_closed(ch2)
    assert stats.totals()["publish"] == 12  # still listed, but not counted twice
    del chans[2]
    stats.sample()
    assert (stats.totals()["publish"], stats.totals()["confirm"]) == (12, 4)
    assert stats.totals()["return_unroutable"] == 1
    assert ch is not None


def test_a_queue_created_between_samples_has_rates_at_once() -> None:
    now = [0.0]
    node, queues, _ = make_node()
    stats = Stats(node, clock=lambda: now[0])
    stats.sample()
    q = queues["new"] = FakeQueue()
    q.published, q.ready = 30, 30
    now[0] += 5
    stats.sample()
    assert stats.rate(q, "publish") == 6.0
    assert stats.rate(q, "messages") == 6.0


def test_a_closed_channel_is_retired_on_a_real_broker(tmp_path: Path) -> None:
    """The hook runs in the channel's own task as it ends: on the compiled build (a mypyc
    class takes no weak reference) it raised there, so every closed channel left a task
    exception behind (logged when the broker stopped). Its counts still reach the totals."""
    b = MgmtBroker(tmp_path / "data").start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(b.url + "%2F?heartbeat=0"))
        for _ in range(3):
            ch = conn.channel()
            ch.basic_publish("", "nowhere", b"x")
            ch.close()
        conn.close()
        assert b.get("/api/overview")["message_stats"]["publish"] == 3
    finally:
        assert b.stop() == 0
    log = b.log_path.read_text()
    assert "exception was never retrieved" not in log, log[-3000:]
