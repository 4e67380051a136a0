"""Per-vhost limits (/api/vhost-limits; max-connections and max-queues refused over AMQP as
RabbitMQ refuses them) and the health checks monitoring calls, with RabbitMQ 3.10.8's status
codes and JSON (checked against a real RabbitMQ)."""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.amqp_raw import RawClient

from .helpers import MgmtBroker


def test_vhost_limits_api(mgmt: MgmtBroker) -> None:
    mgmt.api("PUT", "/api/vhosts/lim-api", {})
    assert mgmt.get("/api/vhost-limits/lim-api") == []
    assert mgmt.api("PUT", "/api/vhost-limits/lim-api/max-queues", {"value": 3})[0] == 204
    assert mgmt.api("PUT", "/api/vhost-limits/lim-api/max-connections", {"value": -1})[0] == 204
    want = {"vhost": "lim-api", "value": {"max-queues": 3, "max-connections": -1}}
    assert mgmt.get("/api/vhost-limits/lim-api") == [want]
    assert want in mgmt.get("/api/vhost-limits")
    for name, body, reason in (
            ("max-queues", {"value": "a"},
             'Validation failed\n\nmax-queues should be a number, actually was <<"a">>\n'),
            ("max-queues", {}, "[{key_missing,value}]"),
            ("bogus", {"value": 3},
             'Validation failed\n\nUnrecognised terms [{<<"bogus">>,3}] in limits\n')):
        assert mgmt.api("PUT", f"/api/vhost-limits/lim-api/{name}", body) == (
            400, {"error": "bad_request", "reason": reason})
    assert mgmt.api("DELETE", "/api/vhost-limits/lim-api/max-queues")[0] == 204
    assert mgmt.api("DELETE", "/api/vhost-limits/lim-api/max-queues")[0] == 204  # as RabbitMQ
    assert mgmt.get("/api/vhost-limits/lim-api") == [
        {"vhost": "lim-api", "value": {"max-connections": -1}}]
    assert mgmt.api("GET", "/api/vhost-limits/nosuch")[0] == 404
    mgmt.api("DELETE", "/api/vhosts/lim-api")


def test_max_connections_refuses_with_530(mgmt: MgmtBroker) -> None:
    mgmt.api("PUT", "/api/vhosts/lim-conn", {})
    mgmt.api("PUT", "/api/vhost-limits/lim-conn/max-connections", {"value": 1})
    params = pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{mgmt.port}/lim-conn")
    first = pika.BlockingConnection(params)
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        pika.BlockingConnection(params)
    assert ('(530) "NOT_ALLOWED - access to vhost \'lim-conn\' refused for user \'guest\': '
            'connection limit (1) is reached"') in str(refused.value)
    # another vhost is not limited, and the limit counts open connections only
    pika.BlockingConnection(pika.URLParameters(mgmt.url)).close()
    first.close()
    pika.BlockingConnection(params).close()
    mgmt.api("PUT", "/api/vhost-limits/lim-conn/max-connections", {"value": 0})
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError, match="limit \\(0\\)"):
        pika.BlockingConnection(params)
    mgmt.api("DELETE", "/api/vhosts/lim-conn")


def test_max_queues_refuses_new_queues_with_406(mgmt: MgmtBroker) -> None:
    mgmt.api("PUT", "/api/vhosts/lim-q", {})
    mgmt.api("PUT", "/api/vhost-limits/lim-q/max-queues", {"value": 1})
    conn = pika.BlockingConnection(
        pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{mgmt.port}/lim-q"))
    ch = conn.channel()
    ch.queue_declare("first")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.queue_declare("second")
    assert refused.value.reply_code == 406
    assert refused.value.reply_text == ("PRECONDITION_FAILED - cannot declare queue 'second': "
                                        "queue limit in vhost 'lim-q' (1) is reached")
    ch = conn.channel()
    ch.queue_declare("first")  # an existing queue may be declared again
    ch.queue_declare("first", passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch.queue_declare("", exclusive=True)  # server-named queues count too
    status, reply = mgmt.api("PUT", "/api/queues/lim-q/third", {"durable": True})
    assert status == 400 and "queue limit in vhost 'lim-q' (1) is reached" in reply["reason"]
    mgmt.api("DELETE", "/api/vhost-limits/lim-q/max-queues")
    conn.channel().queue_declare("second")
    conn.close()
    mgmt.api("DELETE", "/api/vhosts/lim-q")


def test_health_checks_when_healthy(mgmt: MgmtBroker) -> None:
    for path in ("/api/health/checks/local-alarms", "/api/health/checks/alarms",
                 "/api/health/checks/virtual-hosts", "/api/healthchecks/node"):
        assert mgmt.api("GET", path) == (200, {"status": "ok"}), path
    assert mgmt.api("GET", f"/api/health/checks/port-listener/{mgmt.port}") == (
        200, {"status": "ok", "port": mgmt.port})
    assert mgmt.api("GET", f"/api/health/checks/port-listener/{mgmt.mgmt_port}")[0] == 200
    status, reply = mgmt.api("GET", "/api/health/checks/port-listener/1")
    assert (status, reply["status"], reply["reason"], reply["missing"]) == (
        503, "failed", "No active listener", 1)
    assert sorted(reply["ports"]) == sorted([mgmt.port, mgmt.mgmt_port])
    assert mgmt.api("GET", "/api/health/checks/port-listener/abc") == (
        400, {"error": "bad_request", "reason": "Invalid port"})


def test_aliveness_test(mgmt: MgmtBroker) -> None:
    assert mgmt.api("GET", "/api/aliveness-test/%2F") == (200, {"status": "ok"})
    assert mgmt.api("GET", "/api/aliveness-test/%2F") == (200, {"status": "ok"})
    # as RabbitMQ 3.10: the queue stays, empty and not durable
    q = mgmt.get("/api/queues/%2F/aliveness-test")
    assert (q["messages"], q["durable"]) == (0, False)
    assert mgmt.api("GET", "/api/aliveness-test/nosuch")[0] == 404
    mgmt.api("PUT", "/api/users/alive-mon", {"password": "pw", "tags": "monitoring"})
    assert mgmt.api("GET", "/api/aliveness-test/%2F", user="alive-mon", password="pw") == (
        401, {"error": "not_authorised", "reason": "User not authorised to access virtual host"})
    mgmt.api("PUT", "/api/permissions/%2F/alive-mon", {"configure": ".*", "write": ".*",
                                                       "read": ".*"})
    assert mgmt.api("GET", "/api/aliveness-test/%2F", user="alive-mon", password="pw")[0] == 200
    mgmt.api("DELETE", "/api/users/alive-mon")


def test_alarm_checks_fail_with_503_while_an_alarm_is_in_effect(tmp_path: Path) -> None:
    b = MgmtBroker(tmp_path / "alarm", ["--disk-free-limit", str(10**18)]).start()
    try:
        nodes = sorted(n["name"] for n in b.get("/api/nodes"))  # each worker at workers > 1

        def check(path: str) -> tuple[int, dict]:
            return b.api("GET", path)

        def cluster_alarms() -> list[dict]:
            return sorted(check("/api/health/checks/alarms")[1].get("alarms", []),
                          key=lambda a: a["node"])

        alarms = [{"resource": "disk space", "node": node} for node in nodes]
        deadline = time.monotonic() + 5
        while cluster_alarms() != alarms:  # each node's first disk check
            assert time.monotonic() < deadline, "no disk alarm"
            time.sleep(0.02)
        status, local = check("/api/health/checks/local-alarms")  # the answering node's
        assert (status, local["status"], local["reason"]) == (
            503, "failed", "There are alarms in effect on the node")
        assert len(local["alarms"]) == 1 and local["alarms"][0] in alarms
        status, cluster = check("/api/health/checks/alarms")
        assert (status, cluster["status"], cluster["reason"]) == (
            503, "failed", "There are alarms in effect in the cluster")
        assert check("/api/health/checks/virtual-hosts")[0] == 200
        # a connection is "blocking" until it publishes under the alarm, then "blocked"
        c = RawClient(b.port)
        c.handshake()
        c.open_channel(1)
        assert [x["state"] for x in b.get("/api/connections")] == ["blocking"]
        c.send_method(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
        c.send_content(1, b"x")
        c.expect(commands.Connection.Blocked, 0)
        assert [x["state"] for x in b.get("/api/connections")] == ["blocked"]
        c.close()
    finally:
        b.stop()
