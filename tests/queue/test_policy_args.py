"""effective_arguments: client arguments resolved against an effective policy definition,
as RabbitMQ's args_policy_lookup (numeric limits take the smaller value, the others the
argument; either alone is used as it is), then read through QueueArgs as the queue does."""

from __future__ import annotations

from broker.queue.arguments import QueueArgs
from broker.queue.policy_args import effective_arguments


def resolved(arguments: dict, policy: dict | None) -> QueueArgs:
    return QueueArgs(effective_arguments(arguments, policy))


def test_no_policy_reads_the_arguments():
    args = {"x-message-ttl": 10, "x-overflow": "reject-publish", "x-max-priority": 3}
    assert effective_arguments(args, None) == args
    a = resolved(args, {})
    assert (a.ttl_ms, a.overflow, a.max_length, a.dlx, a.queue_mode, a.max_priority) == (
        10, "reject-publish", None, None, "default", 3)


def test_policy_alone_applies():
    a = resolved({}, {"message-ttl": 5, "expires": 9, "max-length": 3,
                      "max-length-bytes": 100, "overflow": "reject-publish-dlx",
                      "dead-letter-exchange": "dlx", "dead-letter-routing-key": "k",
                      "queue-mode": "lazy", "alternate-exchange": "ae"})
    assert (a.ttl_ms, a.expires_ms, a.max_length, a.max_length_bytes) == (5, 9, 3, 100)
    assert (a.overflow, a.dlx, a.dlrk, a.lazy) == ("reject-publish-dlx", "dlx", "k", True)


def test_numeric_limits_take_the_smaller_value():
    args = {"x-message-ttl": 1000, "x-expires": 50, "x-max-length": 5,
            "x-max-length-bytes": 10}
    a = resolved(args, {"message-ttl": 5000, "expires": 20, "max-length": 3,
                        "max-length-bytes": 99})
    assert (a.ttl_ms, a.expires_ms, a.max_length, a.max_length_bytes) == (1000, 20, 3, 10)


def test_the_argument_wins_for_the_others():
    args = {"x-overflow": "drop-head", "x-dead-letter-exchange": "mine",
            "x-dead-letter-routing-key": "rk", "x-queue-mode": "default"}
    a = resolved(args, {"overflow": "reject-publish", "dead-letter-exchange": "theirs",
                        "dead-letter-routing-key": "other", "queue-mode": "lazy"})
    assert (a.overflow, a.dlx, a.dlrk, a.lazy) == ("drop-head", "mine", "rk", False)


def test_keys_resolve_independently():
    """A policy's routing key with the client's dead-letter exchange (RabbitMQ looks each up
    on its own)."""
    a = resolved({"x-dead-letter-exchange": "mine"}, {"dead-letter-routing-key": "pk"})
    assert (a.dlx, a.dlrk) == ("mine", "pk")


def test_the_declared_table_is_not_changed():
    args = {"x-max-length": 5}
    effective_arguments(args, {"max-length": 1, "message-ttl": 3})
    assert args == {"x-max-length": 5}
