"""Routing: exchanges, bindings and the router. Pure code, no asyncio.

Importing the package registers every exchange type, so `make_exchange` (or
`Exchange(name, type)`) knows them all. docs/ROUTING.md describes the rules."""

from broker.routing.consistent_hash import ConsistentHashExchange
from broker.routing.delayed import DelayedMessageExchange, message_delay
from broker.routing.exchange import (
    Binding,
    DirectExchange,
    Exchange,
    FanoutExchange,
    freeze_arguments,
    make_exchange,
)
from broker.routing.headers import HeadersExchange, headers_match
from broker.routing.router import route, routing_keys
from broker.routing.topic import TopicExchange, TopicTrie

__all__ = [
    "Binding",
    "ConsistentHashExchange",
    "DelayedMessageExchange",
    "DirectExchange",
    "Exchange",
    "FanoutExchange",
    "HeadersExchange",
    "TopicExchange",
    "TopicTrie",
    "freeze_arguments",
    "headers_match",
    "make_exchange",
    "message_delay",
    "route",
    "routing_keys",
]
