"""Policies and operator policies end to end: /api/policies and /api/operator-policies with
RabbitMQ's paths, codes and JSON, applied live to queues and exchanges that AMQP clients
(pika) use, resolved against client arguments as RabbitMQ 3.10.8 does (each case below was
run against a real RabbitMQ first), durable, exported and imported."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from .helpers import MgmtBroker

_n = itertools.count(1)


def uniq(prefix: str) -> str:
    return f"{prefix}{next(_n)}"


def wait_until(check: Callable[[], Any], what: str, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"condition not met: {what}"
        time.sleep(0.02)


@pytest.fixture
def channel(mgmt: MgmtBroker) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.URLParameters(mgmt.url))
    yield conn.channel()
    conn.close()


def put_policy(b: MgmtBroker, name: str, body: dict[str, Any], *, operator: bool = False,
               vhost: str = "%2F") -> int:
    kind = "operator-policies" if operator else "policies"
    status, reply = b.api("PUT", f"/api/{kind}/{vhost}/{name}", body)
    assert status in (201, 204), reply
    return status


def count(ch: Any, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def bodies(ch: Any, queue: str) -> list[bytes]:
    out = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def test_paths_status_codes_and_json(mgmt: MgmtBroker) -> None:
    body = {"pattern": "^api-q", "definition": {"message-ttl": 5000, "max-length": 10},
            "priority": 1, "apply-to": "queues"}
    assert put_policy(mgmt, "api-p", body) == 201
    assert put_policy(mgmt, "api-p", body) == 204
    want = {"vhost": "/", "name": "api-p", "pattern": "^api-q", "apply-to": "queues",
            "definition": {"max-length": 10, "message-ttl": 5000}, "priority": 1}
    assert mgmt.get("/api/policies/%2F/api-p") == want
    assert want in mgmt.get("/api/policies") and want in mgmt.get("/api/policies/%2F")
    # the operator policies are another namespace
    assert mgmt.api("GET", "/api/operator-policies/%2F/api-p")[0] == 404
    assert put_policy(mgmt, "api-p", {"pattern": "^api-q", "definition": {"max-length": 5}},
                      operator=True) == 201
    assert mgmt.get("/api/operator-policies/%2F/api-p")["apply-to"] == "all"
    assert mgmt.api("DELETE", "/api/operator-policies/%2F/api-p")[0] == 204
    assert mgmt.api("DELETE", "/api/policies/%2F/api-p")[0] == 204
    assert mgmt.api("DELETE", "/api/policies/%2F/api-p") == (
        404, {"error": "Object Not Found", "reason": "Not Found"})
    assert mgmt.api("GET", "/api/policies/nosuch")[0] == 404
    assert mgmt.api("PUT", "/api/policies/nosuch/p", body)[0] == 404
    status, reply = mgmt.api("PUT", "/api/policies/%2F/bad",
                             {"pattern": "^x", "definition": {"max-length": -1}})
    assert (status, reply) == (400, {"error": "bad_request", "reason":
                                     "Validation failed\n\n-1 is not a valid maximum length\n"})
    status, reply = mgmt.api("PUT", "/api/operator-policies/%2F/bad",
                             {"pattern": "^x", "definition": {"overflow": "reject-publish"}})
    assert status == 400 and "are not recognised policy settings" in reply["reason"]


def test_a_policy_applies_to_existing_queues_at_once_and_goes_with_clear(
        mgmt: MgmtBroker, channel: Any) -> None:
    q = uniq("live-q")
    channel.queue_declare(q)
    for i in range(5):
        channel.basic_publish("", q, str(i).encode())
    put_policy(mgmt, q, {"pattern": f"^{q}$", "definition": {"max-length": 2}})
    assert count(channel, q) == 2  # drop-head: the oldest went, as RabbitMQ
    info = mgmt.get(f"/api/queues/%2F/{q}")
    assert (info["policy"], info["operator_policy"], info["effective_policy_definition"]) == (
        q, None, {"max-length": 2})
    assert mgmt.api("DELETE", f"/api/policies/%2F/{q}")[0] == 204
    for i in range(5, 10):
        channel.basic_publish("", q, str(i).encode())
    assert bodies(channel, q) == [b"3", b"4", b"5", b"6", b"7", b"8", b"9"]
    info = mgmt.get(f"/api/queues/%2F/{q}")
    assert (info["policy"], info["effective_policy_definition"]) == (None, {})
    channel.queue_delete(q)


def test_client_arguments_and_policy_resolve_as_rabbitmq(mgmt: MgmtBroker,
                                                           channel: Any) -> None:
    """max-length: the smaller; overflow and dead-letter-exchange: the argument's."""
    p = uniq("res")
    for x in ("dlx-pol", "dlx-arg"):
        channel.exchange_declare(f"{p}-{x}", "fanout")
        channel.queue_declare(f"{p}-{x}-q")
        channel.queue_bind(f"{p}-{x}-q", f"{p}-{x}")
    put_policy(mgmt, p, {"pattern": f"^{p}-[ab]$", "definition": {
        "max-length": 3, "overflow": "reject-publish", "dead-letter-exchange": f"{p}-dlx-pol"}})
    channel.queue_declare(f"{p}-a", arguments={
        "x-max-length": 5, "x-overflow": "drop-head", "x-dead-letter-exchange": f"{p}-dlx-arg"})
    channel.queue_declare(f"{p}-b", arguments={"x-max-length": 2})
    for i in range(6):
        channel.basic_publish("", f"{p}-a", str(i).encode())
        channel.basic_publish("", f"{p}-b", str(i).encode())
    # a: limit 3 (policy's, smaller), drop-head (argument's), dead-lettered to the argument's
    assert bodies(channel, f"{p}-a") == [b"3", b"4", b"5"]
    assert bodies(channel, f"{p}-dlx-arg-q") == [b"0", b"1", b"2"]
    # b: limit 2 (argument's, smaller), reject-publish (policy's): the newest were refused
    assert bodies(channel, f"{p}-b") == [b"0", b"1"]
    assert count(channel, f"{p}-dlx-pol-q") == 0


def test_operator_policy_wins_only_where_it_is_stricter(mgmt: MgmtBroker,
                                                         channel: Any) -> None:
    q = uniq("op-q")
    put_policy(mgmt, q, {"pattern": f"^{q}", "definition": {"max-length": 50,
                                                           "message-ttl": 5000}})
    put_policy(mgmt, q, {"pattern": f"^{q}", "definition": {"max-length": 3,
                                                           "message-ttl": 60000}},
               operator=True)
    channel.queue_declare(q, arguments={"x-max-length": 100})
    for i in range(5):
        channel.basic_publish("", q, str(i).encode())
    assert count(channel, q) == 3
    info = mgmt.get(f"/api/queues/%2F/{q}")
    assert (info["policy"], info["operator_policy"]) == (q, q)
    assert info["effective_policy_definition"] == {"max-length": 3, "message-ttl": 5000}
    assert info["arguments"] == {"x-max-length": 100}  # what the client declared
    # a looser operator policy does not lift the client's own limit
    put_policy(mgmt, q, {"pattern": f"^{q}", "definition": {"max-length": 1000}},
               operator=True)
    channel.queue_declare(f"{q}-tight", arguments={"x-max-length": 1})
    for i in range(3):
        channel.basic_publish("", f"{q}-tight", str(i).encode())
    assert bodies(channel, f"{q}-tight") == [b"2"]
    mgmt.api("DELETE", f"/api/policies/%2F/{q}")
    mgmt.api("DELETE", f"/api/operator-policies/%2F/{q}")


def test_message_ttl_and_dead_lettering_from_a_policy(mgmt: MgmtBroker,
                                                      channel: Any) -> None:
    q = uniq("ttl-q")
    channel.exchange_declare(f"{q}-dlx", "fanout")
    channel.queue_declare(f"{q}-dead")
    channel.queue_bind(f"{q}-dead", f"{q}-dlx")
    put_policy(mgmt, q, {"pattern": f"^{q}$", "apply-to": "queues", "definition": {
        "message-ttl": 1, "dead-letter-exchange": f"{q}-dlx",
        "dead-letter-routing-key": "expired"}})
    channel.queue_declare(q)
    channel.basic_publish("", q, b"short-lived")

    def dead() -> Any:
        method, props, body = channel.basic_get(f"{q}-dead", auto_ack=True)
        return (method, props, body) if method is not None else None

    method, props, body = wait_until(dead, "the expired message dead-lettered")
    assert body == b"short-lived" and method.routing_key == "expired"
    assert props.headers["x-death"][0]["reason"] == "expired"
    assert count(channel, q) == 0


def test_expires_from_a_policy_deletes_the_unused_queue(mgmt: MgmtBroker,
                                                         channel: Any) -> None:
    q = uniq("exp-q")
    channel.queue_declare(q)
    put_policy(mgmt, q, {"pattern": f"^{q}$", "definition": {"expires": 50}})
    wait_until(lambda: mgmt.api("GET", f"/api/queues/%2F/{q}")[0] == 404,
               "the queue expired")
    mgmt.api("DELETE", f"/api/policies/%2F/{q}")


def test_alternate_exchange_from_a_policy_the_argument_wins(mgmt: MgmtBroker,
                                                            channel: Any) -> None:
    p = uniq("ae")
    for x in ("ae-pol", "ae-arg"):
        channel.exchange_declare(f"{p}-{x}", "fanout")
        channel.queue_declare(f"{p}-{x}-q")
        channel.queue_bind(f"{p}-{x}-q", f"{p}-{x}")
    channel.exchange_declare(f"{p}-x-a", "direct", arguments={"alternate-exchange":
                                                               f"{p}-ae-arg"})
    channel.exchange_declare(f"{p}-x-b", "direct")
    put_policy(mgmt, p, {"pattern": f"^{p}-x-", "apply-to": "exchanges",
                         "definition": {"alternate-exchange": f"{p}-ae-pol"}})
    channel.basic_publish(f"{p}-x-a", "nowhere", b"a")
    channel.basic_publish(f"{p}-x-b", "nowhere", b"b")
    assert bodies(channel, f"{p}-ae-arg-q") == [b"a"]
    assert bodies(channel, f"{p}-ae-pol-q") == [b"b"]
    assert mgmt.get(f"/api/exchanges/%2F/{p}-x-b")["policy"] == p
    assert "policy" not in mgmt.get(f"/api/exchanges/%2F/{p}-ae-pol")  # as RabbitMQ
    # apply-to exchanges: queues are untouched
    assert mgmt.get(f"/api/queues/%2F/{p}-ae-pol-q")["policy"] is None
    mgmt.api("DELETE", f"/api/policies/%2F/{p}")
    channel.basic_publish(f"{p}-x-b", "nowhere", b"c")  # no alternate exchange any more
    channel.basic_publish(f"{p}-x-a", "nowhere", b"d")  # a round trip: both are routed
    assert bodies(channel, f"{p}-ae-arg-q") == [b"d"]
    assert bodies(channel, f"{p}-ae-pol-q") == []


def test_highest_priority_policy_applies(mgmt: MgmtBroker, channel: Any) -> None:
    q = uniq("prio-q")
    put_policy(mgmt, f"{q}-low", {"pattern": f"^{q}", "definition": {"max-length": 1}})
    put_policy(mgmt, f"{q}-high", {"pattern": f"^{q}", "definition": {"max-length": 2},
                                   "priority": 10})
    channel.queue_declare(q)
    for i in range(4):
        channel.basic_publish("", q, str(i).encode())
    assert count(channel, q) == 2
    assert mgmt.get(f"/api/queues/%2F/{q}")["policy"] == f"{q}-high"
    mgmt.api("DELETE", f"/api/policies/%2F/{q}-high")
    assert mgmt.get(f"/api/queues/%2F/{q}")["policy"] == f"{q}-low"
    assert count(channel, q) == 1  # the remaining policy's limit applies at once
    mgmt.api("DELETE", f"/api/policies/%2F/{q}-low")


@pytest.mark.parametrize("via", ["policy", "argument"])
def test_lazy_queue_mode_keeps_bodies_out_of_ram(mgmt: MgmtBroker, channel: Any,
                                                 via: str) -> None:
    q = uniq("lazy-q")
    if via == "policy":
        put_policy(mgmt, q, {"pattern": f"^{q}$", "definition": {"queue-mode": "lazy"}})
        channel.queue_declare(q)
    else:
        channel.queue_declare(q, arguments={"x-queue-mode": "lazy"})
    for i in range(20):
        channel.basic_publish("", q, str(i).encode())
    assert count(channel, q) == 20
    info = mgmt.get(f"/api/queues/%2F/{q}")
    assert info["backing_queue_status"]["mode"] == "lazy"
    assert info["messages_ram"] == 0 and info["messages_paged_out"] == 20
    assert bodies(channel, q) == [str(i).encode() for i in range(20)]
    if via == "policy":
        mgmt.api("DELETE", f"/api/policies/%2F/{q}")
        channel.basic_publish("", q, b"back in ram")
        assert count(channel, q) == 1
        info = mgmt.get(f"/api/queues/%2F/{q}")
        assert info["backing_queue_status"]["mode"] == "default"
        assert info["messages_ram"] == 1
    channel.queue_delete(q)


def test_policies_limits_survive_restart_and_travel_in_definitions(tmp_path: Path) -> None:
    b = MgmtBroker(tmp_path / "one").start()
    other = MgmtBroker(tmp_path / "two").start()
    try:
        put_policy(b, "keep", {"pattern": "^kept", "definition": {"max-length": 1},
                               "apply-to": "queues", "priority": 2})
        put_policy(b, "cap", {"pattern": "^kept", "definition": {"message-ttl": 60000}},
                   operator=True)
        assert b.api("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 10})[0] == 204
        b.api("PUT", "/api/queues/%2F/kept-q", {"durable": True})
        b.stop()
        b.start()
        assert b.get("/api/policies/%2F/keep")["priority"] == 2
        assert b.get("/api/operator-policies/%2F/cap")["definition"] == {"message-ttl": 60000}
        assert b.get("/api/vhost-limits/%2F") == [{"vhost": "/", "value": {"max-queues": 10}}]
        info = b.get("/api/queues/%2F/kept-q")
        assert (info["policy"], info["operator_policy"]) == ("keep", "cap")

        defs = b.get("/api/definitions")
        assert defs["policies"] == [{"vhost": "/", "name": "keep", "pattern": "^kept",
                                     "apply-to": "queues", "definition": {"max-length": 1},
                                     "priority": 2}]
        assert {"value": {"pattern": "^kept", "definition": {"message-ttl": 60000},
                          "priority": 0, "apply-to": "all"},
                "vhost": "/", "component": "operator_policy", "name": "cap"} in defs[
            "parameters"]
        assert {"value": {"max-queues": 10}, "vhost": "/", "component": "vhost-limits",
                "name": "limits"} in defs["parameters"]
        assert other.api("POST", "/api/definitions", defs)[0] == 204
        assert other.get("/api/policies") == defs["policies"]
        assert other.get("/api/operator-policies/%2F/cap")["definition"] == {
            "message-ttl": 60000}
        assert other.get("/api/vhost-limits/%2F")[0]["value"] == {"max-queues": 10}
        conn = pika.BlockingConnection(pika.URLParameters(other.url))
        ch = conn.channel()
        for i in range(3):  # the imported policy applies to the imported queue
            ch.basic_publish("", "kept-q", str(i).encode())
        assert bodies(ch, "kept-q") == [b"2"]
        conn.close()
        # a bad policy in an import is refused with its reason
        status, reply = other.api("POST", "/api/definitions", {"policies": [
            {"vhost": "/", "name": "bad", "pattern": "^x", "definition": {"expires": 0}}]})
        assert status == 400 and "0 is not a valid queue expiry" in reply["reason"]
        b.api("DELETE", "/api/policies/%2F/keep")
        b.stop()
        b.start()
        assert b.api("GET", "/api/policies/%2F/keep")[0] == 404
    finally:
        b.stop()
        other.stop()
