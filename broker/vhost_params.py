"""A vhost's runtime parameters (RabbitMQ's name for them): policies, operator policies and
limits, and applying them to the vhost's queues and exchanges.

A policy is matched when a queue or exchange is declared (or restored) and again, for every
queue and exchange of the vhost, whenever a policy is set or cleared; the queue turns the
result into its QueueArgs then, so nothing is looked up per message."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from broker.policy import Policy, PolicySet, effective_definition, limit_reached
from broker.protocol.constants import NOT_ALLOWED, PRECONDITION_FAILED
from broker.protocol.errors import ChannelError, ConnectionError_
from broker.queue.policy_args import AppliedPolicies

if TYPE_CHECKING:
    from broker.queue.contract import QueueType
    from broker.routing.exchange import Exchange
    from broker.vhost import VHost

__all__ = ["VHostParams"]

log = structlog.get_logger("hare.policy")


class VHostParams:
    def __init__(self, vhost: VHost) -> None:
        self.vhost = vhost
        self.policies = PolicySet()
        self.operator_policies = PolicySet()
        self.limits: dict[str, int] = {}

    # -- policies ---------------------------------------------------------------------------
    def _set(self, operator: bool) -> PolicySet:
        return self.operator_policies if operator else self.policies

    def put_policy(self, policy: Policy) -> bool:
        """Store a validated policy and apply it at once; True when it is new."""
        created = self._set(policy.operator).put(policy)
        inert = policy.inert_keys()
        if inert:
            log.warning("policy keys have no effect in Hare", vhost=self.vhost.name,
                        policy=policy.name, keys=inert)
        self.vhost._changed("put_policy", policy)
        self.apply_all()
        return created

    def clear_policy(self, name: str, operator: bool) -> bool:
        policy = self._set(operator).delete(name)
        if policy is None:
            return False
        self.vhost._changed("delete_policy", policy)
        self.apply_all()
        return True

    def restore_policy(self, policy: Policy) -> None:
        """At start, before queues and exchanges exist: store only."""
        self._set(policy.operator).put(policy)

    def apply_all(self) -> None:
        for q in list(self.vhost.queues.values()):
            self.apply_to_queue(q)
        for ex in list(self.vhost.exchanges.values()):
            self.apply_to_exchange(ex)

    def apply_to_queue(self, q: QueueType) -> None:
        policy = self.policies.match("queues", q.name)
        operator = self.operator_policies.match("queues", q.name)
        applied = q.args.applied
        if policy is not applied.policy or operator is not applied.operator_policy:
            q.set_policies(AppliedPolicies(policy, operator,
                                           effective_definition(policy, operator)))

    def apply_to_exchange(self, ex: Exchange) -> None:
        policy = self.policies.match("exchanges", ex.name)
        if policy is not ex.policy:
            ex.set_policy(policy)

    # -- limits -----------------------------------------------------------------------------
    def set_limits(self, limits: dict[str, int]) -> None:
        """Replace the limits (validated by broker.policy.parse_limits)."""
        self.limits = dict(limits)
        self.vhost._changed("put_limits", self.limits)

    def check_new_queue(self, name: str) -> None:
        limit = limit_reached(self.limits, "max-queues", len(self.vhost.queues))
        if limit is not None:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"cannot declare queue '{name}': queue limit in vhost '{self.vhost.name}' "
                f"({limit}) is reached",
            )

    def check_new_connection(self, user: str, opened: int) -> None:
        """Called at connection.open, before the connection counts as opened in this vhost:
        `opened` connections are open in the vhost, on every node (broker/server/limits.py)."""
        limit = limit_reached(self.limits, "max-connections", opened)
        if limit is not None:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"access to vhost '{self.vhost.name}' refused for user '{user}': "
                f"connection limit ({limit}) is reached",
                (10, 40),
            )
