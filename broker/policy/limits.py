"""Per-vhost limits, as RabbitMQ's rabbit_vhost_limit: `max-connections` and `max-queues`.
A negative value means no limit; 0 refuses every new connection or queue."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.policy.definition import PolicyInvalid, erlang_term

__all__ = ["LIMITS", "limit_reached", "parse_limits"]

LIMITS = ("max-connections", "max-queues")


def parse_limits(value: Mapping[str, Any]) -> dict[str, int]:
    """Validate a limits object ({"max-queues": 10, ...}) with RabbitMQ's texts."""
    unknown = sorted((k, v) for k, v in value.items() if k not in LIMITS)
    if unknown:
        terms = ",".join(f"{{{erlang_term(k)},{erlang_term(v)}}}" for k, v in unknown)
        raise PolicyInvalid(f"Validation failed\n\nUnrecognised terms [{terms}] in limits\n")
    for key, limit in value.items():
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise PolicyInvalid(f"Validation failed\n\n{key} should be a number, actually was "
                                f"{erlang_term(limit)}\n")
    return dict(value)


def limit_reached(limits: Mapping[str, int], name: str, current: int) -> int | None:
    """The limit when `current` objects already reach it (so one more is refused), else None."""
    limit = limits.get(name)
    if limit is None or limit < 0 or current < limit:
        return None
    return limit
