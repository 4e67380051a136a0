"""Credit flow between actors, after RabbitMQ's credit_flow module.

Each actor (reader, channel, queue, store) owns one `CreditFlow`; what Erlang keeps in the
process dictionary is instance state here:

  credit_from[peer]  how many more messages we may send to `peer` before we are blocked
  credit_to[peer]    how many more messages from `peer` we handle before granting it credit
  blocked            the peers that have blocked us (credit_from hit 0)
  deferred grants    credit we owe upstream but hold back while we are blocked ourselves

Holding grants back while blocked is what makes the mechanism transitive: when the last actor
of a chain stops acking, every actor upstream runs out of credit in turn, and the first one
(the reader) stops reading its socket.

Bump delivery: to grant credit we call `peer.credit_flow.deliver_bump(self.owner, amount)`.
By default that is the peer's own `handle_bump` (a plain call, for actors that share a loop
and need no ordering with their mailbox); an actor with a mailbox passes `deliver_bump=` a
callable that enqueues the bump, and calls `handle_bump` itself when it takes it out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from mypy_extensions import mypyc_attr

__all__ = ["DEFAULT_CREDIT", "BumpSink", "CreditFlow", "CreditPeer"]

# {InitialCredit, MoreCreditAfter} as in current RabbitMQ (credit_flow_default_credit).
DEFAULT_CREDIT: tuple[int, int] = (400, 200)

BumpSink = Callable[[Any, int], None]
"""deliver_bump(sender_of_credit, amount): how a bump reaches an actor."""


class CreditPeer(Protocol):
    """Anything that takes part in credit flow: it owns a CreditFlow whose `owner` is itself."""

    @property
    def credit_flow(self) -> CreditFlow: ...


# compiled by mypyc (broker/compiled.py); the cluster's RemoteQueue subclasses it
@mypyc_attr(allow_interpreted_subclasses=True)
class CreditFlow:
    """One actor's view of credit flow. Peers are any hashable objects with `credit_flow`."""

    __slots__ = (
        "_blocked",
        "_bump_sink",
        "_credit_from",
        "_credit_to",
        "_deferred",
        "initial_credit",
        "more_credit_after",
        "on_blocked",
        "on_unblocked",
        "owner",
    )

    def __init__(
        self,
        owner: object,
        initial_credit: int = DEFAULT_CREDIT[0],
        more_credit_after: int = DEFAULT_CREDIT[1],
        deliver_bump: BumpSink | None = None,
    ) -> None:
        if initial_credit < 1 or more_credit_after < 1:
            raise ValueError("credit values must be positive")
        self.owner = owner
        self.initial_credit = initial_credit
        self.more_credit_after = more_credit_after
        self._bump_sink = deliver_bump  # None: handle_bump (no bound method kept a flow)
        self.on_blocked: Callable[[], None] | None = None
        self.on_unblocked: Callable[[], None] | None = None
        self._credit_from: dict[CreditPeer, int] = {}
        self._credit_to: dict[CreditPeer, int] = {}
        # a dict as a set: empty, 64 bytes against a set's 216, and there is a flow for every
        # channel, queue and reader, two for each consumer of another worker's queue
        self._blocked: dict[CreditPeer, None] = {}
        self._deferred: dict[CreditPeer, int] = {}

    # -- sending side -----------------------------------------------------------------------
    def send(self, to: CreditPeer) -> None:
        """Spend one credit before sending a message to `to`. At zero we are blocked by `to`
        (sending on is allowed, as in RabbitMQ; the credit goes negative)."""
        c = self._credit_from.get(to, self.initial_credit)
        if c == 1:
            self._credit_from[to] = 0
            self._block(to)
        else:
            self._credit_from[to] = c - 1

    def send_many(self, to: CreditPeer, n: int) -> None:
        """`send(to)` n times (a batch handed over in one call)."""
        if n <= 0:
            return
        c = self._credit_from.get(to, self.initial_credit)
        self._credit_from[to] = c - n
        if c > 0 >= c - n:  # at c <= 0 we are blocked by `to` already
            self._block(to)

    def handle_bump(self, sender_of_credit: CreditPeer, amount: int) -> None:
        """`sender_of_credit` granted us `amount` more messages."""
        c = self._credit_from.get(sender_of_credit, 0)
        self._credit_from[sender_of_credit] = c + amount
        if c <= 0 < c + amount:
            self._unblock(sender_of_credit)

    def deliver_bump(self, sender_of_credit: Any, amount: int) -> None:
        """How a grant reaches us: `deliver_bump=` if given, else `handle_bump` at once."""
        sink = self._bump_sink
        if sink is None:
            self.handle_bump(sender_of_credit, amount)
        else:
            sink(sender_of_credit, amount)

    def blocked(self) -> bool:
        return bool(self._blocked)

    def blocked_by(self) -> frozenset[CreditPeer]:
        return frozenset(self._blocked)

    def credit_left(self, to: CreditPeer) -> int:
        """Messages we may still send to `to` (for metrics and tests)."""
        return self._credit_from.get(to, self.initial_credit)

    # -- receiving side ---------------------------------------------------------------------
    def ack(self, sender: CreditPeer) -> None:
        """We handled one message from `sender`: every more_credit_after of them earns it
        more_credit_after credit."""
        c = self._credit_to.get(sender, self.more_credit_after)
        if c == 1:
            self._credit_to[sender] = self.more_credit_after
            self._grant(sender, self.more_credit_after)
        else:
            self._credit_to[sender] = c - 1

    def ack_many(self, sender: CreditPeer, n: int) -> None:
        """`ack(sender)` n times, with at most one bump (of the summed amount)."""
        if n <= 0:
            return
        c = self._credit_to.get(sender, self.more_credit_after)
        if n < c:
            self._credit_to[sender] = c - n
            return
        after = n - c  # acks left over once the first grant is earned
        grants = 1 + after // self.more_credit_after
        self._credit_to[sender] = self.more_credit_after - after % self.more_credit_after
        self._grant(sender, grants * self.more_credit_after)

    # -- peers coming and going -------------------------------------------------------------
    def peer_down(self, peer: CreditPeer) -> None:
        """Forget `peer` so that it can never keep us blocked, and owe it nothing."""
        self._deferred.pop(peer, None)
        self._credit_from.pop(peer, None)
        self._credit_to.pop(peer, None)
        self._unblock(peer)

    # -- internals --------------------------------------------------------------------------
    def _grant(self, to: CreditPeer, amount: int) -> None:
        if self._blocked:
            self._deferred[to] = self._deferred.get(to, 0) + amount
        else:
            to.credit_flow.deliver_bump(self.owner, amount)

    def _block(self, peer: CreditPeer) -> None:
        was_blocked = bool(self._blocked)
        self._blocked[peer] = None
        if not was_blocked and self.on_blocked is not None:
            self.on_blocked()

    def _unblock(self, peer: CreditPeer) -> None:
        if peer not in self._blocked:
            return
        del self._blocked[peer]
        if self._blocked:
            return
        deferred, self._deferred = self._deferred, {}
        for to, amount in deferred.items():
            to.credit_flow.deliver_bump(self.owner, amount)
        if self.on_unblocked is not None:
            self.on_unblocked()
