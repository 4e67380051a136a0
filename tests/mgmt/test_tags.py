"""RabbitMQ's four management tags, checked path by path against what RabbitMQ 3.10.8
answers: management sees and changes only its own vhosts (and only as its AMQP permissions
allow) and its own connections; policymaker as management here; monitoring sees every vhost,
connection and node figure but changes nothing that is not its own; administrator sees all."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pika
import pytest

from broker.mgmt import authz
from broker.mgmt.app import build_app

from .helpers import MgmtBroker

PW = "pw-tags"


def _q(name: str) -> str:
    return quote(name, safe="")


@pytest.fixture(scope="module")
def world(mgmt: MgmtBroker) -> Iterator[dict[str, Any]]:
    """Two vhosts; users of each tag with ^app permissions in the first; a guest connection
    in each vhost and a connection of the management user."""
    tag = uuid.uuid4().hex[:6]
    mine, theirs = f"mine-{tag}", f"theirs-{tag}"
    for v in (mine, theirs):
        assert mgmt.api("PUT", f"/api/vhosts/{_q(v)}", {})[0] == 201
    users = {}
    for role in ("management", "policymaker", "monitoring", "administrator", ""):
        name = f"{role or 'plain'}-{tag}"
        assert mgmt.api("PUT", f"/api/users/{name}", {"password": PW, "tags": role})[0] == 201
        users[role or "plain"] = name
    for role in ("management", "policymaker", "plain"):
        assert mgmt.api("PUT", f"/api/permissions/{_q(mine)}/{users[role]}",
                        {"configure": "^app", "write": "^app", "read": "^app"})[0] == 201
    conns = []
    for vhost, user, password in ((mine, "guest", "guest"), (theirs, "guest", "guest"),
                                  (mine, users["management"], PW)):
        c = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", mgmt.port, vhost, pika.PlainCredentials(user, password)))
        c.channel()
        conns.append(c)
    setup = conns[0].channel()
    setup.queue_declare("app-q")
    setup.queue_declare("zz-q")
    setup.basic_publish("", "zz-q", b"not yours")
    yield {"mine": mine, "theirs": theirs, "users": users, "conns": conns}
    for c in conns:
        if c.is_open:
            c.close()


def _as(mgmt: MgmtBroker, user: str, method: str, path: str, body: Any = None
        ) -> tuple[int, Any]:
    return mgmt.api(method, path, body, user=user, password=PW)


def _reason(answer: tuple[int, Any]) -> tuple[int, str]:
    status, body = answer
    return status, (body or {}).get("reason", "") if isinstance(body, dict) else ""


def test_every_route_declares_what_it_needs() -> None:
    """A route added without a declaration would be administrators-only: this keeps new
    routes honest (declare with authz.add_route)."""
    app = build_app(None, None)  # type: ignore[arg-type]  # routes only, nothing served
    needs = app[authz._NEEDS]
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if not path.startswith("/api") or route.method == "HEAD":
            continue
        assert (route.method, route.resource) in needs, f"{route.method} {path}"


@pytest.mark.parametrize("role", ["management", "policymaker"])
def test_management_and_policymaker_see_their_own_vhosts(mgmt: MgmtBroker, world: dict,
                                                         role: str) -> None:
    user, mine, theirs = world["users"][role], world["mine"], world["theirs"]
    assert [v["name"] for v in _as(mgmt, user, "GET", "/api/vhosts")[1]] == [mine]
    assert {q["vhost"] for q in _as(mgmt, user, "GET", "/api/queues")[1]} == {mine}
    assert {b["vhost"] for b in _as(mgmt, user, "GET", "/api/bindings")[1]} == {mine}
    assert {x["vhost"] for x in _as(mgmt, user, "GET", "/api/exchanges")[1]} == {mine}
    assert _as(mgmt, user, "GET", f"/api/queues/{_q(mine)}/zz-q")[0] == 200  # reads: vhost
    for path in (f"/api/queues/{_q(theirs)}", f"/api/exchanges/{_q(theirs)}/amq.direct",
                 f"/api/vhosts/{_q(theirs)}/connections", "/api/queues/%2F"):
        assert _reason(_as(mgmt, user, "GET", path)) == (
            401, "User not authorised to access virtual host"), path
    for path in ("/api/users", f"/api/users/{user}", "/api/permissions",
                 f"/api/vhosts/{_q(mine)}", f"/api/vhosts/{_q(mine)}/permissions",
                 "/api/definitions", "/api/topic-permissions"):
        assert _reason(_as(mgmt, user, "GET", path)) == (401, "Not administrator user"), path
    assert _reason(_as(mgmt, user, "GET", "/api/nodes")) == (401, "Not monitor user")
    ov = _as(mgmt, user, "GET", "/api/overview")[1]
    assert ov["object_totals"]["queues"] == 2 and "node" not in ov and "listeners" not in ov
    assert _as(mgmt, user, "GET", "/api/whoami")[1] == {"name": user, "tags": [role]}
    assert _as(mgmt, user, "GET", "/api/healthchecks/node")[0] == 200


def test_management_user_sees_and_closes_only_its_own_connections(mgmt: MgmtBroker,
                                                                  world: dict) -> None:
    user = world["users"]["management"]
    conns = _as(mgmt, user, "GET", "/api/connections")[1]
    assert [c["user"] for c in conns] == [user]
    assert [c["user"] for c in _as(mgmt, user, "GET", "/api/channels")[1]] == [user]
    others = [c["name"] for c in mgmt.get("/api/connections") if c["user"] == "guest"]
    for name in others:
        for method in ("GET", "DELETE"):
            assert _reason(_as(mgmt, user, method, f"/api/connections/{_q(name)}")) == (
                401, "User not authorised to access object")
    assert world["conns"][0].is_open


def test_management_writes_follow_amqp_permissions(mgmt: MgmtBroker, world: dict) -> None:
    user, mine = world["users"]["management"], world["mine"]
    v = _q(mine)
    denied = f"in vhost '{mine}' refused for user '{user}'"
    for method, path, body in (
        ("PUT", f"/api/queues/{v}/zz-new", {}),
        ("DELETE", f"/api/queues/{v}/zz-q", None),
        ("DELETE", f"/api/queues/{v}/zz-q/contents", None),
        ("POST", f"/api/queues/{v}/zz-q/get", {"count": 1, "ackmode": "ack_requeue_false"}),
        ("PUT", f"/api/exchanges/{v}/zz-x", {"type": "fanout"}),
        ("POST", f"/api/bindings/{v}/e/amq.direct/q/app-q", {"routing_key": "k"}),
    ):
        status, reason = _reason(_as(mgmt, user, method, path, body))
        assert status == 401 and reason.startswith("ACCESS_REFUSED - access to ") \
            and denied in reason, (method, path, reason)
    # a publish answers as RabbitMQ's: 400 with the channel's 403
    status, reason = _reason(_as(mgmt, user, "POST", f"/api/exchanges/{v}/amq.default/publish",
                                 {"routing_key": "app-q", "payload": "x",
                                  "payload_encoding": "string", "properties": {}}))
    assert (status, reason) == (400, "403 ACCESS_REFUSED - access to exchange 'amq.default' "
                                     f"{denied}")
    # spoofing user_id over HTTP is refused too
    assert mgmt.api("PUT", f"/api/permissions/{v}/{user}",
                    {"configure": "^app", "write": ".*", "read": "^app"})[0] == 204
    status, reason = _reason(_as(mgmt, user, "POST", f"/api/exchanges/{v}/amq.default/publish",
                                 {"routing_key": "app-q", "payload": "x",
                                  "properties": {"user_id": "guest"}}))
    assert status == 400 and "user_id property set to 'guest'" in reason
    assert mgmt.get(f"/api/queues/{v}/zz-q")["messages"] == 1  # nothing taken
    assert mgmt.api("GET", f"/api/queues/{v}/zz-new")[0] == 404  # nothing made
    # within its permissions it may
    assert _as(mgmt, user, "PUT", f"/api/queues/{v}/app-new", {})[0] == 201
    assert _as(mgmt, user, "POST", f"/api/exchanges/{v}/amq.default/publish",
               {"routing_key": "app-new", "payload": "x", "payload_encoding": "string",
                "properties": {}})[1] == {"routed": True}
    got = _as(mgmt, user, "POST", f"/api/queues/{v}/app-new/get",
              {"count": 1, "ackmode": "ack_requeue_false"})[1]
    assert [m["payload"] for m in got] == ["x"]
    assert _as(mgmt, user, "DELETE", f"/api/queues/{v}/app-new")[0] == 204
    # and no administration at all: definitions import is refused before anything applies
    status, reason = _reason(_as(mgmt, user, "POST", "/api/definitions",
                                 {"users": [{"name": "evil", "password": "x",
                                             "tags": "administrator"}]}))
    assert (status, reason) == (401, "Not administrator user")
    assert mgmt.api("GET", "/api/users/evil")[0] == 404
    for path, body in ((f"/api/vhosts/{_q('new-vh')}", {}),
                       (f"/api/permissions/{v}/{user}", {"configure": ".*", "write": ".*",
                                                         "read": ".*"})):
        assert _reason(_as(mgmt, user, "PUT", path, body)) == (401, "Not administrator user")


def test_monitoring_sees_everything_and_changes_nothing_of_others(mgmt: MgmtBroker,
                                                                world: dict) -> None:
    user, mine, theirs = world["users"]["monitoring"], world["mine"], world["theirs"]
    names = {v["name"] for v in _as(mgmt, user, "GET", "/api/vhosts")[1]}
    assert {mine, theirs, "/"} <= names
    users = {c["user"] for c in _as(mgmt, user, "GET", "/api/connections")[1]}
    assert {"guest", world["users"]["management"]} <= users
    assert len(_as(mgmt, user, "GET", "/api/channels")[1]) >= 3
    assert _as(mgmt, user, "GET", "/api/nodes")[0] == 200
    ov = _as(mgmt, user, "GET", "/api/overview")[1]
    assert "node" in ov and ov["object_totals"]["connections"] >= 3
    guest_conn = next(c["name"] for c in mgmt.get("/api/connections") if c["user"] == "guest")
    assert _as(mgmt, user, "GET", f"/api/connections/{_q(guest_conn)}")[0] == 200
    assert _reason(_as(mgmt, user, "DELETE", f"/api/connections/{_q(guest_conn)}")) == (
        401, "User not authorised to access object")
    # no permissions anywhere: vhost paths and writes are refused as RabbitMQ refuses them
    assert _reason(_as(mgmt, user, "GET", f"/api/queues/{_q(mine)}")) == (
        401, "User not authorised to access virtual host")
    assert _reason(_as(mgmt, user, "PUT", f"/api/queues/{_q(mine)}/app-m", {})) == (
        401, "User not authorised to access virtual host")
    assert _as(mgmt, user, "GET", "/api/queues")[1] == []
    assert _reason(_as(mgmt, user, "GET", "/api/users")) == (401, "Not administrator user")


def test_administrator_reads_all_and_writes_as_its_permissions_allow(mgmt: MgmtBroker,
                                                                     world: dict) -> None:
    user, theirs = world["users"]["administrator"], world["theirs"]
    assert _as(mgmt, user, "GET", f"/api/queues/{_q(theirs)}")[0] == 200
    assert _as(mgmt, user, "GET", f"/api/vhosts/{_q(theirs)}")[0] == 200
    assert _as(mgmt, user, "GET", "/api/users")[0] == 200
    # RabbitMQ's management plugin declares through an AMQP channel of the caller's: without
    # permissions in the vhost, even an administrator is refused
    assert _reason(_as(mgmt, user, "PUT", f"/api/queues/{_q(theirs)}/adm-q", {})) == (
        401, "Access refused.")
    assert _as(mgmt, user, "PUT", f"/api/permissions/{_q(theirs)}/{user}",
               {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    assert _as(mgmt, user, "PUT", f"/api/queues/{_q(theirs)}/adm-q", {})[0] == 201


def test_untagged_users_get_nothing(mgmt: MgmtBroker, world: dict) -> None:
    user = world["users"]["plain"]
    for path in ("/api/overview", "/api/whoami", "/api/queues", "/api/vhosts"):
        assert _reason(_as(mgmt, user, "GET", path)) == (401, "Not management user"), path


def test_policies_need_policymaker_and_the_permissions_their_effect_needs(
        mgmt: MgmtBroker, world: dict) -> None:
    """RabbitMQ 3.10.8 lets a policymaker name any dead-letter exchange in a policy; Hare
    asks for write on it, as for x-dead-letter-exchange at queue.declare."""
    pm, user, mine = world["users"]["policymaker"], world["users"]["management"], world["mine"]
    v = _q(mine)
    body = {"pattern": "^app", "definition": {"dead-letter-exchange": "zz-dlx"}}
    assert _reason(_as(mgmt, pm, "PUT", f"/api/policies/{v}/p-dlx", body)) == (
        401, f"ACCESS_REFUSED - access to exchange 'zz-dlx' in vhost '{mine}' refused for user "
             f"'{pm}'")
    body["definition"] = {"alternate-exchange": "zz-ae"}
    assert _reason(_as(mgmt, pm, "PUT", f"/api/policies/{v}/p-ae", body))[0] == 401
    assert mgmt.api("GET", f"/api/policies/{v}/p-dlx")[0] == 404  # nothing stored
    body["definition"] = {"dead-letter-exchange": "app-dlx", "max-length": 5}
    assert _as(mgmt, pm, "PUT", f"/api/policies/{v}/p-ok", body)[0] == 201
    assert [p["name"] for p in _as(mgmt, user, "GET", "/api/policies")[1]] == ["p-ok"]
    assert _reason(_as(mgmt, user, "PUT", f"/api/policies/{v}/p-mgmt", body)) == (
        401, "User not authorised to access object")
    assert _reason(_as(mgmt, pm, "PUT", f"/api/operator-policies/{v}/op",
                       {"pattern": ".*", "definition": {"max-length": 1}})) == (
        401, "Not administrator user")
    assert _reason(_as(mgmt, pm, "PUT", f"/api/vhost-limits/{v}/max-queues",
                       {"value": 1})) == (401, "Not administrator user")
    # importing definitions goes through the same check (an administrator without write on
    # the exchange is refused too)
    admin = world["users"]["administrator"]
    assert _as(mgmt, admin, "PUT", f"/api/permissions/{v}/{admin}",
               {"configure": ".*", "write": "^app", "read": ".*"})[0] in (201, 204)
    status, reason = _reason(_as(mgmt, admin, "POST", "/api/definitions", {"policies": [
        {"vhost": mine, "name": "p-import", "pattern": ".*",
         "definition": {"dead-letter-exchange": "zz-dlx"}}]}))
    assert status == 401 and "access to exchange 'zz-dlx'" in reason
    assert _as(mgmt, pm, "DELETE", f"/api/policies/{v}/p-ok")[0] == 204


def test_health_checks_for_every_management_tag(mgmt: MgmtBroker, world: dict) -> None:
    user, mine = world["users"]["management"], world["mine"]
    assert _as(mgmt, user, "GET", "/api/health/checks/alarms")[1] == {"status": "ok"}
    # the aliveness test declares, publishes and gets: the caller's AMQP permissions, as
    # RabbitMQ answers a user without them
    assert _reason(_as(mgmt, user, "GET", f"/api/aliveness-test/{_q(mine)}")) == (
        401, f"ACCESS_REFUSED - access to queue 'aliveness-test' in vhost '{mine}' refused for "
             f"user '{user}'")
    assert mgmt.get(f"/api/aliveness-test/{_q(mine)}") == {"status": "ok"}
