"""The exchange.* and queue.* methods of a channel (declare, delete, bind, unbind): metadata
changes, each a coroutine the channel's task awaits in mailbox order, since in a cluster the
change waits for the metadata store (docs/CLUSTER.md). Called from Channel's dispatch table;
they use the channel's permission checks, its last-declared queue and its `send`."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from broker.protocol.constants import NOT_FOUND
from broker.protocol.errors import ChannelError
from broker.server.direct_reply import REPLY_PREFIX, REPLY_QUEUE

if TYPE_CHECKING:
    from broker.server.channel import Channel

__all__ = [
    "exchange_bind",
    "exchange_declare",
    "exchange_delete",
    "exchange_unbind",
    "queue_bind",
    "queue_declare",
    "queue_delete",
    "queue_unbind",
]


# -- exchanges -----------------------------------------------------------------------------------
async def exchange_declare(ch: Channel, m: commands.Exchange.Declare) -> None:
    if not m.passive:
        ch.auth.check_declare(ch.principal, ch.vhost.name, "exchange", m.exchange,
                              m.arguments, new=m.exchange not in ch.vhost.exchanges)
        if m.exchange not in ch.vhost.exchanges:
            await ch.cluster.check_exchange_declare(
                ch.vhost, m.exchange, m.exchange_type, durable=m.durable,
                auto_delete=m.auto_delete, internal=m.internal,
                arguments=m.arguments or {})
    ch.vhost.declare_exchange(
        m.exchange,
        m.exchange_type,
        passive=m.passive,
        durable=m.durable,
        auto_delete=m.auto_delete,
        internal=m.internal,
        arguments=m.arguments or {},
    )
    await ch.cluster.commit()
    if not m.nowait:
        ch.send(commands.Exchange.DeclareOk())


async def exchange_delete(ch: Channel, m: commands.Exchange.Delete) -> None:
    ch.check("configure", "exchange", m.exchange)
    await ch.cluster.check_writable()
    ch.vhost.delete_exchange(m.exchange, m.if_unused)
    ch.exchange_deleted(m.exchange)
    await ch.cluster.commit()
    if not m.nowait:
        ch.send(commands.Exchange.DeleteOk())


async def exchange_bind(ch: Channel, m: commands.Exchange.Bind) -> None:
    await _exchange_binding(ch, m, ch.vhost.bind_exchange, commands.Exchange.BindOk())


async def exchange_unbind(ch: Channel, m: commands.Exchange.Unbind) -> None:
    await _exchange_binding(ch, m, ch.vhost.unbind_exchange, commands.Exchange.UnbindOk())


async def _exchange_binding(
    ch: Channel,
    m: commands.Exchange.Bind | commands.Exchange.Unbind,
    change: Callable[[str, str, str, dict[str, Any]], object],
    reply: commands.Exchange.BindOk | commands.Exchange.UnbindOk,
) -> None:
    """exchange.bind and exchange.unbind: the same checks, then `change` on the vhost."""
    ch.check("write", "exchange", m.destination)
    ch.check("read", "exchange", m.source)
    ch.check_topic(m.source, m.routing_key, "read")
    await ch.cluster.check_writable()
    change(m.destination, m.source, m.routing_key, m.arguments or {})
    await ch.cluster.commit()
    if not m.nowait:
        ch.send(reply)


# -- queues --------------------------------------------------------------------------------------
async def queue_declare(ch: Channel, m: commands.Queue.Declare) -> None:
    name = m.queue
    if name == REPLY_QUEUE or name.startswith(REPLY_PREFIX):
        await _declare_reply_queue(ch, m)
        return
    server_named = getattr(m, "server_named", False) or (not m.passive and not name)
    if server_named and not name:
        # kept on the method: a check that waits for an auth backend runs it again
        name = m.queue = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode(
        ).rstrip("=")
        setattr(m, "server_named", True)  # noqa: B010 (an attribute of ours on pamqp's method)
    if not m.passive:  # RabbitMQ checks a server-named queue's generated name too
        ch.auth.check_declare(ch.principal, ch.vhost.name, "queue", name,
                              m.arguments, new=name not in ch.vhost.queues)
        if name not in ch.vhost.queues:
            await ch.cluster.check_queue_declare(
                ch.vhost, name, durable=m.durable, exclusive=m.exclusive,
                auto_delete=m.auto_delete, arguments=m.arguments or {},
                server_named=server_named)
    q = ch.vhost.declare_queue(
        name,
        server_named=server_named,
        passive=m.passive,
        durable=m.durable,
        exclusive=m.exclusive,
        auto_delete=m.auto_delete,
        arguments=m.arguments or {},
        owner=ch.reader,
    )
    await ch.cluster.commit()
    ch.last_queue = q.name
    if not m.nowait:
        messages, consumers = await q.counts()  # the home node's, in a cluster
        ch.send(
            commands.Queue.DeclareOk(
                queue=q.name, message_count=messages, consumer_count=consumers
            )
        )


async def _declare_reply_queue(ch: Channel, m: commands.Queue.Declare) -> None:
    """The pseudo-queue always "exists" with one consumer; a reply name exists while its
    consumer does, on this node or another (RabbitMQ answers both, passive or not)."""
    name = m.queue
    if (name != REPLY_QUEUE and ch.reader.node.reply_registry.lookup(name) is None
            and not await ch.cluster.reply_alive(name)):
        raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{ch.vhost.name}'")
    if not m.nowait:
        ch.send(commands.Queue.DeclareOk(queue=name, message_count=0, consumer_count=1))


async def queue_bind(ch: Channel, m: commands.Queue.Bind) -> None:
    _check_queue_binding(ch, m)
    q = ch.vhost.queue(m.queue, ch.reader)
    await ch.cluster.check_writable()
    ch.vhost.bind_queue(q, m.exchange, m.routing_key, m.arguments or {})
    await ch.cluster.commit()
    if not m.nowait:
        ch.send(commands.Queue.BindOk())


async def queue_unbind(ch: Channel, m: commands.Queue.Unbind) -> None:
    _check_queue_binding(ch, m)
    # unbinding from a missing queue succeeds; queue.unbind has no nowait
    q = ch.vhost.queue(m.queue, ch.reader) if m.queue in ch.vhost.queues else None
    await ch.cluster.check_writable()
    ch.vhost.unbind_queue(q, m.exchange, m.routing_key, m.arguments or {})
    await ch.cluster.commit()
    ch.send(commands.Queue.UnbindOk())


def _check_queue_binding(ch: Channel, m: commands.Queue.Bind | commands.Queue.Unbind) -> None:
    """Resolve the queue name (empty: the channel's last-declared queue, and its name as the
    key if none is given), then the permission checks both queue.bind and unbind make."""
    if not m.queue and not m.routing_key:
        m.routing_key = ch.queue_name("")
    m.queue = ch.queue_name(m.queue)
    ch.check("write", "queue", m.queue)
    ch.check("read", "exchange", m.exchange)
    ch.check_topic(m.exchange, m.routing_key, "read")


async def queue_delete(ch: Channel, m: commands.Queue.Delete) -> None:
    m.queue = ch.queue_name(m.queue)
    ch.check("configure", "queue", m.queue)
    q = ch.vhost.queues.get(m.queue)
    if q is None:
        count = 0  # RabbitMQ: deleting a missing queue succeeds
    else:
        ch.vhost.queue(m.queue, ch.reader)
        home = await ch.vhost.check_queue_delete(q, if_unused=m.if_unused, if_empty=m.if_empty)
        await ch.cluster.check_writable()
        # a queue homed on another node (worker) counts no messages here: its home's count
        count = ch.vhost.delete_queue(q, if_unused=m.if_unused, if_empty=m.if_empty) or home
        await ch.cluster.commit()
    if not m.nowait:
        ch.send(commands.Queue.DeleteOk(message_count=count))

