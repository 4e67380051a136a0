"""A virtual host: its exchanges, queues and bindings, and the AMQP rules for declaring,
binding and deleting them (reply codes and texts as RabbitMQ). Plain objects; the channel calls
these methods and turns the errors into channel.close / connection.close."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import structlog

from broker.message import Message
from broker.protocol.constants import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
)
from broker.protocol.errors import ChannelError, ConnectionError_
from broker.queue.arguments import (
    amqp_type,
    compared_args,
    fmt_value,
    same_argument,
    validate_queue,
)
from broker.queue.dead_letter import is_cycle
from broker.queue.delay_queue import DelayQueue
from broker.queue.types import queue_class
from broker.routing.delayed import DelayedMessageExchange
from broker.routing.exchange import Exchange
from broker.routing.router import may_have_cc, routing_keys
from broker.routing.router import route as route_through
from broker.vhost_params import VHostParams

if TYPE_CHECKING:
    from broker.node import Node
    from broker.queue.contract import QueueType

__all__ = ["PREDECLARED", "VHost"]

log = structlog.get_logger("hare.vhost")

PREDECLARED = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)


class VHost:
    def __init__(self, name: str, node: Node | None = None) -> None:
        self.name = name
        self.node = node
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, QueueType] = {}  # any queue type (broker/queue/contract.py)
        self.default_exchange = Exchange("", "direct", durable=True)
        self.exchanges[""] = self.default_exchange
        for xname, xtype in PREDECLARED:
            self.exchanges[xname] = Exchange(xname, xtype, durable=True)
        # observers for durable definitions (the definitions store subscribes)
        self.on_change: Callable[[str, str, object], None] | None = None
        # policies, operator policies and limits
        self.params = VHostParams(self)

    # -- lookups ----------------------------------------------------------------------------
    def _where(self) -> str:
        return f"in vhost '{self.name}'"

    def exchange(self, name: str) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None:
            raise ChannelError(NOT_FOUND, f"no exchange '{name}' {self._where()}")
        return ex

    def queue(self, name: str, owner: object | None = None) -> QueueType:
        q = self.queues.get(name)
        if q is None:
            raise ChannelError(NOT_FOUND, f"no queue '{name}' {self._where()}")
        if q.exclusive_owner is not None and owner is not None and q.exclusive_owner is not owner:
            raise self._locked(name)
        return q

    def _locked(self, name: str) -> ChannelError:
        return ChannelError(
            RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked queue '{name}' {self._where()}. "
            "It could be originally declared on another connection or the exclusive "
            "property value does not match that of the original declaration.",
        )

    # -- exchanges --------------------------------------------------------------------------
    def declare_exchange(
        self,
        name: str,
        type_: str,
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Exchange:
        if passive:
            if name == "":
                self._not_default(self.default_exchange)  # RabbitMQ: 403, passive or not
            return self.exchange(name)
        if type_ not in Exchange._types:  # RabbitMQ checks the type before anything else
            raise ConnectionError_(COMMAND_INVALID, f"unknown exchange type '{type_}'")
        if name == "":
            self._not_default(self.default_exchange)  # RabbitMQ: 403, even as it is
        existing = self.exchanges.get(name)
        if existing is not None:  # an existing amq.* one is compared
            for field, have, want in (
                ("type", existing.type, type_),
                ("durable", existing.durable, durable),
                ("auto_delete", existing.auto_delete, auto_delete),
                ("internal", existing.internal, internal),
            ):
                if have != want:
                    raise ChannelError(
                        PRECONDITION_FAILED,
                        f"inequivalent arg '{field}' for exchange '{name}' {self._where()}: "
                        f"received '{_fmt(want)}' but current is '{_fmt(have)}'",
                    )
            # RabbitMQ compares one argument of an exchange: its alternate exchange
            have_ae = existing.arguments.get("alternate-exchange")
            want_ae = (arguments or {}).get("alternate-exchange")
            if _text(have_ae) != _text(want_ae):
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg 'alternate-exchange' for exchange '{name}' "
                    f"{self._where()}: received {fmt_value(_text(want_ae))} but current is "
                    f"{fmt_value(_text(have_ae))}",
                )
            return existing
        self.check_new_exchange(name, type_, arguments)
        try:
            return self.add_exchange(name, type_, durable=durable, auto_delete=auto_delete,
                                     internal=internal, arguments=arguments)
        except ValueError as exc:
            raise ConnectionError_(COMMAND_INVALID, f"unknown exchange type '{type_}'") from exc

    def add_exchange(self, name: str, type_: str, *, durable: bool, auto_delete: bool = False,
                     internal: bool = False, arguments: dict[str, Any] | None = None
                     ) -> Exchange:
        """A new exchange, without the declare rules (restore, the cluster's metadata)."""
        ex = Exchange(name, type_, durable=durable, auto_delete=auto_delete, internal=internal,
                      arguments=dict(arguments or {}))
        self.adopt_exchange(ex)
        self.exchanges[name] = ex
        self._changed("put_exchange", ex)
        return ex

    def adopt_exchange(self, ex: Exchange) -> None:
        """Wire a new or restored exchange to this vhost: its policy, its delay holders."""
        self.params.apply_to_exchange(ex)
        if isinstance(ex, DelayedMessageExchange):
            ex.hold = self._delay_queue

    def _delay_queue(self, ex: DelayedMessageExchange, delay: int) -> DelayQueue:
        q = DelayQueue(self, ex.name, delay, durable=ex.durable)
        if self.node is not None and self.node.durable is not None:
            self.node.durable.new_queue(q)
        q.start()
        return q

    def delay_queues(self) -> Iterator[DelayQueue]:
        """The queues holding the delayed-message exchanges' messages (in no `queues`)."""
        for ex in self.exchanges.values():
            if isinstance(ex, DelayedMessageExchange):
                for held in ex.held.values():
                    assert isinstance(held, DelayQueue)
                    yield held

    def _drop_held(self, ex: Exchange) -> None:
        """`ex` is gone: so are the messages it was holding (as the plugin's)."""
        if isinstance(ex, DelayedMessageExchange):
            for q in ex.held.values():
                assert isinstance(q, DelayQueue)
                q.stop()
            ex.held.clear()

    def check_new_exchange(self, name: str, type_: str, arguments: dict[str, Any] | None
                           ) -> None:
        """The rules a new exchange passes before it exists anywhere (a cluster claims its
        name in etcd after this and before declare_exchange creates it)."""
        if type_ not in Exchange._types:
            raise ConnectionError_(COMMAND_INVALID, f"unknown exchange type '{type_}'")
        if name == "":
            self._not_default(self.default_exchange)
        if name.startswith("amq."):
            raise ChannelError(
                ACCESS_REFUSED,
                f"exchange name '{name}' contains reserved prefix 'amq.*'",
            )
        ae = (arguments or {}).get("alternate-exchange")
        if ae is not None and not isinstance(ae, str | bytes):
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid type '{amqp_type(ae)}' for arg 'alternate-exchange' in exchange "
                f"'{name}' {self._where()}",
            )
        Exchange._types[type_].validate_arguments(arguments or {})

    def delete_exchange(self, name: str, if_unused: bool = False) -> None:
        if name == "":
            self._not_default(self.default_exchange)
        if name.startswith("amq."):
            raise ChannelError(
                ACCESS_REFUSED, f"operation not permitted on exchange '{name}' {self._where()}"
            )
        ex = self.exchanges.get(name)
        if ex is None:
            return  # RabbitMQ: deleting a missing exchange succeeds
        if if_unused and ex.has_bindings():
            raise ChannelError(PRECONDITION_FAILED, f"exchange '{name}' {self._where()} in use")
        del self.exchanges[name]
        self._unbind_everywhere(ex)
        self._drop_held(ex)
        self._changed("delete_exchange", ex)

    def _unbind_everywhere(self, ex: Exchange) -> None:
        """`ex` is gone: drop the bindings to it; an auto-delete source left without bindings
        goes too (RabbitMQ's process_deletions)."""
        for other in list(self.exchanges.values()):
            if other.unbind_all(ex):
                self._maybe_auto_delete(other)

    def bind_exchange(
        self, destination: str, source: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        dst = self.exchange(destination)
        src = self.exchange(source)
        self._not_default(src, dst)
        if src.bind(dst, routing_key, arguments):
            self._changed("put_binding", (src, dst, routing_key, arguments))

    def unbind_exchange(
        self, destination: str, source: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        """A binding whose source or destination no longer exists is already gone: unbind-ok,
        as RabbitMQ (clients' clean-up code deletes first and unbinds after)."""
        dst = self.exchanges.get(destination)
        src = self.exchanges.get(source)
        self._not_default(*(x for x in (src, dst) if x is not None))
        if src is not None and dst is not None and src.unbind(dst, routing_key, arguments):
            self._changed("delete_binding", (src, dst, routing_key, arguments))
            self._maybe_auto_delete(src)

    def _not_default(self, *exchanges: Exchange) -> None:
        for ex in exchanges:
            if ex is self.default_exchange:
                raise ChannelError(
                    ACCESS_REFUSED, "operation not permitted on the default exchange"
                )

    def _maybe_auto_delete(self, ex: Exchange) -> None:
        if ex.auto_delete and not ex.has_bindings() and self.exchanges.get(ex.name) is ex:
            del self.exchanges[ex.name]
            self._unbind_everywhere(ex)
            self._drop_held(ex)
            self._changed("delete_exchange", ex)

    # -- queues -----------------------------------------------------------------------------
    def declare_queue(
        self,
        name: str,
        *,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        owner: object | None = None,
        server_named: bool = False,
    ) -> QueueType:
        """`server_named`: `name` was generated for a queue.declare with an empty name."""
        if passive:
            q = self.queue(name, owner)
            q.touch()
            return q
        if not name:
            name = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
            server_named = True
        arguments = dict(arguments or {})
        existing = self.queues.get(name)
        if existing is not None:
            self.queue(name, owner)  # exclusivity check
            if (existing.exclusive_owner is None) == exclusive:
                # RabbitMQ's strict check_exclusive_access: a mismatch is 405, not 406
                raise self._locked(name)
            for field, have, want in (
                ("durable", existing.durable, durable),
                ("auto_delete", existing.auto_delete, auto_delete),
            ):
                if have != want:
                    raise ChannelError(
                        PRECONDITION_FAILED,
                        f"inequivalent arg '{field}' for queue '{name}' {self._where()}: "
                        f"received '{_fmt(want)}' but current is '{_fmt(have)}'",
                    )
            compared = compared_args(existing.args.queue_type)
            for key in set(arguments) | set(existing.arguments):
                have, want = existing.arguments.get(key), arguments.get(key)
                if key in compared and not same_argument(key, have, want):
                    raise ChannelError(
                        PRECONDITION_FAILED,
                        f"inequivalent arg '{key}' for queue '{name}' {self._where()}: "
                        f"received {fmt_value(want)} but current is {fmt_value(have)}",
                    )
            existing.touch()
            return existing
        self.check_new_queue(name, arguments, durable=durable, exclusive=exclusive,
                             auto_delete=auto_delete, server_named=server_named)
        q = queue_class(arguments)(
            self,
            name,
            durable=durable,
            exclusive_owner=owner if exclusive else None,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        self.queues[name] = q
        if self.node is not None and self.node.durable is not None:
            self.node.durable.new_queue(q)
        self.params.apply_to_queue(q)
        q.start()
        self._changed("put_queue", q)
        return q

    def check_new_queue(self, name: str, arguments: dict[str, Any], *, durable: bool,
                        exclusive: bool, auto_delete: bool, server_named: bool = False) -> None:
        """The rules a new queue passes before it exists anywhere (a cluster claims its name
        in etcd after this and before declare_queue creates it). Only a new queue is refused
        an amq.* name: RabbitMQ lets an existing server-named queue be redeclared by name."""
        if name.startswith("amq.") and not server_named:
            raise ChannelError(
                ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'"
            )
        validate_queue(name, self.name, arguments, durable=durable, exclusive=exclusive,
                       auto_delete=auto_delete)
        self.params.check_new_queue(name)

    async def check_queue_delete(self, q: QueueType, *, if_unused: bool, if_empty: bool) -> int:
        """queue.delete's if-unused and if-empty judged on the counts of the queue's home: a
        queue homed on another node (worker) has no messages here and only this node's
        consumers, so delete_queue's own checks would let a non-empty one go. Returns the
        home's message count (delete-ok's); without either flag a home that cannot answer
        (down) counts 0 and the delete goes on."""
        try:
            messages, consumers = await q.counts()
        except ChannelError:
            if if_unused or if_empty:
                raise  # nothing to judge by
            return 0
        if if_unused and consumers:
            raise ChannelError(PRECONDITION_FAILED, f"queue '{q.name}' {self._where()} in use")
        if if_empty and messages:
            raise ChannelError(PRECONDITION_FAILED, f"queue '{q.name}' {self._where()} not empty")
        return messages

    def delete_queue(self, q: QueueType, *, if_unused: bool = False, if_empty: bool = False) -> int:
        if if_unused and q.consumers:
            raise ChannelError(PRECONDITION_FAILED, f"queue '{q.name}' {self._where()} in use")
        if if_empty and q.message_count:
            raise ChannelError(PRECONDITION_FAILED, f"queue '{q.name}' {self._where()} not empty")
        if self.queues.get(q.name) is not q:
            return 0
        count = q.message_count
        del self.queues[q.name]
        for consumer in list(q.consumers):
            consumer.channel.consumer_cancelled_by_queue(consumer)
        q.consumers.clear()
        for ex in list(self.exchanges.values()):
            if ex.unbind_all(q):
                self._maybe_auto_delete(ex)
        q.stop()
        self._changed("delete_queue", q)
        return count

    def bind_queue(
        self, queue: QueueType, exchange: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        ex = self.exchange(exchange)
        self._not_default(ex)
        if ex.bind(queue, routing_key, arguments):
            self._changed("put_binding", (ex, queue, routing_key, arguments))

    def unbind_queue(
        self, queue: QueueType | None, exchange: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        """`queue` None: it no longer exists. Like a missing exchange, that is unbind-ok (as
        RabbitMQ), but unbinding from the default exchange is 403 either way."""
        ex = self.exchanges.get(exchange)
        if ex is None:
            return
        self._not_default(ex)
        if queue is not None and ex.unbind(queue, routing_key, arguments):
            self._changed("delete_binding", (ex, queue, routing_key, arguments))
            self._maybe_auto_delete(ex)

    def move_bindings(self, old: object, new: object) -> None:
        """Every binding to `old` now leads to `new` (a cluster's quorum queue whose leader
        changed: the same queue, another object on this node). Not a definition change."""
        for ex in self.exchanges.values():
            for b in ex.unbind_all(old):
                ex.bind(new, b.routing_key, b.arguments_dict())

    def drop_exclusive(self, owner: object) -> None:
        """The owning connection closed: its exclusive queues go."""
        for q in [q for q in self.queues.values() if q.exclusive_owner is owner]:
            self.delete_queue(q)

    # -- routing ----------------------------------------------------------------------------
    def route(self, ex: Exchange, msg: Message) -> Any:
        """The queues a message goes to (an iterable of AMQQueue)."""
        if ex is self.default_exchange:
            if not may_have_cc(msg.props):
                q = self.queues.get(msg.routing_key)
                return (q,) if q is not None else ()
            keys = routing_keys(msg)  # CC/BCC route through the default exchange too
            return {q for k in keys if (q := self.queues.get(k)) is not None}
        return route_through(ex, msg, self.exchanges.get)

    def publish_internal(self, msg: Message) -> int:
        """Publish without a channel (dead-lettering). Returns the number of queues reached."""
        ex = self.exchanges.get(msg.exchange)
        if ex is None:
            log.warning("dead-letter exchange missing", exchange=msg.exchange, vhost=self.name)
            return 0
        queues = self.route(ex, msg)
        deaths = msg.headers.get("x-death") or []
        msg.decoded = None  # queues keep the raw block only
        n = 0
        for q in queues:
            if is_cycle(q.name, deaths):
                log.warning(
                    "message dropped: dead-letter cycle detected", queue=q.name, vhost=self.name
                )
                continue
            q.post_publishes(None, [(msg, 0)])
            n += 1
        return n

    # -- definitions ------------------------------------------------------------------------
    def _changed(self, what: str, obj: object) -> None:
        if self.on_change is not None:
            self.on_change(self.name, what, obj)

    def stop(self) -> None:
        """Broker shutdown: queue tasks end, durable queue state stays on disk."""
        for q in list(self.queues.values()):
            q.shutdown()
        for held in self.delay_queues():
            held.shutdown()


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _text(value: object) -> object:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
