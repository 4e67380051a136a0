"""hare-ctl's list_* verbs: one table per API collection, its columns rabbitmqctl's info
items (a verb may name its own columns)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from broker.ctl.client import EX_USAGE, Client, CtlError, Verb, table
from broker.ctl.client import quote_name as _q

__all__ = ["LISTS", "add_verbs"]


# -- list_* columns (rabbitmqctl's info items -> API fields) -------------------------------------
def _queue_row(q: dict[str, Any]) -> dict[str, Any]:
    stats = q.get("message_stats") or {}
    return {**q, "messages_unacknowledged": q.get("messages_unacknowledged"),
            "message_bytes": q.get("message_bytes_ready"),
            "publish": stats.get("publish"), "deliver_get": stats.get("deliver_get"),
            "ack": stats.get("ack")}


def _binding_row(b: dict[str, Any]) -> dict[str, Any]:
    return {**b, "source_name": b["source"], "source_kind": "exchange",
            "destination_name": b["destination"], "destination_kind": b["destination_type"]}


def _consumer_row(c: dict[str, Any]) -> dict[str, Any]:
    return {**c, "queue_name": c["queue"]["name"],
            "channel_pid": c["channel_details"]["name"]}


def _connection_row(c: dict[str, Any]) -> dict[str, Any]:
    return {**c, "client": " ".join(str(c.get("client_properties", {}).get(k, ""))
                                    for k in ("product", "version")).strip()}


_POLICY_COLUMNS = ("vhost", "name", "pattern", "apply-to", "definition", "priority")

LISTS: dict[str, tuple[Callable[[argparse.Namespace], str], tuple[str, ...],
                       Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "list_queues": (lambda a: f"/api/queues/{_q(a.vhost)}", ("name", "messages"), _queue_row),
    "list_exchanges": (lambda a: f"/api/exchanges/{_q(a.vhost)}", ("name", "type"), dict),
    "list_bindings": (lambda a: f"/api/bindings/{_q(a.vhost)}",
                      ("source_name", "source_kind", "destination_name", "destination_kind",
                       "routing_key", "arguments"), _binding_row),
    "list_connections": (lambda a: "/api/connections",
                         ("user", "peer_host", "peer_port", "state"), _connection_row),
    "list_consumers": (lambda a: f"/api/consumers/{_q(a.vhost)}",
                       ("queue_name", "channel_pid", "consumer_tag", "ack_required",
                        "prefetch_count", "active", "arguments"), _consumer_row),
    "list_channels": (lambda a: "/api/channels",
                      ("name", "user", "consumer_count", "messages_unacknowledged"), dict),
    "list_users": (lambda a: "/api/users", ("name", "tags"), dict),
    "list_vhosts": (lambda a: "/api/vhosts", ("name",), dict),
    "list_permissions": (lambda a: f"/api/vhosts/{_q(a.vhost)}/permissions",
                         ("user", "configure", "write", "read"), dict),
    "list_policies": (lambda a: f"/api/policies/{_q(a.vhost)}", _POLICY_COLUMNS, dict),
    "list_operator_policies": (lambda a: f"/api/operator-policies/{_q(a.vhost)}",
                               _POLICY_COLUMNS, dict),
    "list_topic_permissions": (lambda a: f"/api/vhosts/{_q(a.vhost)}/topic-permissions",
                               ("user", "exchange", "write", "read"), dict),
    "list_user_limits": (lambda a: "/api/user-limits", ("user", "value"), dict),
}


# the list verbs whose API path names a vhost take -p, as rabbitmqctl's
_PER_VHOST = ("list_queues", "list_exchanges", "list_bindings", "list_consumers",
              "list_permissions", "list_policies", "list_operator_policies",
              "list_topic_permissions")


def _list(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    path, default_columns, shape = LISTS[args.verb]
    rows = [shape(r) for r in client.get(path(args))]
    columns = tuple(args.columns) or default_columns
    # a column some rows lack is empty in those (a quorum queue's leader on a classic queue)
    unknown = [c for c in columns if rows and all(c not in r for r in rows)]
    if unknown:
        raise CtlError(f"unknown column(s) for {args.verb}: {', '.join(unknown)}", EX_USAGE)
    data = [{c: r.get(c) for c in columns} for r in rows]
    return data, table(data, columns)


def add_verbs(verb: Verb) -> None:
    """Register the list verbs with hare-ctl's parser (`verb` is broker.ctl's registrar)."""
    for name, (_, cols, _) in LISTS.items():
        sp = verb(name, _list, f"list {name[5:]} (default columns: {' '.join(cols)})",
                  vhost=name in _PER_VHOST)
        sp.add_argument("columns", nargs="*", help="columns to show, as rabbitmqctl's items")
