"""Exchanges and bindings: the per-exchange half of routing (rabbit_exchange_type_*).

An `Exchange` keeps its bindings in one ordered registry (identity = source, destination,
routing key and arguments, as RabbitMQ) plus a type-specific index that `route` reads on every
publish. Destinations are any hashable objects: the lead's queues, or `Exchange` instances for
exchange-to-exchange bindings (exchanges hash by identity). Following those bindings, the
alternate exchange and CC/BCC is `broker.routing.router.route`'s job, not this module's.

Indexes hold a reference count per destination because two bindings that differ only in
arguments still deliver one copy. `route` may return an index's own container (a dict whose
keys are the destinations) to avoid a copy per publish: callers must only iterate it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from broker.message import Message

if TYPE_CHECKING:
    from broker.policy import Policy

__all__ = [
    "Binding",
    "DirectExchange",
    "Exchange",
    "FanoutExchange",
    "freeze_arguments",
    "make_exchange",
]

_EMPTY: tuple[()] = ()


class _Table(tuple):  # type: ignore[type-arg]
    """Frozen nested field table (sorted pairs); a distinct type so it thaws back to a dict."""

    __slots__ = ()


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _Table(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, _Table):
        return {k: _thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def freeze_arguments(arguments: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """The hashable form of an arguments table: pairs sorted by key, arrays as tuples.

    Values compare with Python equality, so 1, 1.0 and True are the same argument value (RabbitMQ
    compares typed values); clients do not rely on that difference in binding arguments."""
    if not arguments:
        return _EMPTY
    return tuple(sorted((str(k), _freeze(v)) for k, v in arguments.items()))


@dataclass(frozen=True, slots=True)
class Binding:
    """One binding. Equality (hence identity in an exchange) covers all four fields."""

    source: str
    destination: object
    routing_key: str
    arguments: tuple[tuple[str, Any], ...] = _EMPTY

    def arguments_dict(self) -> dict[str, Any]:
        """The arguments as a field table again (for listing and the definitions file)."""
        return {k: _thaw(v) for k, v in self.arguments}


class Exchange:
    """Base of the exchange types. `Exchange(name, "topic")` builds the right subclass, so
    `Exchange(...)` and `make_exchange(...)` are the same factory."""

    __slots__ = (
        "__weakref__",
        "_bindings",
        "_by_dest",
        "_exchange_dests",
        "alternate_exchange",
        "arguments",
        "auto_delete",
        "durable",
        "internal",
        "name",
        "policy",
        "type",
    )

    type_name: ClassVar[str] = ""
    uses_routing_key: ClassVar[bool] = True  # False: route() ignores the key (fanout, headers)
    _types: ClassVar[dict[str, type[Exchange]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.type_name:
            Exchange._types[cls.type_name] = cls

    def __new__(cls, name: str, type: str = "", **_: Any) -> Exchange:
        if cls is Exchange:
            sub = Exchange._types.get(type)
            if sub is None:
                raise ValueError(f"unknown exchange type {type}")
            cls = sub
        return object.__new__(cls)

    def __init__(
        self,
        name: str,
        type: str,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        if type != self.type_name:
            raise ValueError(f"{self.__class__.__name__} cannot be of type {type}")
        self.name = name
        self.type = type
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments: dict[str, Any] = dict(arguments) if arguments else {}
        self.alternate_exchange: str | None = None
        self.policy: Policy | None = None
        self.set_policy(None)
        self._bindings: dict[Binding, None] = {}  # insertion-ordered set
        self._by_dest: dict[object, dict[Binding, None]] = {}
        # How many bindings lead to another exchange: lets the router skip e2e work.
        self._exchange_dests = 0

    def set_policy(self, policy: Policy | None) -> None:
        """The policy that applies changed (set by the vhost): the alternate exchange is the
        argument's, else the policy's (RabbitMQ reads the argument, then the policy)."""
        self.policy = policy
        ae = self.arguments.get("alternate-exchange")
        if isinstance(ae, bytes):
            ae = ae.decode("utf-8", "replace")
        if not isinstance(ae, str) and policy is not None:
            ae = policy.definition.get("alternate-exchange")
        self.alternate_exchange = ae if isinstance(ae, str) else None

    # -- bindings ------------------------------------------------------------------------------
    def bind(
        self, destination: object, routing_key: str, arguments: dict[str, Any] | None = None
    ) -> bool:
        """Add a binding; False if that exact binding (key and arguments) existed."""
        b = Binding(self.name, destination, routing_key, freeze_arguments(arguments))
        if b in self._bindings:
            return False
        self._validate(b, arguments or {})
        self._bindings[b] = None
        self._by_dest.setdefault(destination, {})[b] = None
        if isinstance(destination, Exchange):
            self._exchange_dests += 1
        self._add(b, arguments or {})
        return True

    def unbind(
        self, destination: object, routing_key: str, arguments: dict[str, Any] | None = None
    ) -> bool:
        """Remove a binding; False if it was absent."""
        b = Binding(self.name, destination, routing_key, freeze_arguments(arguments))
        if b not in self._bindings:
            return False
        self._drop(b)
        return True

    def unbind_all(self, destination: object) -> list[Binding]:
        """Remove every binding to `destination` (it is being deleted); returns them."""
        removed = list(self._by_dest.get(destination, ()))
        for b in removed:
            self._drop(b)
        return removed

    def bindings(self) -> list[Binding]:
        return list(self._bindings)

    def bindings_for(self, destination: object) -> list[Binding]:
        return list(self._by_dest.get(destination, ()))

    def has_bindings(self) -> bool:
        return bool(self._bindings)

    def _drop(self, b: Binding) -> None:
        del self._bindings[b]
        per_dest = self._by_dest[b.destination]
        del per_dest[b]
        if not per_dest:
            del self._by_dest[b.destination]
        if isinstance(b.destination, Exchange):
            self._exchange_dests -= 1
        self._remove(b)

    # -- the type-specific part ----------------------------------------------------------------
    @staticmethod
    def validate_arguments(arguments: dict[str, Any]) -> None:
        """Raise (a ChannelError) if the type rejects these exchange arguments at declare."""

    def _validate(self, binding: Binding, arguments: dict[str, Any]) -> None:
        """Raise (a ChannelError) if the type rejects these binding arguments."""

    def _add(self, binding: Binding, arguments: dict[str, Any]) -> None:
        raise NotImplementedError

    def _remove(self, binding: Binding) -> None:
        raise NotImplementedError

    def route(self, routing_key: str, message: Message) -> Iterable[object]:
        """The destinations this exchange alone matches (may include Exchanges)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.__class__.__name__} {self.name!r}>"


def _incr(counts: dict[object, int], dest: object) -> None:
    counts[dest] = counts.get(dest, 0) + 1


def _decr(counts: dict[object, int], dest: object) -> None:
    n = counts[dest] - 1
    if n:
        counts[dest] = n
    else:
        del counts[dest]


class DirectExchange(Exchange):
    """Exact routing-key match: one dict lookup per publish, whatever the binding count."""

    __slots__ = ("_routes",)
    type_name = "direct"

    def __init__(self, name: str, type: str = "direct", **kwargs: Any) -> None:
        super().__init__(name, type, **kwargs)
        self._routes: dict[str, dict[object, int]] = {}

    def _add(self, binding: Binding, arguments: dict[str, Any]) -> None:
        _incr(self._routes.setdefault(binding.routing_key, {}), binding.destination)

    def _remove(self, binding: Binding) -> None:
        counts = self._routes[binding.routing_key]
        _decr(counts, binding.destination)
        if not counts:
            del self._routes[binding.routing_key]

    def route(self, routing_key: str, message: Message) -> Iterable[object]:
        return self._routes.get(routing_key, _EMPTY)


class FanoutExchange(Exchange):
    """Every bound destination; the routing key is ignored."""

    __slots__ = ("_dests",)
    type_name = "fanout"
    uses_routing_key = False

    def __init__(self, name: str, type: str = "fanout", **kwargs: Any) -> None:
        super().__init__(name, type, **kwargs)
        self._dests: dict[object, int] = {}

    def _add(self, binding: Binding, arguments: dict[str, Any]) -> None:
        _incr(self._dests, binding.destination)

    def _remove(self, binding: Binding) -> None:
        _decr(self._dests, binding.destination)

    def route(self, routing_key: str, message: Message) -> Iterable[object]:
        return self._dests


def make_exchange(
    name: str,
    type: str,
    *,
    durable: bool = False,
    auto_delete: bool = False,
    internal: bool = False,
    arguments: dict[str, Any] | None = None,
) -> Exchange:
    """An exchange of `type`; ValueError("unknown exchange type ...") for any other type."""
    return Exchange(
        name,
        type,
        durable=durable,
        auto_delete=auto_delete,
        internal=internal,
        arguments=arguments,
    )
