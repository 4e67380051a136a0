"""Dead-letter and alternate exchanges: declaring a queue or exchange that makes the broker
publish into another exchange needs write on that exchange (and read on what is declared), as
RabbitMQ 3.10.8 checks at declare, over AMQP and over HTTP; a refusal creates nothing."""

from __future__ import annotations

from tests.mgmt.helpers import MgmtBroker

from .helpers import PASSWORD, connect, make_user, make_vhost, q, refused


def test_dead_letter_exchange_needs_write_and_read(mgmt: MgmtBroker) -> None:
    vhost = make_vhost(mgmt)
    app = make_user(mgmt, "app", perms={vhost: ("^app", "^app", "^app")})
    # configure everything, write/read only app*: read on the queue is what is missing
    cfg = make_user(mgmt, "cfg", perms={vhost: (".*", "^app", "^app")})
    admin = connect(mgmt, vhost=vhost).channel()
    admin.exchange_declare("other-x", "fanout")
    admin.exchange_declare("app-x", "fanout")

    ch = connect(mgmt, app, vhost=vhost).channel()
    refused(ch, lambda c: c.queue_declare("app-q", arguments={"x-dead-letter-exchange": "other-x"}),
            f"access to exchange 'other-x' in vhost '{vhost}' refused for user '{app}'")
    ch = ch.connection.channel()  # other channels of the connection carry on
    refused(ch, lambda c: c.queue_declare("app-q", arguments={"x-dead-letter-exchange": ""}),
            "access to exchange 'amq.default'")
    ch = ch.connection.channel()
    ch.queue_declare("app-ok", arguments={"x-dead-letter-exchange": "app-x"}, auto_delete=True)
    ch = connect(mgmt, cfg, vhost=vhost).channel()
    refused(ch, lambda c: c.queue_declare("zz-q", arguments={"x-dead-letter-exchange": "app-x"}),
            f"access to queue 'zz-q' in vhost '{vhost}' refused")
    ch = ch.connection.channel()
    ch.queue_declare("zz-plain", auto_delete=True)  # without a DLX, read is not needed

    # nothing was created by the refused declares
    for name in ("app-q", "zz-q"):
        assert mgmt.api("GET", f"/api/queues/{q(vhost)}/{name}")[0] == 404

    # a queue that exists already is only compared, as RabbitMQ: no DLX check
    admin.queue_declare("app-old", arguments={"x-dead-letter-exchange": "other-x"})
    ch = connect(mgmt, app, vhost=vhost).channel()
    ch.queue_declare("app-old", arguments={"x-dead-letter-exchange": "other-x"})


def test_alternate_exchange_needs_write_and_read(mgmt: MgmtBroker) -> None:
    vhost = make_vhost(mgmt)
    app = make_user(mgmt, "app", perms={vhost: ("^app", "^app", "^app")})
    cfg = make_user(mgmt, "cfg", perms={vhost: (".*", "^app", "^app")})
    admin = connect(mgmt, vhost=vhost).channel()
    admin.exchange_declare("other-x", "fanout")
    admin.exchange_declare("app-x", "fanout")

    ch = connect(mgmt, app, vhost=vhost).channel()
    refused(ch, lambda c: c.exchange_declare("app-ae", "fanout",
                                             arguments={"alternate-exchange": "other-x"}),
            f"access to exchange 'other-x' in vhost '{vhost}' refused for user '{app}'")
    ch = ch.connection.channel()
    ch.exchange_declare("app-ae-ok", "fanout", arguments={"alternate-exchange": "app-x"})
    ch = connect(mgmt, cfg, vhost=vhost).channel()
    refused(ch, lambda c: c.exchange_declare("zz-x", "fanout",
                                             arguments={"alternate-exchange": "app-x"}),
            f"access to exchange 'zz-x' in vhost '{vhost}' refused")
    for name in ("app-ae", "zz-x"):
        assert mgmt.api("GET", f"/api/exchanges/{q(vhost)}/{name}")[0] == 404
    assert mgmt.api("GET", f"/api/exchanges/{q(vhost)}/app-ae-ok")[0] == 200


def test_over_http_the_same_checks_apply(mgmt: MgmtBroker) -> None:
    vhost = make_vhost(mgmt)
    app = make_user(mgmt, "app", tags="management", perms={vhost: ("^app", "^app", "^app")})
    connect(mgmt, vhost=vhost).channel().exchange_declare("other-x", "fanout")
    kw = {"user": app, "password": PASSWORD}
    status, body = mgmt.api("PUT", f"/api/queues/{q(vhost)}/app-q",
                            {"arguments": {"x-dead-letter-exchange": "other-x"}}, **kw)
    assert status == 401
    assert body == {"error": "not_authorised", "reason": "ACCESS_REFUSED - access to exchange "
                    f"'other-x' in vhost '{vhost}' refused for user '{app}'"}
    status, body = mgmt.api("PUT", f"/api/exchanges/{q(vhost)}/app-x",
                            {"type": "fanout", "arguments": {"alternate-exchange": "other-x"}},
                            **kw)
    assert status == 401 and "'other-x'" in body["reason"]
    assert mgmt.api("GET", f"/api/queues/{q(vhost)}/app-q")[0] == 404
    assert mgmt.api("GET", f"/api/exchanges/{q(vhost)}/app-x")[0] == 404
    assert mgmt.api("PUT", f"/api/queues/{q(vhost)}/app-q", {}, **kw)[0] == 201
