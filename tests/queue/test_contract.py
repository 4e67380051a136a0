"""The queue-type contract (broker/queue/contract.py) is met by every class that stands on
either side of it: each protocol member exists on each implementation (a method, a property,
a class attribute or one its __init__ sets), and each method that may answer later is a
coroutine on every implementation, so callers always await and never ask which kind they
hold, taking the same parameters (names, kinds, defaults) as the contract. mypy (`make
lint`) checks the types; this checks, at run time and fast, that nothing was left out."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest

from broker import compiled
from broker.cluster.link_peers import LinkConsumer, LinkSender
from broker.cluster.remote_queue import RemoteQueue
from broker.queue.amqqueue import AMQQueue
from broker.queue.contract import ConsumerChannel, ConsumerWriter, PublishingChannel, QueueType
from broker.queue.quorum_queue import QuorumQueue, _AtLeastOnce
from broker.queue.stream_queue import StreamQueue
from broker.server.channel import Channel
from broker.server.writer import Writer

IMPLEMENTATIONS: list[tuple[type, type]] = [
    (QueueType, AMQQueue), (QueueType, QuorumQueue), (QueueType, StreamQueue),
    (QueueType, RemoteQueue),
    (ConsumerChannel, Channel), (ConsumerChannel, LinkConsumer),
    (ConsumerWriter, Writer), (ConsumerWriter, LinkConsumer),
    (PublishingChannel, Channel), (PublishingChannel, LinkSender),
    (PublishingChannel, _AtLeastOnce),
]


def _members(proto: type) -> set[str]:
    names = set(inspect.get_annotations(proto))
    names |= {n for n in proto.__dict__ if not n.startswith("_")}
    return names


def _set_in_init(cls: type) -> set[str]:
    """The attributes `self.x = ...` (or `self.x: T = ...`) in __init__ along the MRO."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or not inspect.isfunction(init):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
        for node in ast.walk(tree):
            targets: list[Any] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for t in targets:
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if (isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name)
                            and el.value.id == "self"):
                        names.add(el.attr)
    return names


@pytest.mark.parametrize(("proto", "cls"), IMPLEMENTATIONS,
                         ids=[f"{c.__name__}-{p.__name__}" for p, c in IMPLEMENTATIONS])
def test_every_member_is_there(proto: type, cls: type) -> None:
    have = {n for n in _members(proto) if hasattr(cls, n)} | _set_in_init(cls)
    missing = sorted(_members(proto) - have)
    assert not missing, f"{cls.__name__} lacks {missing} of {proto.__name__}"


@pytest.mark.parametrize(("proto", "cls"), IMPLEMENTATIONS,
                         ids=[f"{c.__name__}-{p.__name__}" for p, c in IMPLEMENTATIONS])
def test_methods_have_one_shape(proto: type, cls: type) -> None:
    """A coroutine in the contract is one on every implementation, and a plain method
    stays plain (the hot path pays for no awaitable)."""
    for name, member in proto.__dict__.items():
        if name.startswith("_") or not inspect.isfunction(member):
            continue
        impl = getattr(cls, name)
        assert callable(impl), f"{cls.__name__}.{name} is not a method"
        assert (inspect.iscoroutinefunction(impl)
                == inspect.iscoroutinefunction(member)), f"{cls.__name__}.{name}"
        owner = next(k for k in cls.__mro__ if name in k.__dict__)  # QuorumQueue inherits
        if owner.__module__ in compiled.loaded() and not inspect.signature(impl).parameters:
            continue  # a coroutine compiled by mypyc shows no signature: test-workers' run
        assert _params(impl) == _params(member), f"{cls.__name__}.{name}: parameters"


def _params(fn: Any) -> list[tuple[str, Any, bool]]:
    """Each parameter's name, kind and whether it has a default: a caller's keyword or
    positional argument lands on every implementation alike. `self` is left out: no caller
    names it, and mypyc's methods make it positional-only."""
    return [(p.name, p.kind, p.default is not p.empty)
            for p in inspect.signature(fn).parameters.values()][1:]


def test_the_contract_names_the_rare_operations_as_coroutines() -> None:
    rare = {n for n, m in QueueType.__dict__.items() if inspect.iscoroutinefunction(m)}
    assert rare == {"get", "purge", "counts", "admit_consumer"}
