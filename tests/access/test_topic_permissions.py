"""Topic permissions: per exchange, a write pattern on the routing keys a user publishes with
(CC and BCC keys too, as RabbitMQ 4.0.3+) and a read pattern on the keys it binds with, with
{username} and {vhost} expanded; set, listed, cleared, exported and imported over HTTP."""

from __future__ import annotations

import pika

from tests.mgmt.helpers import MgmtBroker

from .helpers import PASSWORD, connect, make_user, make_vhost, q, refused

TOPIC_DENIED = "access to topic '{key}' in exchange 'amq.topic' in vhost '{vhost}' refused " \
               "for user '{user}'"


def _set(mgmt: MgmtBroker, user: str, vhost: str, exchange: str, write: str, read: str) -> int:
    status, _ = mgmt.api("PUT", f"/api/topic-permissions/{q(vhost)}/{user}",
                         {"exchange": exchange, "write": write, "read": read})
    return status


def test_publish_and_bind_keys_are_checked(mgmt: MgmtBroker) -> None:
    vhost = make_vhost(mgmt)
    user = make_user(mgmt, "top", tags="management", perms={vhost: (".*", ".*", ".*")})
    assert _set(mgmt, user, vhost, "amq.topic", "^{username}\\.", "^r\\.{vhost}") == 201
    ch = connect(mgmt, user, vhost=vhost).channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(queue, "amq.topic", f"r.{vhost}.x")
    ch.basic_publish("amq.topic", f"{user}.a", b"ok")
    ch.basic_publish("amq.fanout", "anything", b"other exchanges are not checked")
    ch.basic_publish("amq.direct", "anything", b"nor non-topic exchanges")
    refused(ch, lambda c: c.basic_publish("amq.topic", "other.a", b"x"),
            TOPIC_DENIED.format(key="other.a", vhost=vhost, user=user))
    for header in ("CC", "BCC"):
        ch = ch.connection.channel()
        props = pika.BasicProperties(headers={header: ["other.b"]})
        refused(ch, lambda c, p=props: c.basic_publish("amq.topic", f"{user}.a", b"x", p),
                TOPIC_DENIED.format(key="other.b", vhost=vhost, user=user))
    ch = ch.connection.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    refused(ch, lambda c: c.queue_bind(queue, "amq.topic", "r.other"),
            TOPIC_DENIED.format(key="r.other", vhost=vhost, user=user))
    ch = ch.connection.channel()
    ch.exchange_declare("tx-" + user, "topic", auto_delete=True)
    refused(ch, lambda c: c.exchange_bind("tx-" + user, "amq.topic", "r.other"),
            TOPIC_DENIED.format(key="r.other", vhost=vhost, user=user))

    # narrowed while open: the channel's cache follows, as for other permissions
    ch = connect(mgmt, user, vhost=vhost).channel()
    ch.basic_publish("amq.topic", f"{user}.a", b"ok")
    assert _set(mgmt, user, vhost, "amq.topic", "^nothing$", "^r\\.{vhost}") == 204
    refused(ch, lambda c: c.basic_publish("amq.topic", f"{user}.a", b"x"))

    # over HTTP too (RabbitMQ's answer to a refused publish: 400 with the channel's 403)
    status, body = mgmt.api("POST", f"/api/exchanges/{q(vhost)}/amq.topic/publish",
                            {"routing_key": f"{user}.a", "payload": "x",
                             "payload_encoding": "string",
                             "properties": {"headers": {"CC": ["other.c"]}}},
                            user=user, password=PASSWORD)
    assert (status, body["reason"]) == (400, "403 ACCESS_REFUSED - " + TOPIC_DENIED.format(
        key=f"{user}.a", vhost=vhost, user=user))


def test_api_list_clear_export_import(mgmt: MgmtBroker) -> None:
    vhost = make_vhost(mgmt)
    user = make_user(mgmt, "top", perms={vhost: (".*", ".*", ".*")})
    assert _set(mgmt, user, vhost, "amq.topic", "^a", "^b") == 201
    assert _set(mgmt, user, vhost, "x2", "^c", "^d") == 204
    want = [{"user": user, "vhost": vhost, "exchange": "amq.topic", "write": "^a", "read": "^b"},
            {"user": user, "vhost": vhost, "exchange": "x2", "write": "^c", "read": "^d"}]
    for path in (f"/api/topic-permissions/{q(vhost)}/{user}",
                 f"/api/users/{user}/topic-permissions",
                 f"/api/vhosts/{q(vhost)}/topic-permissions"):
        assert mgmt.get(path) == want, path
    assert all(row in mgmt.get("/api/topic-permissions") for row in want)
    status, body = mgmt.api("PUT", f"/api/topic-permissions/{q(vhost)}/{user}",
                            {"exchange": "x", "write": "(", "read": ""})
    assert status == 400 and "regular expression" in body["reason"]
    status, body = mgmt.api("PUT", f"/api/topic-permissions/{q(vhost)}/nobody",
                            {"exchange": "x", "write": "", "read": ""})
    assert (status, body["reason"]) == (400, "vhost_or_user_not_found")
    status, body = mgmt.api("PUT", f"/api/topic-permissions/{q(vhost)}/{user}", {"write": ""})
    assert (status, body["reason"]) == (400, "[{key_missing,exchange}]")

    defs = mgmt.get("/api/definitions")
    assert all(row in defs["topic_permissions"] for row in want)
    assert mgmt.api("DELETE", f"/api/topic-permissions/{q(vhost)}/{user}?exchange=x2")[0] == 204
    assert mgmt.get(f"/api/topic-permissions/{q(vhost)}/{user}") == want[:1]
    assert mgmt.api("DELETE", f"/api/topic-permissions/{q(vhost)}/{user}")[0] == 204
    assert mgmt.api("GET", f"/api/topic-permissions/{q(vhost)}/{user}")[0] == 404
    assert mgmt.api("DELETE", f"/api/topic-permissions/{q(vhost)}/{user}")[0] == 404

    # an import brings them back, and they are enforced
    assert mgmt.api("POST", "/api/definitions", {"topic_permissions": want})[0] == 204
    assert mgmt.get(f"/api/topic-permissions/{q(vhost)}/{user}") == want
    ch = connect(mgmt, user, vhost=vhost).channel()
    refused(ch, lambda c: c.basic_publish("amq.topic", "z", b"x"), "access to topic 'z'")


def test_topic_permissions_survive_a_restart(mgmt: MgmtBroker) -> None:
    vhost = make_vhost(mgmt)
    user = make_user(mgmt, "top", perms={vhost: (".*", ".*", ".*")})
    assert _set(mgmt, user, vhost, "amq.topic", "^keep", "") == 201
    assert mgmt.api("PUT", f"/api/user-limits/{user}/max-channels", {"value": 7})[0] == 204
    mgmt.restart()
    assert mgmt.get(f"/api/topic-permissions/{q(vhost)}/{user}")[0]["write"] == "^keep"
    assert mgmt.get(f"/api/user-limits/{user}") == [{"user": user,
                                                    "value": {"max-channels": 7}}]
    ch = connect(mgmt, user, vhost=vhost).channel()
    refused(ch, lambda c: c.basic_publish("amq.topic", "lost", b"x"), "access to topic 'lost'")
