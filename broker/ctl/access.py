"""hare-ctl's topic-permission and user-limit verbs, as rabbitmqctl's:

    hare-ctl set_topic_permissions [-p VHOST] USER EXCHANGE WRITE READ
    hare-ctl clear_topic_permissions [-p VHOST] USER [EXCHANGE]
    hare-ctl set_user_limits USER '{"max-connections": 10, "max-channels": 20}'
    hare-ctl clear_user_limits USER max-connections|max-channels|all

(list_topic_permissions and list_user_limits are list verbs in broker.ctl.lists.) What a user may
do is what the management API lets it (docs/SECURITY.md)."""

from __future__ import annotations

import argparse
from typing import Any

from broker.ctl.client import EX_DATAERR, Client, CtlError, Verb, done, json_arg, quote_name

__all__ = ["add_verbs"]


def _set_topic_permissions(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("PUT", f"/api/topic-permissions/{quote_name(a.vhost)}/{quote_name(a.perm_user)}",
                {"exchange": a.exchange, "write": a.write, "read": a.read})
    return done(f"Setting topic permissions on \"{a.exchange}\" for user \"{a.perm_user}\" "
                f"in vhost \"{a.vhost}\" ...")


def _clear_topic_permissions(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    query = f"?exchange={quote_name(a.exchange)}" if a.exchange else ""
    client.call("DELETE", f"/api/topic-permissions/{quote_name(a.vhost)}/"
                          f"{quote_name(a.perm_user)}{query}",
                what=f"topic permissions of user '{a.perm_user}' in vhost '{a.vhost}'")
    return done(f"Clearing topic permissions for user \"{a.perm_user}\" in vhost "
                f"\"{a.vhost}\" ...")


def _set_user_limits(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    limits = json_arg(a.definition, "limits")
    if not isinstance(limits, dict) or not limits:
        raise CtlError('limits must be a JSON object, e.g. {"max-connections": 10}', EX_DATAERR)
    for name, value in limits.items():
        client.call("PUT", f"/api/user-limits/{quote_name(a.name)}/{quote_name(name)}",
                    {"value": value})
    return done(f"Setting user limits to \"{a.definition}\" for user \"{a.name}\" ...")


def _clear_user_limits(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("DELETE", f"/api/user-limits/{quote_name(a.name)}/{quote_name(a.limit)}",
                what=f"user '{a.name}'")
    return done(f"Clearing \"{a.limit}\" limit for user \"{a.name}\" ...")


def add_verbs(verb: Verb) -> None:
    """Register the verbs with hare-ctl's parser (`verb` is broker.ctl's registrar)."""
    sp = verb("set_topic_permissions", _set_topic_permissions,
              "set a user's routing-key patterns on a topic exchange", vhost=True)
    sp.add_argument("perm_user", metavar="user")  # not --user, the login's
    for arg in ("exchange", "write", "read"):
        sp.add_argument(arg)
    sp = verb("clear_topic_permissions", _clear_topic_permissions,
              "clear a user's topic permissions (all, or one exchange's)", vhost=True)
    sp.add_argument("perm_user", metavar="user")
    sp.add_argument("exchange", nargs="?", default="")
    sp = verb("set_user_limits", _set_user_limits,
              "set a user's limits, e.g. '{\"max-connections\": 10, \"max-channels\": 20}'")
    sp.add_argument("name")
    sp.add_argument("definition")
    sp = verb("clear_user_limits", _clear_user_limits,
              "clear one of a user's limits (max-connections, max-channels) or all")
    sp.add_argument("name")
    sp.add_argument("limit")
