"""Queue and consumer x-arguments: validation at declare/consume time (reply codes and texts as
RabbitMQ 3.10) and `QueueArgs`, the typed view the queue works from.

This is the one place that reads a queue's arguments. A layer that adds to them (policies,
operator policies) builds the effective argument table and hands it to `QueueArgs`; the queue
never looks at `AMQQueue.arguments` itself.

`x-queue-type`: Hare has classic queues only. `quorum` and `stream` are accepted (applications
declare them unconditionally), checked for the properties RabbitMQ requires of them (durable,
not exclusive, not auto-delete), and give a classic queue; `QueueArgs.queue_type` is what the
client asked for, `QueueArgs.TYPE` the type the queue really is."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

from broker.protocol.constants import PRECONDITION_FAILED
from broker.protocol.errors import ChannelError
from broker.queue.policy_args import NO_POLICIES, AppliedPolicies

__all__ = [
    "COMPARED_ARGS",
    "MAX_PRIORITY",
    "OVERFLOW_MODES",
    "QUEUE_MODES",
    "QUEUE_TYPES",
    "QueueArgs",
    "amqp_type",
    "consumer_priority",
    "fmt_value",
    "same_argument",
    "validate_queue",
]

MAX_PRIORITY = 255  # rabbit_priority_queue's ?MAX_SUPPORTED_PRIORITY
QUEUE_TYPES = ("classic", "quorum", "stream")
REPLICATED_TYPES = ("quorum", "stream")  # accepted, served by a classic queue

_INT_ARGS = ("x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes",
             "x-max-priority")
_STR_ARGS = ("x-dead-letter-exchange", "x-dead-letter-routing-key", "x-overflow",
             "x-queue-type", "x-queue-mode")
# arguments of the features in this module that RabbitMQ's replicated types refuse
_UNSUPPORTED = {
    "quorum": ("x-max-priority",),
    "stream": ("x-max-priority", "x-single-active-consumer"),
}
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_MODES = ("default", "lazy")  # lazy: every body paged out as it arrives (FLOW.md)
_QUEUE_VERSIONS = (1, 2)
_MAX_EXPIRY_MS = 0xFFFFFFFF  # RabbitMQ's ?MAX_EXPIRY_TIMER: x-message-ttl and x-expires
# What a redeclare is compared on: the arguments of a classic queue (RabbitMQ's
# rabbit_queue_type:arguments(queue_arguments, rabbit_classic_queue)); others are ignored
COMPARED_ARGS = frozenset((
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
    "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
    "x-single-active-consumer", "x-queue-type", "x-queue-master-locator",
))


class QueueArgs:
    """The effective arguments of a queue, typed. Built from an already validated table."""

    TYPE = "classic"  # what every Hare queue is, whatever x-queue-type asked for

    __slots__ = (
        "applied", "dlrk", "dlx", "expires_ms", "max_length", "max_length_bytes",
        "max_priority", "overflow", "queue_mode", "queue_type", "single_active", "ttl_ms",
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

    @property
    def lazy(self) -> bool:
        return self.queue_mode == "lazy"


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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_queue(
    name: str,
    vhost: str,
    arguments: dict[str, Any],
    *,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
) -> None:
    """Refuse what RabbitMQ refuses at queue.declare (406); longstr values given as bytes
    become str in `arguments`."""
    for key in _INT_ARGS:
        if key in arguments:
            value = arguments[key]
            if not _is_int(value):
                raise _invalid(key, name, vhost, f'"expected integer, got {amqp_type(value)}"')
            if value < 0:
                raise _invalid(key, name, vhost, f"{{value_negative,{value}}}")
            if value == 0 and key == "x-expires":
                raise _invalid(key, name, vhost, "{value_zero,0}")
            if value > _MAX_EXPIRY_MS and key in ("x-message-ttl", "x-expires"):
                raise _invalid(key, name, vhost, f"{{value_too_large,{value}}}")
    version = arguments.get("x-queue-version")
    if version is not None and (not _is_int(version) or version not in _QUEUE_VERSIONS):
        raise _invalid("x-queue-version", name, vhost,
                       f"\"unsupported queue version '{version}'\"")
    for key in _STR_ARGS:
        if key in arguments:
            value = arguments[key]
            if isinstance(value, bytes):
                value = arguments[key] = value.decode(errors="replace")
            if not isinstance(value, str):
                if key == "x-dead-letter-exchange":
                    raise ChannelError(
                        PRECONDITION_FAILED,
                        f"invalid type '{_erl_type(value)}' for arg '{key}' in queue '{name}' "
                        f"in vhost '{vhost}'",
                    )
                raise _invalid(key, name, vhost, f"{{unacceptable_type,{_erl_type(value)}}}")
            if key == "x-overflow" and value not in OVERFLOW_MODES:
                raise _invalid(key, name, vhost, "invalid_overflow")
            if key == "x-queue-type" and value not in QUEUE_TYPES:
                raise _invalid(key, name, vhost, f"\"unsupported queue type '{value}'\"")
            if key == "x-queue-mode" and value not in QUEUE_MODES:
                raise _invalid(key, name, vhost, f"\"unsupported queue mode '{value}'\"")
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise _invalid("x-dead-letter-routing-key", name, vhost, "routing_key_but_no_dlx_defined")
    priority = arguments.get("x-max-priority")
    if _is_int(priority) and priority > MAX_PRIORITY:
        raise _invalid("x-max-priority", name, vhost, f"{{max_value_exceeded,{priority}}}")
    if "x-single-active-consumer" in arguments:
        value = arguments["x-single-active-consumer"]
        if not isinstance(value, bool):
            raise _invalid("x-single-active-consumer", name, vhost,
                           f"{{unacceptable_type,{_erl_type(value)}}}")
    queue_type = arguments.get("x-queue-type")
    if queue_type in REPLICATED_TYPES:
        # what RabbitMQ requires of a replicated queue, so an application that runs here
        # also runs there
        for key in _UNSUPPORTED[queue_type]:
            if key in arguments:
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}' of queue type "
                    f"rabbit_{queue_type}_queue",
                )
        for prop, bad in (("non-durable", not durable), ("exclusive-owner", exclusive),
                          ("auto-delete", auto_delete)):
            if bad:
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"invalid property '{prop}' for queue '{name}' in vhost '{vhost}'",
                )


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
