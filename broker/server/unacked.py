"""A channel's unacked ledger: delivery tag -> what to settle, in delivery order.

Plain logic, no I/O: the channel files a record per delivery that wants an ack (a plain dict
store on the hot path) and takes records out for basic.ack, nack and reject, single or
multiple, the way RabbitMQ's rabbit_channel:collect_acks does. What a record is (queue,
position, consumer) is the channel's business."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

from broker.protocol.constants import PRECONDITION_FAILED
from broker.protocol.errors import ChannelError

__all__ = ["Unacked"]

R = TypeVar("R")


class Unacked(OrderedDict[int, R]):
    """Tags are filed in increasing order, so `multiple` takes a prefix."""

    def take(self, tag: int, multiple: bool) -> list[R]:
        """The records `tag` settles (406 if it names none). Multiple with tag 0 takes all
        outstanding, none if nothing is (RabbitMQ answers nothing then)."""
        if not multiple:
            record = self.pop(tag, None)
            if record is None:
                raise _unknown(tag)
            return [record]
        if tag == 0:
            return self.take_all()
        if tag not in self:  # the tag itself must be known, not just below one that is
            raise _unknown(tag)
        out: list[R] = []
        popitem = self.popitem
        append = out.append
        while True:
            first, record = popitem(last=False)
            append(record)
            if first == tag:
                return out

    def take_all(self) -> list[R]:
        out = list(self.values())
        self.clear()
        return out

    def check(self, tag: int, multiple: bool) -> None:
        """Raise what `take` would, taking nothing (a transaction settles at commit)."""
        if (tag or not multiple) and tag not in self:
            raise _unknown(tag)


def _unknown(tag: int) -> ChannelError:
    return ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
