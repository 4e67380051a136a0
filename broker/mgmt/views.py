"""The JSON shape of each broker object, with RabbitMQ's management field names, so tools
written against RabbitMQ's HTTP API read Hare's unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from broker import __version__
from broker.access import rfc4514
from broker.flow.memory_monitor import process_memory
from broker.mgmt.stats import QUEUE_COUNTERS, Stats, details
from broker.queue.amqqueue import AMQQueue
from broker.routing.delayed import DelayedMessageExchange
from broker.routing.exchange import Binding, Exchange

if TYPE_CHECKING:
    from broker.node import Node
    from broker.policy import Policy
    from broker.queue.consumer import Consumer
    from broker.server.channel import Channel
    from broker.server.reader import Reader
    from broker.vhost import VHost

__all__ = [
    "binding_json",
    "bindings_of",
    "channel_json",
    "connection_json",
    "consumer_json",
    "exchange_json",
    "node_json",
    "properties_key",
    "queue_json",
]

_STARTED = time.time()

# What a message costs besides its body (entry tuple, Message object, properties): an
# estimate for the `memory` field, as Python cannot cheaply measure one queue's share.
_PER_MESSAGE_BYTES = 200
_PER_QUEUE_BYTES = 2048
# what a stream adds (RabbitMQ's committed_offset and segments; the first and last offset and
# the bytes of its segment files are Hare's)
_STREAM_FIELDS = ("first_offset", "last_offset", "committed_offset", "segments",
                  "stream_bytes")


def queue_json(q: AMQQueue, stats: Stats, node_name: str) -> dict[str, Any]:
    info = q.info()
    message_stats: dict[str, Any] = {}
    for key, attr in QUEUE_COUNTERS.items():
        message_stats[key] = int(getattr(q, attr, 0) or 0)
        message_stats[f"{key}_details"] = details(stats.rate(q, key))
    messages = int(info.get("messages", 0))
    body_bytes = int(info.get("message_bytes_ready", 0))
    owner = q.exclusive_owner
    sac = q.active_consumer if isinstance(q, AMQQueue) else None  # one homed here
    return {
        "name": q.name,
        "vhost": q.vhost.name,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": owner is not None,
        "owner_pid_details": {"name": getattr(owner, "name", "")} if owner is not None else None,
        "arguments": q.arguments,
        "node": q.home or node_name,
        "type": q.args.kind,
        "state": info.get("state", "running"),
        "messages": messages,
        "messages_details": details(stats.rate(q, "messages")),
        "messages_ready": int(info.get("messages_ready", 0)),
        "messages_ready_details": details(stats.rate(q, "messages_ready")),
        "messages_unacknowledged": int(info.get("messages_unacknowledged", 0)),
        "messages_unacknowledged_details": details(stats.rate(q, "messages_unacknowledged")),
        "message_bytes_ready": body_bytes,
        "consumers": int(info.get("consumers", 0)),
        "exclusive_consumer_tag": next((c.tag for c in q.consumers if c.exclusive), None),
        "single_active_consumer_tag": sac.tag if sac is not None else None,
        "memory": _PER_QUEUE_BYTES + body_bytes + messages * _PER_MESSAGE_BYTES,
        "message_stats": message_stats,
        "policy": _name(q.args.applied.policy),
        "operator_policy": _name(q.args.applied.operator_policy),
        "effective_policy_definition": dict(q.args.applied.effective),
        **_paging(q),
        # a replicated queue's members (RabbitMQ's quorum queue fields)
        **{key: info[key] for key in _QUORUM_FIELDS if key in info},
        **{key: info[key] for key in _STREAM_FIELDS if key in info},
    }


# a quorum queue's: RabbitMQ's leader, members, online; Hare's epoch and log positions (the
# leader's view of each member), and on a follower its own member's state
_QUORUM_FIELDS = ("leader", "members", "online", "epoch", "commit_position", "positions",
                  "log_bytes_shipped", "member", "messages_uncommitted", "messages_dlx")


def _name(policy: Policy | None) -> str | None:
    return policy.name if policy is not None else None


def _paging(q: AMQQueue) -> dict[str, Any]:
    """Where the ready messages are (RAM or paged out), and the part of RabbitMQ's
    backing_queue_status that says so."""
    bq = q.bq if isinstance(q, AMQQueue) else None  # one homed here
    if bq is None:
        return {}
    ready, ram, target = len(bq), bq.ram_msg_count, bq.target_ram_count
    return {
        "messages_ram": ram,
        "messages_paged_out": ready - ram,
        "backing_queue_status": {
            "mode": q.args.queue_mode, "len": ready,
            "target_ram_count": "infinity" if target is None else target,
        },
    }


def exchange_json(ex: Exchange, vhost: VHost) -> dict[str, Any]:
    return {
        "name": ex.name,
        "vhost": vhost.name,
        "type": ex.type,
        "durable": ex.durable,
        "auto_delete": ex.auto_delete,
        "internal": ex.internal,
        "arguments": ex.arguments,
        "user_who_performed_action": "rmq-internal",
        # as RabbitMQ, only when one applies
        **({"policy": ex.policy.name} if ex.policy is not None else {}),
        # as the plugin's: what a delayed-message exchange holds until due
        **({"messages_delayed": sum(
               q.message_count for q in ex.held.values())}  # type: ignore[attr-defined]
           if isinstance(ex, DelayedMessageExchange) else {}),
    }


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """RabbitMQ's way to name one binding in a URL: the key, plus a hash of the arguments."""
    key = quote(routing_key, safe="") if routing_key else "~"
    if arguments:
        digest = hashlib.sha1(json.dumps(arguments, sort_keys=True, default=str).encode())
        key = f"{quote(routing_key, safe='')}~{digest.hexdigest()[:12]}"
    return key


def _destination(dest: object) -> tuple[str, str]:
    if isinstance(dest, Exchange):
        return dest.name, "exchange"
    return str(getattr(dest, "name", dest)), "queue"


def binding_json(vhost: VHost, b: Binding) -> dict[str, Any]:
    name, kind = _destination(b.destination)
    args = b.arguments_dict()
    return {
        "source": b.source,
        "vhost": vhost.name,
        "destination": name,
        "destination_type": kind,
        "routing_key": b.routing_key,
        "arguments": args,
        "properties_key": properties_key(b.routing_key, args),
    }


def bindings_of(vhost: VHost, *, implicit: bool = True) -> list[dict[str, Any]]:
    """Every binding in the vhost; `implicit` adds each queue's default-exchange binding, which
    RabbitMQ lists too (but never exports)."""
    out: list[dict[str, Any]] = []
    if implicit:
        for q in list(vhost.queues.values()):
            out.append({
                "source": "", "vhost": vhost.name, "destination": q.name,
                "destination_type": "queue", "routing_key": q.name, "arguments": {},
                "properties_key": properties_key(q.name, {}),
            })
    for ex in list(vhost.exchanges.values()):
        if ex.name == "":
            continue
        out.extend(binding_json(vhost, b) for b in ex.bindings())
    return out


def _connected_at(conn: Reader) -> int:
    """Reader.opened_at is loop time; the API speaks milliseconds since the epoch."""
    ago = conn.loop.time() - conn.opened_at if conn.opened_at else 0.0
    return int((time.time() - ago) * 1000)


def connection_json(conn: Reader, node: Node) -> dict[str, Any]:
    info = conn.info()
    local = ("", 0)
    if conn.transport is not None:
        sock = conn.transport.get_extra_info("sockname")
        if sock:
            local = (sock[0], sock[1])
    return {
        "name": conn.name,
        "node": node.name,
        "type": "network",
        "protocol": "AMQP 0-9-1",
        "vhost": info["vhost"],
        "user": info["user"],
        "host": local[0],
        "port": local[1],
        "peer_host": info["peer_host"],
        "peer_port": info["peer_port"],
        "channels": info["channels"],
        "state": info["state"],
        "flow_pauses": info["flow_pauses"],  # Hare: times credit flow paused the socket
        # Hare: body bytes of this connection's incomplete messages, and times the content
        # budget paused the socket for them
        "content_held": info["content_held"],
        "content_budget_pauses": info["content_budget_pauses"],
        "frame_max": info["frame_max"],
        "channel_max": info["channel_max"],
        "timeout": info["heartbeat"],
        "client_properties": info["client_properties"],
        "recv_oct": info["recv_oct"],
        "send_oct": info["send_oct"],
        "connected_at": _connected_at(conn),
        **_tls_json(conn),
    }


def _tls_json(conn: Reader) -> dict[str, Any]:
    """RabbitMQ's TLS fields of a connection (null on plain AMQP); the cipher is OpenSSL's
    name for it."""
    tls = conn.tls
    if tls is None:
        return {"ssl": False, "ssl_protocol": None, "ssl_cipher": None,
                "peer_cert_subject": None, "peer_cert_issuer": None,
                "peer_cert_validity": None}
    cert = tls.getpeercert() or {}
    cipher = tls.cipher()
    validity = (f"{cert['notBefore']} - {cert['notAfter']}"
                if "notBefore" in cert and "notAfter" in cert else None)
    return {
        "ssl": True,
        "ssl_protocol": (tls.version() or "").lower() or None,
        "ssl_cipher": cipher[0] if cipher else None,
        "peer_cert_subject": rfc4514(cert["subject"]) if "subject" in cert else None,
        "peer_cert_issuer": rfc4514(cert["issuer"]) if "issuer" in cert else None,
        "peer_cert_validity": validity,
    }


def _channel_name(ch: Channel) -> str:
    return f"{ch.reader.name} ({ch.number})"


def channel_json(ch: Channel, node: Node) -> dict[str, Any]:
    info = ch.info()
    conn = ch.reader
    return {
        "name": _channel_name(ch),
        "number": ch.number,
        "node": node.name,
        "user": info["user"],
        "vhost": info["vhost"],
        "connection_details": {
            "name": conn.name, "peer_host": conn.peer[0], "peer_port": conn.peer[1],
        },
        "confirm": info["confirm"],
        "transactional": info["transactional"],
        "consumer_count": info["consumer_count"],
        "messages_unacknowledged": info["messages_unacknowledged"],
        "messages_unconfirmed": info["messages_unconfirmed"],
        "messages_uncommitted": 0,
        "acks_uncommitted": 0,
        "prefetch_count": info["prefetch_count"],
        "global_prefetch_count": info["global_prefetch_count"],
        "state": "flow" if conn.blocked_by_credit else "running",
        "message_stats": {"publish": int(getattr(ch, "published", 0))},
    }


def consumer_json(c: Consumer, node_name: str) -> dict[str, Any]:
    ch = c.channel
    active, status = c.queue.consumer_activity(c)
    return {
        "consumer_tag": c.tag,
        "queue": {"name": c.queue.name, "vhost": c.queue.vhost.name},
        "channel_details": {
            "name": _channel_name(ch),
            "number": ch.number,
            "connection_name": ch.reader.name,
            "peer_host": ch.reader.peer[0],
            "peer_port": ch.reader.peer[1],
            "user": ch.user,
            "node": node_name,
        },
        "ack_required": not c.no_ack,
        "exclusive": c.exclusive,
        "prefetch_count": c.prefetch,
        "arguments": c.arguments,
        "active": active,
        "activity_status": status,
    }


def product() -> dict[str, str]:
    return {"product_name": "Hare", "product_version": __version__}


def node_json(node: Node) -> dict[str, Any]:
    alarms = node.alarms_active()
    monitor = getattr(node, "memory_monitor", None)
    out: dict[str, Any] = {
        "name": node.name,
        "server": node.server,  # Hare's: the hare-server (workers of one share it)
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "mem_used": process_memory(),
        "mem_alarm": "memory" in alarms,
        "disk_free_alarm": "disk" in alarms,
        "uptime": int((time.time() - _STARTED) * 1000),
        "processors": os.cpu_count() or 1,
        "partitions": [],
        "applications": [{"name": "hare", "description": "Hare broker", "version": __version__}],
    }
    handover = getattr(node, "handover", None)
    if handover is not None:  # a worker's connection placement (docs/ARCHITECTURE.md)
        out["connections_moved_in"] = handover.moved_in
        out["connections_moved_out"] = handover.moved_out
        out["connections_stayed"] = handover.stayed
    if monitor is not None and hasattr(monitor, "limit"):
        out["mem_limit"] = int(monitor.limit)
    disk = getattr(node, "disk_monitor", None)
    if disk is not None and hasattr(disk, "limit"):
        # the monitor's last sample: a statvfs here would block the loop on a hung file system
        if disk.free >= 0:
            out["disk_free"] = disk.free
        out["disk_free_limit"] = int(disk.limit)
    return out
