"""The management API about one worker's objects, whichever worker of a 2-worker hare-server
answers the shared port: a connection by name (GET, its channels, DELETE), each worker's row
of /api/nodes with its own figures, login attempts by worker or by server, a vhost's message
counts, every worker's quarantined messages. Each request is repeated over fresh HTTP
connections so both workers answer some; with one object on each worker, every answer is
some object's other worker's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from broker.store.segment import scan_records
from tests.workers.helpers import WorkersBroker, connect, one_per_worker, wait_for

REPEAT = 6
NOT_YOURS = (401, "User not authorised to access object")


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkersBroker]:
    b = WorkersBroker(tmp_path_factory.mktemp("mgmt-workers") / "data", 2).start()
    for user, tags in (("mon", "monitoring"), ("mgr", "management")):
        assert b.api("PUT", f"/api/users/{user}", {"password": "pw", "tags": tags})[0] == 201
    yield b
    b.kill()


def _reason(answer: tuple[int, Any]) -> tuple[int, str]:
    status, body = answer
    return status, (body or {}).get("reason", "") if isinstance(body, dict) else ""


def test_a_connection_by_name_on_either_worker(two: WorkersBroker) -> None:
    """GET, its channels and DELETE find a connection on the other worker too (404 before);
    the other worker applies the same rules: a management user's 401 for a connection not
    its own, a monitoring user sees it and may not close it."""
    conns = one_per_worker(two)
    names = {c["node"]: c["name"] for c in two.get("/api/connections") if c["user"] == "guest"}
    assert sorted(names) == sorted(conns)
    for _ in range(REPEAT):
        for node, name in names.items():
            one = two.get(f"/api/connections/{name}")
            assert (one["name"], one["node"], one["channels"]) == (name, node, 1)
            [chan] = two.get(f"/api/connections/{name}/channels")
            assert (chan["connection_details"]["name"], chan["node"]) == (name, node)
            assert two.get(f"/api/connections/{name}", user="mon", password="pw")["node"] == node
            for method in ("GET", "DELETE"):
                assert _reason(two.api(method, f"/api/connections/{name}", user="mgr",
                                       password="pw")) == NOT_YOURS
            assert _reason(two.api("DELETE", f"/api/connections/{name}", user="mon",
                                   password="pw")) == NOT_YOURS
    for node, name in names.items():
        status, _ = two.api("DELETE", f"/api/connections/{name}",
                            headers={"X-Reason": f"maintenance of {node}"})
        assert status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            conns[node].process_data_events(time_limit=5)
        assert closed.value.reply_code == 320
        assert f"maintenance of {node}" in closed.value.reply_text
        wait_for(lambda name=name: two.api("GET", f"/api/connections/{name}")[0] == 404,
                 timeout=5, what=f"{name} gone")
        for _ in range(REPEAT):
            assert two.api("GET", f"/api/connections/{name}/channels")[0] == 404
            assert two.api("DELETE", f"/api/connections/{name}")[0] == 404


def test_every_workers_node_row_has_its_figures(two: WorkersBroker) -> None:
    """Each worker's row of /api/nodes, and /api/nodes/{name}, carries its own figures (the
    other worker's row had only what its card in the metadata store says)."""
    pids = sorted(two.serving_pids())
    for _ in range(REPEAT):
        nodes = two.get("/api/nodes")
        assert sorted(int(n["os_pid"]) for n in nodes) == pids
        for n in nodes:
            assert n["running"] is True and n["mem_used"] > 10_000_000, n
            assert n["disk_free_limit"] > 0 and n["disk_free"] > 0 and n["processors"] >= 1, n
            one = two.get(f"/api/nodes/{n['name']}")
            assert one["os_pid"] == n["os_pid"] and one["mem_used"] > 10_000_000, one
    assert two.api("GET", "/api/nodes/hare@elsewhere")[0] == 404


def _amqp_attempts(b: WorkersBroker, name: str) -> tuple[int, int, int]:
    for row in b.get(f"/api/auth/attempts/{name}"):
        if row["protocol"] == "amqp091":
            return (row["auth_attempts"], row["auth_attempts_failed"],
                    row["auth_attempts_succeeded"])
    return 0, 0, 0


def test_login_attempts_by_worker_and_by_server(two: WorkersBroker) -> None:
    """/api/auth/attempts/{worker} is that worker's whichever answers; the server's name sums
    its workers', as its one port takes the logins (a client cannot tell which worker)."""
    nodes = two.get("/api/nodes")
    server, workers = nodes[0]["server"], [n["name"] for n in nodes]
    assert len(workers) == 2 and {n["server"] for n in nodes} == {server}
    before = _amqp_attempts(two, server)
    for _ in range(4):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.URLParameters(
                two.url.replace("guest:guest", "guest:wrong") + "%2F?heartbeat=0"))
    connect(two).close()
    for _ in range(REPEAT):
        total = _amqp_attempts(two, server)
        assert [a - b for a, b in zip(total, before, strict=True)] == [5, 4, 1]
        parts = [_amqp_attempts(two, w) for w in workers]
        assert [sum(p[i] for p in parts) for i in range(3)] == list(total)
    assert two.api("GET", "/api/auth/attempts/hare@elsewhere")[0] == 404


def test_a_vhosts_message_counts_are_every_workers(two: WorkersBroker) -> None:
    """/api/vhosts and /api/vhosts/{name} count the messages of the queues on both workers
    (each worker counted its own queues' only)."""
    assert two.api("PUT", "/api/vhosts/depths", {})[0] == 201
    conn = pika.BlockingConnection(pika.URLParameters(two.url + "depths?heartbeat=0"))
    ch = conn.channel()
    ch.confirm_delivery()
    homes: dict[str, str] = {}
    for i in range(10):  # min-masters: the worker with the fewest queues takes the next one
        ch.queue_declare(f"d-{i}", arguments={"x-queue-master-locator": "min-masters"})
        homes[f"d-{i}"] = two.get(f"/api/queues/depths/d-{i}")["node"]
        if len(set(homes.values())) == 2:
            break
    assert len(set(homes.values())) == 2, homes
    for name in homes:
        for _ in range(5):
            ch.basic_publish("", name, b"m")
    total = 5 * len(homes)
    wait_for(lambda: two.get("/api/vhosts/depths")["messages"] == total, timeout=10,
             what="the vhost's count")
    for _ in range(REPEAT):
        one = two.get("/api/vhosts/depths")
        assert (one["messages"], one["messages_ready"], one["messages_unacknowledged"]) == (
            total, total, 0)
        [listed] = [v for v in two.get("/api/vhosts") if v["name"] == "depths"]
        assert listed["messages"] == total
    conn.close()


def test_the_aliveness_test_queue_is_the_servers(two: WorkersBroker) -> None:
    """/api/aliveness-test declares its queue in the cluster, as a PUT does: one queue,
    which every worker finds (each worker declared one of its own, unknown to the other)."""
    for _ in range(REPEAT):
        assert two.api("GET", "/api/aliveness-test/%2F") == (200, {"status": "ok"})
        q = two.get("/api/queues/%2F/aliveness-test")
        assert (q["messages"], q["durable"]) == (0, False)
    assert [q["name"] for q in two.get("/api/queues/%2F")].count("aliveness-test") == 1


def test_every_workers_quarantined_messages_are_listed(tmp_path: Path) -> None:
    """A damaged body in each worker's store: /api/quarantine lists both, each with its
    worker, and /metrics counts both (each worker listed and counted its own store's only)."""
    b = WorkersBroker(tmp_path / "data", 2).start()
    try:
        conns = one_per_worker(b)
        for node, conn in conns.items():  # a durable queue on each worker, 3 bodies in its
            ch = conn.channel()           # store (8 KB: not embedded in the queue index)
            ch.confirm_delivery()
            ch.queue_declare(f"q-{node}", durable=True)
            for i in range(3):
                ch.basic_publish("", f"q-{node}", bytes([65 + i]) * 8192,
                                 pika.BasicProperties(delivery_mode=2))
            conn.close()
        assert b.stop() == 0
        damaged = {}
        for node in conns:  # 64 bytes overwritten in the middle of the second record
            store = b.queue_dir(f"q-{node}").parent.parent / "msg_store_persistent"
            [segment] = sorted(store.glob("*.hseg"))
            raw = bytearray(segment.read_bytes())
            msg_id, offset, size = sorted(scan_records(bytes(raw)).records,
                                          key=lambda r: r[1])[1]
            raw[offset + size // 2: offset + size // 2 + 64] = b"\xee" * 64
            segment.write_bytes(bytes(raw))
            damaged[f"{msg_id:032x}"] = (node, f"q-{node}")
        b.start()
        conn = connect(b)
        ch = conn.channel()
        for node in conns:
            bodies = []
            while (got := ch.basic_get(f"q-{node}", auto_ack=True))[0] is not None:
                bodies.append(got[2][:1])
            assert bodies == [b"A", b"C"]
        for _ in range(REPEAT):
            listed = b.get("/api/quarantine")
            assert {m["msg_id"]: m["queue"] for m in listed} == {
                msg_id: queue for msg_id, (_, queue) in damaged.items()}
            assert {m["msg_id"]: (m["node"], m["queue"]) for m in listed} == damaged
            # and /metrics counts both workers' stores
            assert 'hare_store_quarantined_messages{store="persistent"} 2.0' in (
                b.raw("/metrics")[2].splitlines())
        conn.close()
    finally:
        b.kill()


def test_an_http_publish_is_answered_once_its_queue_has_it(two: WorkersBroker) -> None:
    """A publish through one worker to a queue homed on the other is answered after the home
    took it (as RabbitMQ's answers after its publisher confirm), so a get right after, which
    may land on the home directly, finds it; before, the get could beat the link."""
    assert two.api("PUT", "/api/queues/%2F/http-pub", {"durable": True})[0] == 201
    body = "x" * (256 * 1024)
    for i in range(2 * REPEAT):
        status, answer = two.api("POST", "/api/exchanges/%2F/amq.default/publish", {
            "routing_key": "http-pub", "payload": f"{i}{body}", "payload_encoding": "string",
            "properties": {"delivery_mode": 2}})
        assert (status, answer) == (200, {"routed": True})
        status, got = two.api("POST", "/api/queues/%2F/http-pub/get", {
            "count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
        assert status == 200 and [m["payload"] for m in got] == [f"{i}{body}"]
