"""hare-ctl's federation verb, as rabbitmqctl's (rabbitmq_federation's CLI):

    hare-ctl federation_status [--only-down]   every federation link and its status

Upstreams and policies are set with the management API (docs/FEDERATION.md)."""

from __future__ import annotations

import argparse
from typing import Any

from broker.ctl.client import Client, Verb, table

__all__ = ["add_verbs"]

_COLUMNS = ("type", "name", "vhost", "upstream", "upstream_name", "status", "uri",
            "timestamp", "error")


def _status(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    rows = [{**r, "name": r.get(r["type"]), "upstream_name": r.get(f"upstream_{r['type']}")}
            for r in client.get("/api/federation-links")]
    if a.only_down:
        rows = [r for r in rows if r["status"] != "running"]
    data = [{k: r.get(k) for k in _COLUMNS} for r in rows]
    return data, table(data, _COLUMNS)


def add_verbs(verb: Verb) -> None:
    verb("federation_status", _status, "every federation link and its status").add_argument(
        "--only-down", action="store_true", help="only the links that are not running")
