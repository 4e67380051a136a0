"""One hare-server, several worker processes: what a client sees is one broker; the parent
restarts a killed worker, stops all of them on SIGTERM, and they stop when it dies."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.cluster.helpers import ctl
from tests.conftest import BrokerProc
from tests.workers.helpers import (
    WorkersBroker,
    alive,
    children,
    connect,
    one_per_worker,
    wait_for,
)


@pytest.fixture
def two(tmp_path: Path) -> Iterator[WorkersBroker]:
    b = WorkersBroker(tmp_path / "data", 2).start()
    yield b
    b.kill()


def _fill_one_queue_per_worker(b: WorkersBroker, prefix: str, count: int
                               ) -> dict[str, pika.BlockingConnection]:
    """On a connection per worker, a queue `prefix` + the worker's suffix (w1, w2, ...) with
    `count` confirmed messages: each lives on its declaring connection's worker."""
    conns = one_per_worker(b)
    for node, conn in conns.items():
        ch = conn.channel()
        name = prefix + node.rsplit("-", 1)[1]
        ch.queue_declare(name)
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", name, b"%d" % i)
    return conns


def test_workers_serve_one_broker(two: WorkersBroker) -> None:
    """A queue declared on one worker is published to and consumed from connections on
    both; the management API lists every queue once, with the worker that holds it."""
    conns = one_per_worker(two)
    assert len(conns) == 2
    (home, a), (other, b) = sorted(conns.items())
    ch_a, ch_b = a.channel(), b.channel()
    ch_a.queue_declare("shared", durable=True)
    ch_a.confirm_delivery()
    ch_b.confirm_delivery()
    for i in range(50):  # confirmed, from both workers
        ch_a.basic_publish("", "shared", f"a{i}".encode())
        ch_b.basic_publish("", "shared", f"b{i}".encode())
    assert two.node_of("shared") == home
    assert ch_b.queue_declare("shared", passive=True).method.message_count == 100
    got: list[bytes] = []
    for ch in (ch_b, ch_a):  # half consumed on the other worker, the rest on its home
        ch.basic_qos(prefetch_count=10)
        for method, _, body in ch.consume("shared"):
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) in (50, 100):
                break
        ch.cancel()
    assert sorted(got) == sorted([f"a{i}".encode() for i in range(50)]
                                 + [f"b{i}".encode() for i in range(50)])
    for _ in range(4):  # whichever worker answers, the list is the same
        queues = two.get("/api/queues")
        names = [q["name"] for q in queues]
        assert len(names) == len(set(names))
        assert "shared" in names
        assert {q["node"] for q in queues} == {home, other}
    for c in conns.values():
        c.close()


def test_killed_worker_restarts_with_its_queue(two: WorkersBroker) -> None:
    conns = one_per_worker(two)
    conn = next(c for n, c in conns.items() if n.endswith("-w2"))
    ch = conn.channel()
    ch.queue_declare("orders", durable=True)
    ch.confirm_delivery()
    for i in range(200):
        ch.basic_publish("", "orders", f"m{i}".encode(),
                         pika.BasicProperties(delivery_mode=2))  # confirmed: returns after ack
    for c in conns.values():
        c.close()
    before = two.workers()
    os.kill(before[2], signal.SIGKILL)
    wait_for(lambda: two.workers().get(2, before[2]) != before[2] and not alive(before[2]),
             what="worker 2 restarted")
    assert two.workers()[1] == before[1]  # the other worker served on

    def back() -> bool:  # the restarted worker serves its queue again, from any connection
        try:
            c = connect(two)
        except pika.exceptions.AMQPConnectionError:
            return False
        try:
            n = c.channel().queue_declare("orders", passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker:
            n = -1
        c.close()
        return n == 200

    wait_for(back, what="queue orders back with its 200 messages")
    c = connect(two)
    ch = c.channel()
    bodies = []
    while (m := ch.basic_get("orders", auto_ack=True))[0] is not None:
        bodies.append(m[2])
    assert bodies == [f"m{i}".encode() for i in range(200)]
    c.close()


def test_sigterm_stops_every_worker(two: WorkersBroker) -> None:
    pids = children(two.pid)
    assert len(two.workers()) == 2 and len(pids) >= 2
    assert two.stop() == 0
    assert not [p for p in pids if alive(p)]


def test_workers_share_the_parents_session_in_groups_of_their_own(two: WorkersBroker) -> None:
    """One broker is one CPU scheduling group (the kernel's autogroup is per session): a
    worker in a session of its own had a core's share against the clients beside it. Its own
    process group keeps a terminal's Ctrl-C for the parent, which stops the workers in order."""
    for pid in two.workers().values():
        assert os.getsid(pid) == os.getsid(two.pid)
        assert os.getpgid(pid) not in (os.getpgid(two.pid), os.getpgid(0))


def test_parent_killed_workers_stop(two: WorkersBroker) -> None:
    pids = list(two.workers().values())
    two.kill(tree=False)
    wait_for(lambda: not any(alive(p) for p in pids), what="workers gone with their parent")


def test_one_worker_is_one_process(tmp_path: Path) -> None:
    b = BrokerProc(tmp_path / "data", ["--workers", "1"]).start()
    try:
        assert children(b.pid) == []
        c = connect(b)
        c.channel().queue_declare("q")
        c.close()
    finally:
        assert b.stop() == 0
    assert not (tmp_path / "data" / "w1").exists()


@pytest.mark.parametrize(("locator", "placement", "spread"), [
    ("balanced", "true", True), ("auto", "true", True), ("auto", "false", False)])
def test_locators_place_one_connections_queues(tmp_path: Path, locator: str, placement: str,
                                               spread: bool) -> None:
    """balanced: queues declared on one connection go to the worker with the fewest, so they
    spread. auto (the default): the same with connection placement (a client sees one node,
    and its connections move to their queues, so every core works); without it a queue stays
    on its declaring worker (client-local: its declaring connection crosses nothing).
    Exclusive queues always stay on their connection's worker."""
    b = WorkersBroker(tmp_path / "data", 2, [f"--queue-master-locator={locator}",
                                             f"--connection-placement={placement}"]).start()
    try:
        c = connect(b)
        ch = c.channel()
        for i in range(4):
            ch.queue_declare(f"spread-{i}")
        ch.queue_declare("mine", exclusive=True)
        ch.queue_declare("mine-too", exclusive=True)
        nodes = [b.node_of(f"spread-{i}") for i in range(4)]
        assert b.node_of("mine") == b.node_of("mine-too")
        if spread:
            assert sorted(nodes.count(n) for n in set(nodes)) == [2, 2]
        else:
            assert set(nodes) == {b.node_of("mine")}
        c.close()
    finally:
        assert b.stop() == 0


def test_management_shows_the_whole_broker(two: WorkersBroker) -> None:
    """Whichever worker answers: every queue once with its home worker's message count,
    every connection, and overview totals summed over the workers."""
    conns = _fill_one_queue_per_worker(two, "depth-", 7)
    for _ in range(6):  # several requests: both workers answer some
        queues = {q["name"]: q for q in two.get("/api/queues")}
        assert queues["depth-w1"]["messages"] == 7 and queues["depth-w2"]["messages"] == 7
        assert queues["depth-w1"]["node"].endswith("-w1")
        assert queues["depth-w2"]["node"].endswith("-w2")
        assert len({c["node"] for c in two.get("/api/connections")}) == 2
        overview = two.get("/api/overview")
        assert overview["object_totals"]["connections"] == 2
        assert overview["queue_totals"]["messages"] == 14
        one = two.get("/api/queues/%2F/depth-w2")
        assert one["messages"] == 7
        # the workers are one server's nodes, named after it
        nodes = two.get("/api/nodes")
        server = f"hare@{socket.gethostname()}"
        assert {n["name"]: n["server"] for n in nodes} == {
            f"{server}-w1": server, f"{server}-w2": server}
    for c in conns.values():
        c.close()


def test_consumers_of_every_worker_listed_once(two: WorkersBroker) -> None:
    """/api/consumers, a queue's consumer_details and hare-ctl list_consumers show every
    worker's consumers once, with their own channel (not the link's), whichever worker
    answers; a single-active-consumer queue's choice is its home's; a vhost filters them;
    as RabbitMQ, a monitoring user sees them all, a management user its own only."""
    assert two.api("PUT", "/api/vhosts/other", {})[0] == 201
    for user, tags in (("mon", "monitoring"), ("mgr", "management")):
        assert two.api("PUT", f"/api/users/{user}", {"password": "pw", "tags": tags})[0] == 201
    assert two.api("PUT", "/api/permissions/other/mgr",
                   {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    conns = one_per_worker(two)
    (w1, c1), (w2, c2) = sorted(conns.items())
    ch1, ch2 = c1.channel(), c2.channel()
    ch1.queue_declare("cq")
    ch1.queue_declare("sac", arguments={"x-single-active-consumer": True})
    ch1.basic_consume("cq", lambda *a: None, consumer_tag="t-w1")
    ch2.basic_consume("cq", lambda *a: None, consumer_tag="t-w2")
    ch2.basic_consume("sac", lambda *a: None, consumer_tag="sac-first")  # from w2: active
    # once its home has it (consume-ok on w2 comes before the link delivers it to w1)
    wait_for(lambda: two.get("/api/queues/%2F/sac")["consumers"] == 1, what="sac-first home")
    ch1.basic_consume("sac", lambda *a: None, consumer_tag="sac-second")
    mine = pika.BlockingConnection(pika.URLParameters(
        two.url.replace("guest:guest", "mgr:pw") + "other?heartbeat=0"))
    ch3 = mine.channel()
    ch3.queue_declare("mq")
    ch3.basic_consume("mq", lambda *a: None, consumer_tag="t-mgr")
    want = {"t-w1": ("cq", w1, True, "up"), "t-w2": ("cq", w2, True, "up"),
            "sac-first": ("sac", w2, True, "single_active"),
            "sac-second": ("sac", w1, False, "waiting")}

    def seen(listed: list[dict]) -> dict[str, tuple[str, str, bool, str]]:
        tags = [c["consumer_tag"] for c in listed]
        assert len(tags) == len(set(tags)), tags
        for c in listed:
            assert c["channel_details"]["connection_name"].startswith("conn-"), c
        return {c["consumer_tag"]: (c["queue"]["name"], c["channel_details"]["node"],
                                    c["active"], c["activity_status"]) for c in listed}

    wait_for(lambda: seen(two.get("/api/consumers/%2F")) == want, what="both workers'")
    for _ in range(6):  # several requests: both workers answer some
        everyone = seen(two.get("/api/consumers"))
        assert set(everyone) == {*want, "t-mgr"}
        assert seen(two.get("/api/consumers/%2F")) == want
        assert set(seen(two.get("/api/consumers/other"))) == {"t-mgr"}
        assert seen(two.get("/api/consumers", user="mon", password="pw")) == everyone
        assert set(seen(two.get("/api/consumers", user="mgr", password="pw"))) == {"t-mgr"}
        assert two.get("/api/overview")["object_totals"]["consumers"] == len(everyone)
        details = two.get("/api/queues/%2F/sac")["consumer_details"]
        assert seen(details) == {t: want[t] for t in ("sac-first", "sac-second")}
        assert {c["channel_details"]["user"] for c in details} == {"guest"}
    listed = ctl(two, "--json", "list_consumers", "queue_name", "consumer_tag", "active")
    assert listed.returncode == 0, listed.stderr
    assert sorted(json.loads(listed.stdout), key=str) == sorted(
        ({"queue_name": q, "consumer_tag": tag, "active": a}
         for tag, (q, _, a, _) in want.items()), key=str)
    mine.close()
    for c in conns.values():
        c.close()


def test_restart_of_the_whole_server_keeps_definitions_and_messages(tmp_path: Path) -> None:
    """The metadata service's log and each worker's data directory survive a clean stop:
    the same broker comes back (users, queues on their workers, persistent messages)."""
    b = WorkersBroker(tmp_path / "data", 2).start()
    try:
        assert b.api("PUT", "/api/users/alice", {"password": "pw", "tags": ""})[0] in (201, 204)
        conns = one_per_worker(b)
        homes = {}
        for node, conn in conns.items():
            ch = conn.channel()
            name = "kept-" + node.rsplit("-", 1)[1]
            ch.queue_declare(name, durable=True)
            ch.confirm_delivery()
            for i in range(5):
                ch.basic_publish("", name, b"%d" % i, pika.BasicProperties(delivery_mode=2))
            homes[name] = node
            conn.close()
        assert b.stop() == 0
        b.start()
        assert b.get("/api/users/alice")["name"] == "alice"
        queues = {q["name"]: q for q in b.get("/api/queues")}
        for name, node in homes.items():
            assert queues[name]["node"] == node
            assert queues[name]["messages"] == 5
    finally:
        b.kill()


def test_parent_killed_and_started_again_at_once(tmp_path: Path) -> None:
    """kill -9 of the parent, then a new hare-server on the same data directory while the
    old workers are still stopping: each new worker waits for its directory's lock and the
    confirmed messages are all there. A quorum queue is one member (the workers share one
    disk: a second copy would survive nothing more), so it leads as soon as its worker runs."""
    b = WorkersBroker(tmp_path / "data", 2).start()
    try:
        c = connect(b)
        ch = c.channel()
        ch.confirm_delivery()
        ch.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
        ch.queue_declare("cq", durable=True)
        for i in range(50):
            ch.basic_publish("", "qq", b"%d" % i)
            ch.basic_publish("", "cq", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        c.close()
        assert len(b.get("/api/queues/%2F/qq")["members"]) == 1
        b.kill(tree=False)  # the workers stop on their own, while the new ones start
        b.start()
        c = connect(b)
        ch = c.channel()
        assert ch.queue_declare("qq", passive=True).method.message_count == 50
        assert ch.queue_declare("cq", passive=True).method.message_count == 50
        c.close()
    finally:
        b.kill()


async def test_remote_consumers_pace_their_publishers(tmp_path: Path) -> None:
    """hare-perf's steady-4x4 gate at workers = 2: its control connection declares all four
    queues, so they live on one worker while the consumers' connections land on both (with
    connection placement off: on, they would move to the queues' worker and be local). A
    consumer on another worker that waits on its queue makes that queue busy (docs/FLOW.md),
    so publishers are held to the consumers' pace and the backlog stays bounded; before,
    such a queue granted its publishers all their credit and the backlog grew to 65,000 -
    294,000 messages in 15 s."""
    from hare_perf.report import format_report
    from tests.load_gate import within_gate

    two = WorkersBroker(tmp_path / "data", 2, ["--connection-placement=false"]).start()
    try:
        report, misses = await within_gate(two.url, two.pid, "steady-4x4", duration_s=6.0)
    finally:
        two.kill()
    assert report.median["received"] > 0, format_report(report)
    assert not misses, misses


def test_direct_reply_to_across_workers(two: WorkersBroker) -> None:
    """RPC over amq.rabbitmq.reply-to with the client on one worker and the server on the
    other: the reply name is known there (passive declare) and the reply arrives."""
    (_, client), (_, server) = sorted(one_per_worker(two).items())
    cch, sch = client.channel(), server.channel()
    sch.queue_declare("rpc")
    replies: list[bytes] = []
    cch.basic_consume("amq.rabbitmq.reply-to", lambda ch, m, p, body: replies.append(body),
                      auto_ack=True)
    cch.basic_publish("", "rpc", b"ping", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    wait_for(lambda: sch.queue_declare("rpc", passive=True).method.message_count == 1,
             what="request queued")
    _, props, body = sch.basic_get("rpc", auto_ack=True)
    assert body == b"ping" and props.reply_to.startswith("amq.rabbitmq.reply-to.")
    sch.queue_declare(props.reply_to, passive=True)  # held on the client's worker
    sch.basic_publish("", props.reply_to, b"pong")
    wait_for(lambda: client.process_data_events(0.1) or replies == [b"pong"],
             what="reply delivered")
    client.close()
    server.close()


def test_exclusive_consumers_hold_across_workers(two: WorkersBroker) -> None:
    """RabbitMQ's 403 "in exclusive use" between connections on different workers: the
    queue's home worker judges every basic.consume, the other waits for its answer."""
    (home_node, home), (_, other) = sorted(one_per_worker(two).items())
    home.channel().queue_declare("xw")
    assert two.node_of("xw") == home_node

    def consume(conn: pika.BlockingConnection, exclusive: bool) -> str:
        return str(conn.channel().basic_consume("xw", lambda *_: None, exclusive=exclusive))

    def refused(conn: pika.BlockingConnection, exclusive: bool) -> None:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            consume(conn, exclusive)
        assert info.value.reply_code == 403, info.value
        assert "in exclusive use" in info.value.reply_text

    held = other.channel()  # exclusive on the other worker than the queue's
    tag = held.basic_consume("xw", lambda *_: None, exclusive=True)
    refused(home, exclusive=False)
    refused(other, exclusive=False)
    held.basic_cancel(tag)
    plain = home.channel()  # a plain consumer on the home worker: no exclusive one elsewhere
    tag = plain.basic_consume("xw", lambda *_: None)
    refused(other, exclusive=True)
    plain.basic_cancel(tag)
    consume(other, exclusive=True)
    home.close()
    other.close()


def test_cancel_ok_follows_the_home_workers_removal(two: WorkersBroker) -> None:
    """RabbitMQ's cancel-ok comes after the queue has dropped the consumer, so a client's next
    basic.consume, on any connection, is judged without it. The queue's home worker is
    stopped while the other worker cancels its exclusive consumer: no cancel-ok until the
    home, resumed, has taken it off; then an exclusive consume at home is not refused."""
    (home_node, home), (_, other) = sorted(one_per_worker(two).items())
    home.channel().queue_declare("xc")
    held = other.channel()
    tag = held.basic_consume("xc", lambda *_: None, exclusive=True)
    home_pid = two.workers()[int(home_node.rsplit("-w", 1)[1])]
    os.kill(home_pid, signal.SIGSTOP)
    try:
        cancelling = threading.Thread(target=held.basic_cancel, args=(tag,))
        cancelling.start()
        cancelling.join(1.0)
        early = not cancelling.is_alive()
    finally:
        os.kill(home_pid, signal.SIGCONT)
    cancelling.join(10)
    assert not early, "cancel-ok came while the queue's home still held the consumer"
    assert not cancelling.is_alive(), "no cancel-ok after the home resumed"
    home.channel().basic_consume("xc", lambda *_: None, exclusive=True)
    home.close()
    other.close()


def test_shovels_to_this_server_log_in_on_any_worker(two: WorkersBroker) -> None:
    """A shovel's `amqp://` (this server, as the defining user, with the direct secret)
    connects to the shared port, so its source and destination land on either worker: the
    workers share the secret. Four shovels, eight connections: some cross workers; none
    tries again (reconnect-delay 0), so one refused login would leave its message behind."""
    conn = connect(two)
    ch = conn.channel()
    for i in range(4):
        ch.queue_declare(f"sv-src-{i}")
        ch.queue_declare(f"sv-dst-{i}")
        status, _ = two.api("PUT", f"/api/parameters/shovel/%2F/sv-{i}", {"value": {
            "src-uri": "amqp://", "src-queue": f"sv-src-{i}",
            "dest-uri": "amqp://", "dest-queue": f"sv-dst-{i}", "reconnect-delay": 0}})
        assert status == 201
        ch.basic_publish("", f"sv-src-{i}", b"moved")
    wait_for(lambda: all(ch.queue_declare(f"sv-dst-{i}", passive=True).method.message_count
                         == 1 for i in range(4)),
             what="every shovel moved its message")
    conn.close()


def test_delete_if_empty_or_unused_judges_the_home_queue(two: WorkersBroker) -> None:
    """queue.delete if-empty / if-unused (and the management API's) from another worker than
    the queue's: its messages and consumers are at home, so both are refused there too, and
    delete-ok counts the home's messages."""
    (_, home), (_, other) = sorted(one_per_worker(two).items())
    hch = home.channel()
    hch.queue_declare("keep-me")
    hch.confirm_delivery()
    hch.basic_publish("", "keep-me", b"m")
    for flags in ({"if_empty": True}, {"if_unused": True}):
        if "if_unused" in flags:
            hch.basic_consume("keep-me", lambda *_: None)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            other.channel().queue_delete("keep-me", **flags)
        assert refused.value.reply_code == 406
    status, _ = two.api("DELETE", "/api/queues/%2F/keep-me?if-unused=true")
    assert status == 400  # whichever worker answers
    assert hch.queue_declare("keep-me", passive=True).method.consumer_count == 1
    hch.queue_declare("count-me")
    for _ in range(3):
        hch.basic_publish("", "count-me", b"m")
    # delete-ok counts the messages deleted at home
    assert other.channel().queue_delete("count-me").method.message_count == 3
    for c in (home, other):
        c.close()


def test_connection_names_are_the_whole_servers(two: WorkersBroker) -> None:
    """Each worker numbers its connections; the names the management API lists (and
    /api/connections/{name} finds) carry the process, so no two workers' are alike and a
    close by name cannot reach another worker's namesake."""
    conns = [connect(two) for _ in range(6)]
    names = [c["name"] for c in two.get("/api/connections")]
    assert len(names) == 6 and len(set(names)) == 6, names
    for c in conns:
        c.close()


def test_metrics_are_the_whole_servers(two: WorkersBroker) -> None:
    """/metrics on the shared port: whichever worker is scraped, queues carry their home
    worker's counts and the node-wide figures are summed over the workers."""
    conns = _fill_one_queue_per_worker(two, "metric-", 3)
    for _ in range(6):
        status, _, text = two.raw("/metrics")
        assert status == 200
        lines = text.splitlines()
        assert 'rabbitmq_queue_messages_ready{queue="metric-w1",vhost="/"} 3.0' in lines
        assert 'rabbitmq_queue_messages_ready{queue="metric-w2",vhost="/"} 3.0' in lines
        assert "rabbitmq_connections 2.0" in lines
        assert "rabbitmq_global_messages_received_total 6.0" in lines
    for c in conns.values():
        c.close()

