"""hare-ctl's policy and limit verbs, as rabbitmqctl's:

    hare-ctl set_policy [-p VHOST] [--priority N] [--apply-to queues|exchanges|all]
                        NAME PATTERN DEFINITION
    hare-ctl clear_policy [-p VHOST] NAME
    hare-ctl set_operator_policy / clear_operator_policy   (same arguments)
    hare-ctl set_vhost_limits [-p VHOST] '{"max-connections": 10, "max-queues": 100}'
    hare-ctl clear_vhost_limits [-p VHOST]
    hare-ctl list_vhost_limits [-p VHOST] [--global]

(list_policies and list_operator_policies are list verbs in broker.ctl.lists.) The broker
validates; errors come back as one line with RabbitMQ's reason."""

from __future__ import annotations

import argparse
import json
from typing import Any

from broker.ctl.client import EX_DATAERR, Client, CtlError, Verb, done, json_arg, quote_name

__all__ = ["add_verbs"]


def _base(a: argparse.Namespace) -> str:
    return "/api/operator-policies" if "operator" in a.verb else "/api/policies"


def _set_policy(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    definition = json_arg(a.definition, "definition")
    body = {"pattern": a.pattern, "definition": definition, "priority": a.priority,
            "apply-to": a.apply_to}
    client.call("PUT", f"{_base(a)}/{quote_name(a.vhost)}/{quote_name(a.name)}", body)
    kind = "operator policy override" if "operator" in a.verb else "policy"
    return done(f'Setting {kind} "{a.name}" for pattern "{a.pattern}" to "{a.definition}" '
                f'with priority "{a.priority}" for vhost "{a.vhost}" ...')


def _clear_policy(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    kind = "operator policy" if "operator" in a.verb else "policy"
    client.call("DELETE", f"{_base(a)}/{quote_name(a.vhost)}/{quote_name(a.name)}",
                what=f"{kind} '{a.name}' in vhost '{a.vhost}'")
    return done(f'Clearing {kind} "{a.name}" on vhost "{a.vhost}" ...')


def _limits_path(vhost: str) -> str:
    return f"/api/vhost-limits/{quote_name(vhost)}"


def _current_limits(client: Client, vhost: str) -> dict[str, Any]:
    rows = client.get(_limits_path(vhost), what=f"vhost '{vhost}'")
    return dict(rows[0]["value"]) if rows else {}


def _set_vhost_limits(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    """The given object replaces every limit of the vhost, as rabbitmqctl's."""
    limits = json_arg(a.limits, "limits")
    if not isinstance(limits, dict):
        raise CtlError("limits must be a JSON object", EX_DATAERR)
    old = _current_limits(client, a.vhost)
    for name, value in limits.items():  # the broker validates each
        client.call("PUT", f"{_limits_path(a.vhost)}/{quote_name(name)}", {"value": value})
    for name in old.keys() - limits.keys():
        client.call("DELETE", f"{_limits_path(a.vhost)}/{quote_name(name)}")
    return done(f'Setting vhost limits to "{a.limits}" for vhost "{a.vhost}" ...')


def _clear_vhost_limits(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    for name in _current_limits(client, a.vhost):
        client.call("DELETE", f"{_limits_path(a.vhost)}/{quote_name(name)}")
    return done(f'Clearing vhost "{a.vhost}" limits ...')


def _list_vhost_limits(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    if a.all:
        rows = client.get("/api/vhost-limits")
        text = "\n".join(f"{r['vhost']}\t{json.dumps(r['value'], separators=(',', ':'))}"
                         for r in rows)
        return rows, f"Listing limits for all vhosts ...\n{text}".rstrip()
    limits = _current_limits(client, a.vhost)
    text = json.dumps(limits, separators=(",", ":")) if limits else ""
    return limits, f'Listing limits for vhost "{a.vhost}" ...\n{text}'.rstrip()


def add_verbs(verb: Verb) -> None:
    """Register the verbs with hare-ctl's parser (`verb` is broker.ctl's registrar)."""
    for operator in (False, True):
        prefix = "operator_" if operator else ""
        what = "an operator policy" if operator else "a policy"
        sp = verb(f"set_{prefix}policy", _set_policy, f"set or update {what}", vhost=True)
        sp.add_argument("--priority", type=int, default=0)
        sp.add_argument("--apply-to", default="all", choices=("queues", "exchanges", "all"))
        sp.add_argument("name")
        sp.add_argument("pattern", help="regular expression matched against names")
        sp.add_argument("definition", help='JSON, e.g. \'{"max-length": 1000}\'')
        verb(f"clear_{prefix}policy", _clear_policy, f"remove {what}", vhost=True
             ).add_argument("name")
    verb("set_vhost_limits", _set_vhost_limits,
         "set (replace) a vhost's limits: max-connections, max-queues", vhost=True
         ).add_argument("limits", help='JSON, e.g. \'{"max-queues": 100}\'')
    verb("clear_vhost_limits", _clear_vhost_limits, "remove a vhost's limits", vhost=True)
    verb("list_vhost_limits", _list_vhost_limits, "show a vhost's limits", vhost=True
         ).add_argument("--global", dest="all", action="store_true",
                        help="every vhost's limits")
