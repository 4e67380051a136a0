"""hare-ctl's shovel verbs, as rabbitmqctl's (rabbitmq_shovel's CLI):

    hare-ctl list_shovels            (also: shovel_status) every shovel and its state
    hare-ctl delete_shovel [-p VHOST] NAME

Shovels are defined with the management API (PUT /api/parameters/shovel/...: docs/SHOVEL.md)."""

from __future__ import annotations

import argparse
from typing import Any

from broker.ctl.client import Client, Verb, done, quote_name, table

__all__ = ["add_verbs"]

_COLUMNS = ("name", "vhost", "type", "state", "source", "destination", "reason")


def _list(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    rows = [{**s, "source": f"{s.get('src_uri')} {s.get('src_queue') or s.get('src_exchange')}",
             "destination": f"{s.get('dest_uri')} "
                            f"{s.get('dest_queue') or s.get('dest_exchange') or ''}".strip()}
            for s in client.get("/api/shovels")]
    data = [{k: r.get(k) for k in _COLUMNS} for r in rows]
    return data, table(data, _COLUMNS)


def _delete(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("DELETE", f"/api/parameters/shovel/{quote_name(a.vhost)}/{quote_name(a.name)}",
                what=f"shovel '{a.name}' in vhost '{a.vhost}'")
    return done(f'Deleting shovel {a.name} in vhost {a.vhost}')


def add_verbs(verb: Verb) -> None:
    verb("list_shovels", _list, "every shovel of the node and its state")
    verb("shovel_status", _list, "the same as list_shovels (rabbitmqctl's name)")
    verb("delete_shovel", _delete, "delete a dynamic shovel", vhost=True).add_argument("name")
