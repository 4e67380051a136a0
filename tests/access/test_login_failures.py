"""Failed logins are logged with the user name, mechanism and peer (never the password) and
counted, per protocol, in /api/auth/attempts/{node} and /metrics."""

from __future__ import annotations

import json
import time

import pika
import pytest

from tests.mgmt.helpers import MgmtBroker

from .helpers import connect, make_user


def _attempts(mgmt: MgmtBroker) -> dict[str, dict[str, int]]:
    # the hare-server: the sum of its workers' at workers > 1 (a login lands on any of them)
    node = mgmt.get("/api/nodes")[0]["server"]
    return {row["protocol"]: row for row in mgmt.get(f"/api/auth/attempts/{node}")}


def _log_lines(mgmt: MgmtBroker, event: str) -> list[dict[str, object]]:
    lines = []
    for line in mgmt.log_path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event:
            lines.append(record)
    return lines


def test_failed_logins_are_logged_and_counted(mgmt: MgmtBroker) -> None:
    user = make_user(mgmt, "login", perms={"/": (".*", ".*", ".*")})
    before = _attempts(mgmt)["amqp091"]
    secret = "not-the-password-7f3a"
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(mgmt, user, secret)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(mgmt, "no-such-user", secret)
    connect(mgmt, user).close()
    after = _attempts(mgmt)["amqp091"]
    assert after["auth_attempts_failed"] - before["auth_attempts_failed"] == 2
    assert after["auth_attempts_succeeded"] - before["auth_attempts_succeeded"] == 1
    assert after["auth_attempts"] - before["auth_attempts"] == 3

    deadline = time.monotonic() + 5
    while True:
        refused = [r for r in _log_lines(mgmt, "login refused") if r.get("user") == user]
        if refused or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert refused, "no 'login refused' line"
    line = refused[-1]
    assert line["mechanism"] == "PLAIN" and line["protocol"] == "amqp091"
    assert str(line["peer"]).startswith("127.0.0.1:")
    assert line["reason"] == f"internal: user '{user}' - invalid credentials"
    assert secret not in mgmt.log_path.read_text()

    # HTTP logins count under their own protocol; /metrics shows both
    http_before = _attempts(mgmt)["http"]["auth_attempts_failed"]
    assert mgmt.api("GET", "/api/overview", user=user, password=secret)[0] == 401
    assert _attempts(mgmt)["http"]["auth_attempts_failed"] == http_before + 1
    _, _, text = mgmt.raw("/metrics")
    failed = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines()
              if line.startswith("rabbitmq_auth_attempts_failed_total{")}
    assert failed['protocol="amqp091"'] >= 2 and failed['protocol="http"'] >= 1
    assert secret not in mgmt.log_path.read_text()
