"""Resource alarms, after rabbit_alarm: the set of resources ('memory', 'disk') that are low,
and the listeners (connections) told when one is raised or cleared. A connection blocks
publishers while any alarm is active and sends connection.blocked with `blocked_reason`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import structlog

__all__ = ["DISK", "MEMORY", "AlarmListener", "Alarms", "blocked_reason"]

MEMORY = "memory"
DISK = "disk"

AlarmListener = Callable[[str, bool], None]
"""listener(resource, raised): raised is True when the alarm goes off, False when it clears."""

_log = structlog.get_logger("broker.flow.alarm")


class Alarms:
    """Active alarms and their listeners. Raising an active alarm (or clearing an inactive
    one) is a no-op, so monitors may call on every sample."""

    __slots__ = ("_active", "_listeners")

    def __init__(self) -> None:
        self._active: set[str] = set()
        self._listeners: list[AlarmListener] = []

    def subscribe(self, listener: AlarmListener) -> Callable[[], None]:
        """Add a listener; it is told at once about alarms already active (a connection
        opened during an alarm must block too). Returns the unsubscribe function."""
        self._listeners.append(listener)
        for resource in sorted(self._active):
            self._notify_one(listener, resource, True)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def raise_alarm(self, resource: str, **figures: object) -> None:
        if resource in self._active:
            return
        self._active.add(resource)
        _log.warning("alarm raised", resource=resource, **figures)
        self._notify(resource, True)

    def clear_alarm(self, resource: str, **figures: object) -> None:
        if resource not in self._active:
            return
        self._active.discard(resource)
        _log.info("alarm cleared", resource=resource, **figures)
        self._notify(resource, False)

    def active(self) -> frozenset[str]:
        return frozenset(self._active)

    def is_active(self, resource: str) -> bool:
        return resource in self._active

    def _notify(self, resource: str, raised: bool) -> None:
        for listener in tuple(self._listeners):  # a listener may unsubscribe while notified
            self._notify_one(listener, resource, raised)

    @staticmethod
    def _notify_one(listener: AlarmListener, resource: str, raised: bool) -> None:
        try:
            listener(resource, raised)
        except Exception:  # one broken connection must not keep the others unblocked
            _log.exception("alarm listener failed", resource=resource, raised=raised)


def blocked_reason(resources: Iterable[str]) -> str:
    """The connection.blocked reason text RabbitMQ sends: "low on memory", "low on disk",
    "low on disk & memory" (resources in sorted order)."""
    return "low on " + " & ".join(sorted(resources))
