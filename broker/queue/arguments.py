"""Queue and consumer x-arguments: validation at declare/consume time (reply codes and texts as
RabbitMQ 3.10) and `QueueArgs`, the typed view the queue works from.

This is the one place that reads a queue's arguments. A layer that adds to them (policies,
operator policies) builds the effective argument table and hands it to `QueueArgs`; the queue
never looks at `AMQQueue.arguments` itself.

Queue types, as RabbitMQ's rabbit_queue_type: each type names the arguments it takes
(`QUEUE_ARGUMENTS`, RabbitMQ 3.10.8's `capabilities/0`); a declare is checked in RabbitMQ's
order: `x-queue-type` itself, then the values of the arguments the type takes, then any
argument another type takes and this one does not (406 "... of queue type rabbit_T_queue"),
then the properties a replicated type requires (durable, not exclusive, not auto-delete). A
redeclare is compared on the type's arguments. Arguments no type knows pass unchecked.
`quorum` is broker/queue/quorum_queue.py, `stream` broker/queue/stream_queue.py
(`QueueArgs.kind` says what the queue really is)."""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Callable
from typing import Any, TypeGuard

from broker.protocol.constants import PRECONDITION_FAILED
from broker.protocol.errors import ChannelError
from broker.queue.policy_args import NO_POLICIES, AppliedPolicies

__all__ = [
    "COMPARED_ARGS",
    "DEAD_LETTER_STRATEGIES",
    "LEADER_LOCATORS",
    "MAX_PRIORITY",
    "MAX_STREAM_SEGMENT_BYTES",
    "OVERFLOW_MODES",
    "QUEUE_ARGUMENTS",
    "QUEUE_MODES",
    "QUEUE_TYPES",
    "QueueArgs",
    "amqp_type",
    "compared_args",
    "consumer_priority",
    "fmt_value",
    "same_argument",
    "validate_queue",
]

MAX_PRIORITY = 255  # rabbit_priority_queue's ?MAX_SUPPORTED_PRIORITY
QUEUE_TYPES = ("classic", "quorum", "stream")
# what each type takes (rabbit_classic_queue, rabbit_quorum_queue, rabbit_stream_queue)
QUEUE_ARGUMENTS: dict[str, frozenset[str]] = {
    "classic": frozenset((
        "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
        "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode",
        "x-queue-version", "x-single-active-consumer", "x-queue-type",
        "x-queue-master-locator")),
    "quorum": frozenset((
        "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy",
        "x-expires", "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
        "x-max-in-memory-bytes", "x-overflow", "x-single-active-consumer", "x-queue-type",
        "x-quorum-initial-group-size", "x-delivery-limit", "x-message-ttl",
        "x-queue-leader-locator")),
    "stream": frozenset((
        "x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size", "x-queue-leader-locator")),
}
_ANY_TYPE = frozenset().union(*QUEUE_ARGUMENTS.values())
SERVED_TYPES = ("classic", "quorum", "stream")  # the types Hare has
MAX_STREAM_SEGMENT_BYTES = 3_000_000_000  # RabbitMQ's ?MAX_STREAM_MAX_SEGMENT_SIZE
REPLICATED_TYPES = ("quorum", "stream")  # durable, not exclusive, not auto-delete
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_MODES = ("default", "lazy")  # lazy: every body paged out as it arrives (FLOW.md)
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
_QUEUE_VERSIONS = (1, 2)
_MAX_EXPIRY_MS = 0xFFFFFFFF  # RabbitMQ's ?MAX_EXPIRY_TIMER: x-message-ttl and x-expires
_MAX_AGE = re.compile(r"([0-9]*)(.*)")
# What a classic queue's redeclare is compared on (the others: QUEUE_ARGUMENTS of their type)
COMPARED_ARGS = QUEUE_ARGUMENTS["classic"] | {"x-max-in-memory-length", "x-max-in-memory-bytes"}


class QueueArgs:
    """The effective arguments of a queue, typed. Built from an already validated table."""

    __slots__ = (
        "applied", "dead_letter_strategy", "delivery_limit", "dlrk", "dlx", "expires_ms",
        "kind", "max_length", "max_length_bytes", "max_priority", "overflow", "queue_mode",
        "queue_type", "single_active", "ttl_ms",
    )

    def __init__(self, arguments: dict[str, Any],
                 applied: AppliedPolicies = NO_POLICIES) -> None:
        """`arguments`: the effective table (broker.queue.policy_args); `applied`: the
        policies it was resolved against, kept for the management API."""
        self.applied = applied
        self.ttl_ms: int | None = arguments.get("x-message-ttl")
        self.expires_ms: int | None = arguments.get("x-expires")
        self.max_length: int | None = arguments.get("x-max-length")
        self.max_length_bytes: int | None = arguments.get("x-max-length-bytes")
        self.overflow: str = arguments.get("x-overflow", "drop-head")
        self.dlx: str | None = arguments.get("x-dead-letter-exchange")
        self.dlrk: str | None = arguments.get("x-dead-letter-routing-key")
        # 0: no priorities (RabbitMQ accepts 0 and then has one level, which is the same)
        self.max_priority: int = min(int(arguments.get("x-max-priority") or 0), MAX_PRIORITY)
        self.single_active: bool = arguments.get("x-single-active-consumer") is True
        self.queue_type: str = arguments.get("x-queue-type") or "classic"
        self.queue_mode: str = arguments.get("x-queue-mode") or "default"
        # what the queue is: a type Hare does not have yet is served by a classic queue (a
        # warning says so)
        self.kind = self.queue_type if self.queue_type in SERVED_TYPES else "classic"
        # quorum queues: returns after which a message is dead-lettered (RabbitMQ takes any
        # value and compares numbers only), and whether dead-lettering waits for the target
        limit = arguments.get("x-delivery-limit")
        self.delivery_limit: int | None = limit if _is_int(limit) else None
        self.dead_letter_strategy: str = arguments.get("x-dead-letter-strategy") or "at-most-once"

    @property
    def lazy(self) -> bool:
        return self.queue_mode == "lazy"


    @property
    def at_least_once(self) -> bool:
        """Dead-lettering with publisher confirms (a quorum queue's x-dead-letter-strategy
        at-least-once, which RabbitMQ honours only with x-overflow reject-publish and a
        dead-letter exchange; else it falls back to at-most-once)."""
        return (self.dead_letter_strategy == "at-least-once" and self.overflow == "reject-publish"
                and self.dlx is not None)


def amqp_type(value: object) -> str:
    """The AMQP field type name RabbitMQ reports for a decoded value ("longstr", "bool", ...)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long" if -(1 << 31) <= value < (1 << 31) else "longlong"
    if isinstance(value, str | bytes):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return "void" if value is None else type(value).__name__


def _invalid(key: str, queue: str, vhost: str, detail: str) -> ChannelError:
    return ChannelError(
        PRECONDITION_FAILED, f"invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {detail}"
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(value: object) -> str | None:
    return None if _is_int(value) else f'"expected integer, got {amqp_type(value)}"'


def _non_negative(value: Any) -> str | None:
    return _integer(value) or (f"{{value_negative,{value}}}" if value < 0 else None)


def _positive(value: Any) -> str | None:  # RabbitMQ's check_initial_cluster_size_arg
    return _non_negative(value) or ("{value_zero,0}" if value == 0 else None)


def _timer(zero_ok: bool) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        problem = _non_negative(value)
        if problem is None and value == 0 and not zero_ok:
            problem = "{value_zero,0}"
        if problem is None and value > _MAX_EXPIRY_MS:
            problem = f"{{value_too_large,{value}}}"
        return problem
    return check


def _max_priority(value: Any) -> str | None:
    problem = _non_negative(value)
    if problem is None and value > MAX_PRIORITY:
        problem = f"{{max_value_exceeded,{value}}}"
    return problem


def _one_of(choices: tuple[str, ...], bad: Callable[[str], str]) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"{{unacceptable_type,{_erl_type(value)}}}"
        return None if value in choices else bad(value)
    return check


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else f"{{unacceptable_type,{_erl_type(value)}}}"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{{unacceptable_type,{_erl_type(value)}}}"


def _queue_version(value: Any) -> str | None:
    if _is_int(value) and value in _QUEUE_VERSIONS:
        return None
    return f"\"unsupported queue version '{value}'\""


def _max_age(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{{unacceptable_type,{_erl_type(value)}}}"
    digits, unit = _MAX_AGE.fullmatch(value).groups()  # type: ignore[union-attr]
    if digits and int(digits) > 0 and unit in ("Y", "M", "D", "h", "m", "s"):
        return None
    return "invalid_max_age"


# RabbitMQ's declare_args(), in its order: each argument's value check
_CHECKS: tuple[tuple[str, Callable[[Any], str | None]], ...] = (
    ("x-expires", _timer(zero_ok=False)),
    ("x-message-ttl", _timer(zero_ok=True)),
    ("x-dead-letter-exchange", _text),
    ("x-dead-letter-routing-key", _text),
    ("x-dead-letter-strategy", _one_of(DEAD_LETTER_STRATEGIES, lambda v: "invalid_dlx_strategy")),
    ("x-max-length", _non_negative),
    ("x-max-length-bytes", _non_negative),
    ("x-max-in-memory-length", _non_negative),
    ("x-max-in-memory-bytes", _non_negative),
    ("x-max-priority", _max_priority),
    ("x-overflow", _one_of(OVERFLOW_MODES, lambda v: "invalid_overflow")),
    ("x-queue-mode", _one_of(QUEUE_MODES, lambda v: f"\"unsupported queue mode '{v}'\"")),
    ("x-queue-version", _queue_version),
    ("x-single-active-consumer", _boolean),
    ("x-quorum-initial-group-size", _positive),
    ("x-max-age", _max_age),
    ("x-stream-max-segment-size-bytes", _non_negative),
    ("x-initial-cluster-size", _positive),
    ("x-queue-leader-locator", _one_of(LEADER_LOCATORS, lambda v: "invalid_queue_locator_arg")),
)
_QUEUE_TYPE = _one_of(QUEUE_TYPES, lambda v: f"\"unsupported queue type '{v}'\"")


def validate_queue(
    name: str,
    vhost: str,
    arguments: dict[str, Any],
    *,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
) -> None:
    """Refuse what RabbitMQ refuses at queue.declare (406), in its order (module docstring);
    longstr values given as bytes become str in `arguments`."""
    for key, value in arguments.items():
        if isinstance(value, bytes) and key in _ANY_TYPE:
            arguments[key] = value.decode(errors="replace")
    queue_type = arguments.get("x-queue-type")
    if queue_type is not None:
        problem = _QUEUE_TYPE(queue_type)
        if problem is not None:
            raise _invalid("x-queue-type", name, vhost, problem)
    queue_type = queue_type or "classic"
    takes = QUEUE_ARGUMENTS[queue_type]
    for key, check in _CHECKS:
        if key not in takes or key not in arguments:
            continue
        value = arguments[key]
        problem = check(value)
        if problem is None and key == "x-dead-letter-routing-key" and (
                "x-dead-letter-exchange" not in arguments):
            problem = "routing_key_but_no_dlx_defined"
        if problem is None:
            continue
        if key == "x-dead-letter-exchange":
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid type '{_erl_type(value)}' for arg '{key}' in queue '{name}' "
                f"in vhost '{vhost}'",
            )
        raise _invalid(key, name, vhost, problem)
    for key in arguments:
        if key in _ANY_TYPE and key not in takes:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}' of queue type "
                f"rabbit_{queue_type}_queue",
            )
    if queue_type in REPLICATED_TYPES:
        for prop, bad in (("auto-delete", auto_delete), ("exclusive-owner", exclusive),
                          ("non-durable", not durable)):
            if bad:
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"invalid property '{prop}' for queue '{name}' in vhost '{vhost}'",
                )
    segment = arguments.get("x-stream-max-segment-size-bytes")
    if queue_type == "stream" and _is_int(segment) and segment > MAX_STREAM_SEGMENT_BYTES:
        raise ChannelError(PRECONDITION_FAILED,
                           "Exceeded max value for x-stream-max-segment-size-bytes")


def compared_args(queue_type: str) -> frozenset[str]:
    """What a redeclare of a queue of this type is compared on."""
    return COMPARED_ARGS if queue_type == "classic" else QUEUE_ARGUMENTS[queue_type]


def same_argument(key: str, have: object, want: object) -> bool:
    """Whether a redeclare's argument matches the queue's (x-queue-type: absent is classic)."""
    if key == "x-queue-type":
        return (have or "classic") == (want or "classic")
    return have == want


def consumer_priority(arguments: dict[str, Any] | None, queue: str, vhost: str) -> int:
    """basic.consume's x-priority (0 when absent); 406 for a value that is not an integer."""
    if not arguments or "x-priority" not in arguments:
        return 0
    value = arguments["x-priority"]
    if not _is_int(value):
        raise _invalid("x-priority", queue, vhost, f'"expected integer, got {amqp_type(value)}"')
    return int(value)


def fmt_value(value: object) -> str:
    """A value in an error text, as RabbitMQ prints {Type,Value}."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"{{bool,{'true' if value else 'false'}}}"
    if isinstance(value, int):
        return f"{{long,{value}}}"
    return f'{{longstr,<<"{value}">>}}'


def _erl_type(value: object) -> str:
    """The type in an {unacceptable_type,T} error: RabbitMQ's name for the wire type (a
    decoded int was a signedint on the wire for every client we know of)."""
    if _is_int(value):
        return "signedint"
    return amqp_type(value)
