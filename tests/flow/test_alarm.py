"""Alarms: raise and clear once, listeners told (late ones too), log lines, reason text."""

from __future__ import annotations

from structlog.testing import capture_logs

from broker.flow.alarm import DISK, MEMORY, Alarms, blocked_reason


def test_raise_and_clear_notify_listeners_once() -> None:
    alarms = Alarms()
    seen: list[tuple[str, bool]] = []
    alarms.subscribe(lambda r, up: seen.append((r, up)))
    alarms.raise_alarm(MEMORY, used_bytes=10)
    alarms.raise_alarm(MEMORY, used_bytes=11)  # already active: nothing new
    assert alarms.active() == frozenset({MEMORY})
    assert alarms.is_active(MEMORY)
    alarms.clear_alarm(MEMORY)
    alarms.clear_alarm(MEMORY)
    assert seen == [(MEMORY, True), (MEMORY, False)]
    assert not alarms.active()


def test_late_subscriber_learns_active_alarms() -> None:
    alarms = Alarms()
    alarms.raise_alarm(DISK)
    alarms.raise_alarm(MEMORY)
    seen: list[tuple[str, bool]] = []
    alarms.subscribe(lambda r, up: seen.append((r, up)))
    assert seen == [(DISK, True), (MEMORY, True)]


def test_unsubscribe_stops_notifications() -> None:
    alarms = Alarms()
    seen: list[str] = []
    unsubscribe = alarms.subscribe(lambda r, up: seen.append(r))
    unsubscribe()
    unsubscribe()  # twice is harmless
    alarms.raise_alarm(DISK)
    assert seen == []


def test_a_failing_listener_does_not_starve_the_others() -> None:
    alarms = Alarms()
    seen: list[str] = []

    def broken(resource: str, raised: bool) -> None:
        raise RuntimeError("connection gone")

    alarms.subscribe(broken)
    alarms.subscribe(lambda r, up: seen.append(r))
    alarms.raise_alarm(MEMORY)
    assert seen == [MEMORY]


def test_log_lines_carry_resource_and_figures() -> None:
    alarms = Alarms()
    with capture_logs() as logs:
        alarms.raise_alarm(MEMORY, used_bytes=900, limit_bytes=800)
        alarms.clear_alarm(MEMORY, used_bytes=700, limit_bytes=800)
    assert [(e["event"], e["resource"], e["used_bytes"]) for e in logs] == [
        ("alarm raised", MEMORY, 900),
        ("alarm cleared", MEMORY, 700),
    ]


def test_blocked_reason_text() -> None:
    assert blocked_reason([MEMORY]) == "low on memory"
    assert blocked_reason({DISK}) == "low on disk"
    assert blocked_reason([MEMORY, DISK]) == "low on disk & memory"
