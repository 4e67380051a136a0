"""Message builders shared by the routing tests."""

from __future__ import annotations

from typing import Any

from pamqp import commands

from broker.message import Message


def msg(
    routing_key: str = "", headers: dict[str, Any] | None = None, exchange: str = "x"
) -> Message:
    props = commands.Basic.Properties(headers=headers) if headers is not None else None
    raw = props.marshal() if props is not None else commands.Basic.Properties().marshal()
    return Message(exchange, routing_key, raw, b"body")


class Q:
    """A stand-in queue: hashable by identity, readable in assertion output."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Q({self.name})"
