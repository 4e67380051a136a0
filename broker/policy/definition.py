"""Policies and operator policies as RabbitMQ has them: a name, a regular expression matched
against queue and exchange names in one vhost, what they apply to, a priority and a
definition (settings without the x- prefix). Pure code: parsing and validation with
RabbitMQ's error texts, matching, and the merge of a policy with an operator policy.

Layering: above queue (it uses the value lists of broker.queue.arguments), below the vhost
that applies them."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.queue.arguments import OVERFLOW_MODES, QUEUE_MODES
from broker.queue.stream_queue import max_age_ms

__all__ = [
    "APPLY_TO",
    "INERT_KEYS",
    "Policy",
    "PolicyInvalid",
    "PolicySet",
    "effective_definition",
    "erlang_term",
    "parse_policy",
]

APPLY_TO = ("queues", "exchanges", "all")


class PolicyInvalid(ValueError):
    """A policy (or limit) RabbitMQ would refuse; `reason` is RabbitMQ's text for it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def erlang_term(value: Any) -> str:
    """A JSON value as RabbitMQ prints it in validation errors (~p): <<"text">>, 5, [..]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '<<"' + value.replace('"', '\\"') + '">>'
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(erlang_term(v) for v in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{erlang_term(k)} => {erlang_term(v)}"
                               for k, v in sorted(value.items())) + "}"
    return repr(value) if isinstance(value, float) else str(value)


def _integer(minimum: int, what: str) -> Any:
    def check(value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
        return None if ok else f"{erlang_term(value)} is not a valid {what}"
    return check


def _text(what: str) -> Any:
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) else f"{erlang_term(value)} is not a valid {what}"
    return check


def _one_of(choices: tuple[object, ...], what: str) -> Any:
    def check(value: Any) -> str | None:
        ok = not isinstance(value, bool) and value in choices
        return None if ok else f"{erlang_term(value)} is not a valid {what}"
    return check


def _anything(value: Any) -> str | None:
    return None


def _max_age(value: Any) -> str | None:
    ok = isinstance(value, str) and max_age_ms(value) is not None
    return None if ok else f"{erlang_term(value)} is not a valid max age"


# The keys Hare applies, with RabbitMQ's validation (rabbit_policies).
_APPLIED = {
    "alternate-exchange": _text("alternate exchange name"),
    "dead-letter-exchange": _text("dead letter exchange name"),
    "dead-letter-routing-key": _text("dead letter routing key"),
    "message-ttl": _integer(0, "message TTL"),
    "expires": _integer(1, "queue expiry"),
    "max-length": _integer(0, "maximum length"),
    "max-length-bytes": _integer(0, "maximum length in bytes"),
    "overflow": _one_of(OVERFLOW_MODES, "overflow value"),
    "queue-mode": _one_of(QUEUE_MODES, "queue-mode value"),
    # quorum queues
    "delivery-limit": _integer(0, "delivery limit"),
    "dead-letter-strategy": _one_of(("at-most-once", "at-least-once"), "dead letter strategy"),
    # streams (broker/queue/stream_queue.py)
    "max-age": _max_age,
    "stream-max-segment-size-bytes": _integer(0, "segment size"),
    # the federation plugin (broker/federation), which reads them from the matched policy
    "federation-upstream": _text("federation upstream name"),
    "federation-upstream-set": _text("federation upstream set name"),
}
# Keys RabbitMQ 3.10 accepts that mean nothing for Hare's queues (mirroring, a quorum queue's
# or a stream's placement). Accepted, so a RabbitMQ definitions export loads, and logged as
# having no effect by whoever stores the policy.
INERT_KEYS = {
    "max-in-memory-length": _integer(0, "maximum memory in bytes"),  # sic, RabbitMQ's text
    "max-in-memory-bytes": _integer(0, "maximum memory in bytes"),
    "queue-version": _one_of((1, 2), "queue-version value"),
    "ha-mode": _anything, "ha-params": _anything, "ha-sync-mode": _anything,
    "ha-sync-batch-size": _anything, "ha-promote-on-shutdown": _anything,
    "ha-promote-on-failure": _anything, "queue-master-locator": _anything,
    "queue-leader-locator": _anything, "initial-cluster-size": _anything,
}
# What an operator policy may set (rabbit_policies' operator policy validator).
_OPERATOR_KEYS = ("expires", "message-ttl", "max-length", "max-length-bytes",
                  "max-in-memory-length", "max-in-memory-bytes", "delivery-limit")


@dataclass(frozen=True, slots=True)
class Policy:
    """One policy or operator policy; `definition` has its keys sorted, as RabbitMQ lists it."""

    vhost: str
    name: str
    pattern: str
    apply_to: str
    definition: Mapping[str, Any]
    priority: int | float = 0
    operator: bool = False
    regex: re.Pattern[str] = field(compare=False, repr=False, default=re.compile(""))

    def matches(self, kind: str, name: str) -> bool:
        """`kind` is "queues" or "exchanges"; the pattern is searched, not anchored."""
        return self.apply_to in (kind, "all") and self.regex.search(name) is not None

    def body(self) -> dict[str, Any]:
        """What PUT /api/policies/{vhost}/{name} takes (and the definitions store keeps)."""
        return {"pattern": self.pattern, "definition": dict(self.definition),
                "priority": self.priority, "apply-to": self.apply_to}

    def json(self) -> dict[str, Any]:
        """The object /api/policies and the definitions export show."""
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern,
                "apply-to": self.apply_to, "definition": dict(self.definition),
                "priority": self.priority}

    def inert_keys(self) -> list[str]:
        return [k for k in self.definition if k in INERT_KEYS]


def _invalid(detail: str) -> PolicyInvalid:
    return PolicyInvalid(f"Validation failed\n\n{detail}\n")


def parse_policy(vhost: str, name: str, body: Mapping[str, Any], *,
                 operator: bool = False) -> Policy:
    """A policy from its JSON body, or PolicyInvalid with RabbitMQ's reason. `apply-to`
    defaults to "all" and `priority` to 0, as RabbitMQ."""
    missing = [k for k in ("pattern", "definition") if k not in body]
    if missing:
        raise PolicyInvalid("[" + ",".join(f"{{key_missing,{k}}}" for k in missing) + "]")
    pattern = body["pattern"]
    if not isinstance(pattern, str):
        raise _invalid(f"pattern should be a binary but was {erlang_term(pattern)}")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise _invalid(f"pattern should be regular expression but is invalid: {exc}") from exc
    apply_to = body.get("apply-to", "all")
    if apply_to not in APPLY_TO:
        raise _invalid(f"apply-to '{apply_to}' unrecognised; should be 'queues', 'exchanges' "
                       "or 'all'")
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int | float):
        raise _invalid(f"priority should be a number, actually was {erlang_term(priority)}")
    definition = body["definition"]
    if not isinstance(definition, dict):
        raise _invalid(f"definition should be a JSON object but was {erlang_term(definition)}")
    if not definition:
        raise _invalid("no policy provided")
    known = _OPERATOR_KEYS if operator else (*_APPLIED, *INERT_KEYS)
    unknown = sorted((k, v) for k, v in definition.items() if k not in known)
    if unknown:
        terms = ",".join(f"{{{erlang_term(k)},{erlang_term(v)}}}" for k, v in unknown)
        raise _invalid(f"[{terms}] are not recognised policy settings")
    for key, value in sorted(definition.items()):
        problem = (_APPLIED.get(key) or INERT_KEYS[key])(value)
        if problem:
            raise _invalid(problem)
    if "federation-upstream" in definition and "federation-upstream-set" in definition:
        raise _invalid("cannot specify federation-upstream, federation-upstream-set or "
                       "federation-upstream-pattern together")
    return Policy(vhost, name, pattern, apply_to, dict(sorted(definition.items())), priority,
                  operator, regex)


def effective_definition(policy: Policy | None, operator: Policy | None) -> dict[str, Any]:
    """A policy merged with an operator policy, as RabbitMQ's effective_policy_definition:
    every key of either; where both set one, the smaller (every operator key is a limit)."""
    merged = dict(policy.definition) if policy is not None else {}
    if operator is not None:
        for key, value in operator.definition.items():
            have = merged.get(key)
            merged[key] = value if have is None else min(have, value)
    return dict(sorted(merged.items()))


class PolicySet:
    """The policies (or the operator policies) of one vhost, by name."""

    __slots__ = ("_by_name",)

    def __init__(self) -> None:
        self._by_name: dict[str, Policy] = {}

    def put(self, policy: Policy) -> bool:
        """Add or replace; True when it is new."""
        created = policy.name not in self._by_name
        self._by_name[policy.name] = policy
        return created

    def delete(self, name: str) -> Policy | None:
        return self._by_name.pop(name, None)

    def get(self, name: str) -> Policy | None:
        return self._by_name.get(name)

    def __iter__(self) -> Iterator[Policy]:
        return iter([self._by_name[n] for n in sorted(self._by_name)])

    def __len__(self) -> int:
        return len(self._by_name)

    def match(self, kind: str, name: str) -> Policy | None:
        """The policy for a queue or exchange: the highest priority of those that match (on
        a tie, the first by name; RabbitMQ leaves ties undefined)."""
        best: Policy | None = None
        for policy in self:
            if policy.matches(kind, name) and (best is None or policy.priority > best.priority):
                best = policy
        return best

