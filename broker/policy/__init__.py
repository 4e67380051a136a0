"""Policies, operator policies and vhost limits: RabbitMQ's runtime parameters that change
what queues and exchanges do. Pure code; the vhost applies them (broker/vhost_params.py)."""

from broker.policy.definition import (
    APPLY_TO,
    INERT_KEYS,
    Policy,
    PolicyInvalid,
    PolicySet,
    effective_definition,
    erlang_term,
    parse_policy,
)
from broker.policy.limits import LIMITS, limit_reached, parse_limits

__all__ = [
    "APPLY_TO",
    "INERT_KEYS",
    "LIMITS",
    "Policy",
    "PolicyInvalid",
    "PolicySet",
    "effective_definition",
    "erlang_term",
    "limit_reached",
    "parse_limits",
    "parse_policy",
]
