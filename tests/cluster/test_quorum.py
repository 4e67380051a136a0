"""Quorum queues on three real nodes (one private etcd, kill -9 and SIGSTOP on the processes):
the five guarantees of issue 21 (docs/CLUSTER.md, "Replicated queues"), each a test.

1. The leader killed: a follower holding every confirmed message leads within the lease;
   clients on any node go on (consumers get basic.cancel and consume again); every confirmed
   message is delivered, in publish order.
2. A member's disk lost: it rejoins under its name, is copied what it lacks, then counts;
   with the other two killed in turn, nothing confirmed is lost.
3. A minority running: a publish is never confirmed, consumers get nothing, the queue of a
   minority without its leader answers 404; with a majority back, the publish confirms.
4. A leader cut off (SIGSTOP past its lease, then SIGCONT): it steps down when it sees the new
   epoch; nothing confirmed on either side is lost, nothing acked before is delivered again.
5. A short nemesis: publishers and consumers on all nodes while nodes are killed, restarted
   and paused at random (the long run: `make nemesis`, figures in docs/CLUSTER.md)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from .helpers import ClusterNode, EtcdProc, wait_for
from .quorum_clients import Consumer, Publisher, check

LEASE_S = 5  # long enough for a loaded 2-core machine, short enough for failovers in tests
QUORUM = {"x-queue-type": "quorum"}


class Trio:
    def __init__(self, root: Any, etcd: EtcdProc) -> None:
        self.root = root
        self.etcd = etcd
        self.nodes = {n: ClusterNode(root / n, etcd, "qq", f"qq-{n}",
                                     ["--cluster-lease-ttl-s", str(LEASE_S)])
                      for n in "abc"}

    def __getitem__(self, short: str) -> ClusterNode:
        return self.nodes[short]

    def by_name(self, name: str) -> ClusterNode:
        return self.nodes[name.rsplit("-", 1)[1]]

    def up(self) -> list[ClusterNode]:
        return [n for n in self.nodes.values() if n.proc is not None]

    def heal(self) -> None:
        """Every node running (SIGCONT, start), each seeing the other two."""
        for n in self.nodes.values():
            if n.proc is not None:
                os.kill(n.pid, signal.SIGCONT)
            else:
                n.start()
        wait_for(lambda: all(_running(n) == 3 for n in self.nodes.values()), timeout=60,
                 what="three nodes up")


def _running(node: ClusterNode) -> int:
    try:
        return sum(1 for x in node.get("/api/nodes") if x["running"])
    except (OSError, AssertionError):
        return 0


def qinfo(node: ClusterNode, name: str) -> dict[str, Any] | None:
    try:
        status, body = node.api("GET", f"/api/queues/%2F/{name}")
    except OSError:
        return None
    return body if status == 200 else None


def leader(trio: Trio, name: str, *, among: list[ClusterNode] | None = None) -> ClusterNode:
    """The node that leads `name` and serves it (waits for an election to finish)."""
    def found() -> ClusterNode | None:
        for node in among or trio.up():
            info = qinfo(node, name)
            if info and info.get("leader") and info.get("state", "running") == "running":
                lead = trio.by_name(info["leader"])
                mine = qinfo(lead, name) if lead.proc is not None else None
                if mine and mine.get("leader") == lead.name and "commit_position" in mine:
                    return lead
        return None
    return wait_for(found, timeout=6 * LEASE_S, what=f"a leader of {name}")


def caught_up(trio: Trio, name: str, members: int = 3) -> None:
    """Every member holds the leader's position (acks and publishes committed everywhere)."""
    def done() -> bool:
        lead = leader(trio, name)
        info = qinfo(lead, name) or {}
        positions = info.get("positions") or {}
        mine = positions.get(lead.name, -1)
        return len(positions) >= members and all(p == mine for p in positions.values())
    wait_for(done, timeout=30, what=f"{name} caught up on every member")


def url(node: ClusterNode) -> str:
    return node.url


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdProc) -> Iterator[Trio]:
    t = Trio(tmp_path_factory.mktemp("quorum"), etcd)
    for n in t.nodes.values():
        n.start()
    wait_for(lambda: all(_running(n) == 3 for n in t.nodes.values()), timeout=60,
             what="three nodes up")
    yield t
    for n in t.nodes.values():
        if n.proc is not None:
            os.kill(n.pid, signal.SIGCONT)
            n.kill()


@pytest.fixture(autouse=True)
def healed(trio: Trio) -> Iterator[None]:
    yield
    trio.heal()


def declare(node: ClusterNode, name: str, **arguments: Any) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    conn.channel().queue_declare(name, durable=True, arguments={**QUORUM, **arguments})
    conn.close()


def test_declared_on_three_members(trio: Trio) -> None:
    declare(trio["a"], "q.members")
    for n in trio.nodes.values():
        info = wait_for(lambda n=n: qinfo(n, "q.members"), what="the queue everywhere")
        assert info["type"] == "quorum"
        assert info["leader"] == "qq-a"
        assert sorted(info["members"]) == ["qq-a", "qq-b", "qq-c"]
        assert sorted(info["online"]) == ["qq-a", "qq-b", "qq-c"]
    caught_up(trio, "q.members")


def test_leader_killed(trio: Trio) -> None:
    """Guarantee 1."""
    name = "q.g1"
    declare(trio["a"], name)
    assert leader(trio, name) is trio["a"]
    pub_b = Publisher(lambda: url(trio["b"]), name, "b")
    pub_c = Publisher(lambda: url(trio["c"]), name, "c")
    con_c = Consumer(lambda: url(trio["c"]), name)
    for t in (pub_b, pub_c, con_c):
        t.start()
    wait_for(lambda: len(pub_b.confirmed) > 100 and len(con_c.received) > 50, 60,
               "traffic before the kill")
    killed_at = time.monotonic()
    trio["a"].kill()
    new = leader(trio, name, among=[trio["b"], trio["c"]])
    took = time.monotonic() - killed_at
    assert new is not trio["a"]
    assert took < 4 * LEASE_S, took  # the lease, an election, a copy: seconds
    before = len(pub_b.confirmed) + len(pub_c.confirmed)
    wait_for(lambda: len(pub_b.confirmed) + len(pub_c.confirmed) > before + 100, 60,
               "publishers going on after the failover")
    assert con_c.cancels >= 1  # its consumer on a's queue was cancelled, and it came back
    for p in (pub_b, pub_c):
        p.stop()
        p.join(30)
    wait_for(lambda: not check([pub_b, pub_c], [con_c]).lost, 60,
               "every confirmed message delivered")
    con_c.stop()
    con_c.join(30)
    verdict = check([pub_b, pub_c], [con_c])
    assert verdict.lost == [] and verdict.reordered == 0, verdict.line()
    # the old leader comes back as a follower and is copied what it missed
    trio["a"].start()
    caught_up(trio, name)
    assert qinfo(trio["a"], name)["leader"] == new.name


def publish_confirmed(node: ClusterNode, name: str, bodies: list[bytes]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    conn.close()


def drain(node: ClusterNode, name: str) -> list[bytes]:
    """Every message of the queue, through basic.get on `node` (acked)."""
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    out = []
    while True:
        method, _, body = ch.basic_get(name, auto_ack=True)
        if method is None:
            break
        out.append(body)
    conn.close()
    return out


def down_for_cluster(trio: Trio, node: ClusterNode) -> None:
    """`node` is down for the others (its lease expired): its name is free again."""
    others = [n for n in trio.up() if n is not node]
    wait_for(lambda: all(not any(x["name"] == node.name and x["running"]
                                 for x in o.get("/api/nodes")) for o in others),
             timeout=4 * LEASE_S, what=f"{node.name} down for the cluster")


def test_member_disk_lost(trio: Trio) -> None:
    """Guarantee 2: b's data directory is deleted and b restarted under its name; the leader
    copies it the queue, then it counts: with c and then a killed, b alone holds the last
    messages, and an election among b and c (c back) chooses b: nothing confirmed is lost."""
    name = "q.g2"
    a, b, c = trio["a"], trio["b"], trio["c"]
    declare(a, name)
    phase1 = [f"1:{i}".encode() for i in range(100)]
    publish_confirmed(a, name, phase1)
    b.kill()
    shutil.rmtree(b.data_dir)
    down_for_cluster(trio, b)
    phase2 = [f"2:{i}".encode() + b"x" * (5000 if i % 7 == 0 else 0) for i in range(100)]
    publish_confirmed(a, name, phase2)  # a and c hold these
    b.start()  # a new disk: b is no voter until a copied it the queue
    caught_up(trio, name)
    assert qinfo(b, name)["member"]["voter"]
    c.kill()
    phase3 = [f"3:{i}".encode() for i in range(100)]
    publish_confirmed(a, name, phase3)  # a and b: a majority without c
    a.kill()
    c.start()  # b and c elect; c lacks phase 3, so b must win
    new = leader(trio, name, among=[b, c])
    assert new is b
    assert drain(c, name) == phase1 + phase2 + phase3


def test_restarted_member_claims_only_what_it_holds(trio: Trio) -> None:
    """A member that restarts comes back with the position it had. c led the queue once (so
    its own disk has the queue's definition), then followed; killed while a consumer held
    messages (their delivery state replicated), it must not count its own return of them as
    a batch: else, with the leader killed too, c would tie the third member's position and
    win the election by name without the message those two confirmed meanwhile."""
    name = "q.claim"
    a, b, c = trio["a"], trio["b"], trio["c"]
    declare(c, name)
    publish_confirmed(c, name, [f"m:{i}".encode() for i in range(10)])
    caught_up(trio, name)
    c.kill()
    lead = leader(trio, name, among=[a, b])
    other = b if lead is a else a
    c.start()
    caught_up(trio, name)
    conn = pika.BlockingConnection(pika.URLParameters(lead.url))
    ch = conn.channel()
    held = [ch.basic_get(name)[0] for _ in range(3)]  # unacked: checked out on every member
    assert all(m is not None for m in held)
    publish_confirmed(lead, name, [b"marker"])  # after the batches that record those
    caught_up(trio, name)
    c.kill()
    publish_confirmed(lead, name, [b"confirmed without c"])  # one batch c lacks
    lead.kill()
    c.start()
    assert leader(trio, name, among=[other, c]) is other
    bodies = drain(c, name)
    assert b"confirmed without c" in bodies and len(bodies) == 12


def test_minority_never_confirms(trio: Trio) -> None:
    """Guarantee 3: with b and c killed, a publish on the leader a waits for its confirm
    and a consumer gets nothing; with b back, the confirm comes and the message is
    delivered. With only c running, the queue answers 404 (its leader a is down, and one
    member cannot elect)."""
    import asyncio

    import aio_pika
    from aiormq.exceptions import ChannelNotFoundEntity
    from pamqp.commands import Basic

    name = "q.g3"
    a, b, c = trio["a"], trio["b"], trio["c"]
    declare(a, name)
    caught_up(trio, name)
    b.kill()
    c.kill()

    async def run() -> None:
        conn = await aio_pika.connect(a.url)
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.get_queue(name, ensure=False)
        got: list[bytes] = []

        async def take(m: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append(m.body)

        await q.consume(take, no_ack=True)
        confirm = asyncio.ensure_future(ch.default_exchange.publish(
            aio_pika.Message(b"minority", delivery_mode=2), routing_key=name))
        done, _ = await asyncio.wait([confirm], timeout=3 * LEASE_S / 2)
        assert not done and got == []  # not confirmed, not delivered: a alone is no majority
        await asyncio.to_thread(b.start)
        assert isinstance(await asyncio.wait_for(confirm, 30), Basic.Ack)
        deadline = time.monotonic() + 30
        while got != [b"minority"]:
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.05)
        await conn.close()
        # only c: its leader is down and c alone cannot elect one
        await asyncio.to_thread(a.kill)
        await asyncio.to_thread(b.kill)
        await asyncio.to_thread(c.start)
        conn = await aio_pika.connect(c.url)
        ch = await conn.channel()
        with pytest.raises(ChannelNotFoundEntity, match="is down or inaccessible"):
            await ch.declare_queue(name, durable=True, arguments=QUORUM)
        await conn.close()

    asyncio.run(run())


def test_partitioned_leader_steps_down(trio: Trio) -> None:
    """Guarantee 4: the leader a is stopped (SIGSTOP) longer than its lease while clients on
    a and b publish and a consumer on b acks; b and c elect a leader and go on; when a runs
    again it steps down (the new epoch: its lease gone, its followers' fence) and follows.
    Nothing confirmed on either side is lost, and nothing acked before the partition is
    delivered again."""
    name = "q.g4"
    a, b, c = trio["a"], trio["b"], trio["c"]
    declare(a, name)
    con = Consumer(lambda: url(b), name)
    con.start()
    warm = Publisher(lambda: url(b), name, "warm", count=200)
    warm.start()
    warm.join(60)
    wait_for(lambda: len(con.acked) >= 200, 60, "the first messages acked")
    caught_up(trio, name)  # those acks are held by every member
    acked_before = {(t, i) for t, i, _ in con.acked}
    seen_before = len(con.received)
    pub_a = Publisher(lambda: url(a), name, "a")
    pub_b = Publisher(lambda: url(b), name, "b")
    for p in (pub_a, pub_b):
        p.start()
    wait_for(lambda: len(pub_a.confirmed) > 20 and len(pub_b.confirmed) > 20, 60,
               "traffic on both sides")
    os.kill(a.pid, signal.SIGSTOP)
    try:
        new = leader(trio, name, among=[b, c])
        assert new is not a
        count = len(pub_b.confirmed)
        wait_for(lambda: len(pub_b.confirmed) > count + 50, 60, "b's side going on")
    finally:
        os.kill(a.pid, signal.SIGCONT)
    wait_for(lambda: (qinfo(a, name) or {}).get("leader") == new.name, 60,
               "a following the new leader")
    count = len(pub_a.confirmed)
    wait_for(lambda: len(pub_a.confirmed) > count + 20, 60, "a's client going on")
    for p in (pub_a, pub_b):
        p.stop()
        p.join(30)
    wait_for(lambda: not check([warm, pub_a, pub_b], [con]).lost, 60,
               "every confirmed message delivered")
    con.stop()
    con.join(30)
    verdict = check([warm, pub_a, pub_b], [con])
    assert verdict.lost == [], verdict.line()
    again = [(t, i) for t, i, _ in con.received[seen_before:] if (t, i) in acked_before]
    assert again == []
    caught_up(trio, name)


def test_grow_and_shrink(trio: Trio) -> None:
    """hare-ctl grow adds a member, which the leader copies the queue to before it counts;
    delete_member of the leader moves the lead to a remaining member holding every message;
    shrink takes a node out of every quorum queue; a removed member's files go; add_member
    brings one back."""
    from broker.store import layout

    from .helpers import ctl

    name = "q.grow"
    a, c = trio["a"], trio["c"]
    declare(a, name, **{"x-quorum-initial-group-size": 2})
    members = (qinfo(a, name) or {})["members"]
    assert len(members) == 2 and members[0] == "qq-a"
    other = next(n for n in ("qq-b", "qq-c") if n not in members)
    bodies = [f"g:{i}".encode() for i in range(100)]
    publish_confirmed(a, name, bodies)
    done = ctl(a, "grow", other, "all", "--queue-pattern", r"^q\.grow$")
    assert done.returncode == 0, done.stderr
    assert sorted(qinfo(a, name)["members"]) == ["qq-a", "qq-b", "qq-c"]
    caught_up(trio, name)
    done = ctl(a, "delete_member", name, "qq-a")
    assert done.returncode == 0, done.stderr
    new = leader(trio, name, among=[trio["b"], c])
    assert sorted(qinfo(new, name)["members"]) == ["qq-b", "qq-c"]
    directory = a.data_dir / layout.QUEUES / layout.queue_dir_name("/", name)
    wait_for(lambda: not directory.exists(), what="a's member files removed")
    done = ctl(a, "shrink", "qq-c")
    assert done.returncode == 0, done.stderr
    assert qinfo(a, name)["members"] == ["qq-b"]
    assert all("qq-c" not in (qinfo(a, q) or {}).get("members", [])
               for q in ("q.g1", "q.g2", "q.g4"))
    assert drain(trio["b"], name) == bodies
    done = ctl(a, "add_member", name, "qq-a")  # a member again: copied, then it counts
    assert done.returncode == 0, done.stderr
    assert sorted(qinfo(a, name)["members"]) == ["qq-a", "qq-b"]
    caught_up(trio, name, members=2)
    refused = ctl(a, "add_member", name, "qq-nowhere")
    assert refused.returncode != 0 and "not a member of the cluster" in refused.stderr


def test_leader_locator_and_group_size(trio: Trio) -> None:
    """x-queue-leader-locator balanced leads a new quorum queue on the running node with the
    fewest queues, not the declaring one (client-local, the default, is the declaring one);
    without x-quorum-initial-group-size a queue gets 3 members, or the running nodes if
    fewer."""
    def counts() -> dict[str, int]:
        per = {n.name: 0 for n in trio.nodes.values()}
        for q in trio["a"].get("/api/queues/%2F"):
            if q["node"] in per:
                per[q["node"]] += 1
        return per

    per = counts()
    busiest = trio.by_name(max(per, key=lambda n: (per[n], n)))
    conn = pika.BlockingConnection(pika.URLParameters(busiest.url))
    ch = conn.channel()
    ch.queue_declare("loc.classic", durable=True)  # the declaring node: more than the fewest
    conn.close()
    per = counts()
    fewest = {n for n, c in per.items() if c == min(per.values())}
    assert busiest.name not in fewest
    declare(busiest, "loc.local")
    assert qinfo(busiest, "loc.local")["leader"] == busiest.name
    declare(busiest, "loc.balanced", **{"x-queue-leader-locator": "balanced"})
    info = wait_for(lambda: qinfo(busiest, "loc.balanced"), what="loc.balanced")
    assert info["leader"] in fewest, (info["leader"], fewest)
    assert len(info["members"]) == 3
    delete(busiest, "loc.classic", "loc.local", "loc.balanced")
    c = trio["c"]
    c.kill()
    down_for_cluster(trio, c)
    declare(trio["a"], "loc.two")
    assert sorted(qinfo(trio["a"], "loc.two")["members"]) == ["qq-a", "qq-b"]
    delete(trio["a"], "loc.two")


def delete(node: ClusterNode, *names: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    for name in names:
        ch.queue_delete(name)
    conn.close()


def test_nemesis_short(trio: Trio) -> None:
    """Guarantee 5, short: see tests/cluster/nemesis.py (the long run is `make nemesis`)."""
    from .nemesis import run_nemesis

    verdict = run_nemesis(trio, "q.g5", seconds=35, seed=int(time.time()))
    print(verdict.line())
    assert verdict.lost == [], verdict.line()
