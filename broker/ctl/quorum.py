"""hare-ctl's quorum queue verbs, as `rabbitmq-queues`' (through the management API):

    hare-ctl add_member [-p VHOST] QUEUE NODE|SERVER
    hare-ctl delete_member [-p VHOST] QUEUE NODE
    hare-ctl grow NODE|SERVER all|even [--vhost-pattern RE] [--queue-pattern RE] [--errors-only]
    hare-ctl shrink NODE [--errors-only]

grow adds NODE to every quorum queue that matches (`even`: only to those with an even number of
members, RabbitMQ's rule) and that has no member on NODE's server yet while the running nodes
span several servers; NODE may name a server (a multi-worker one: `<name>-w<i>` are its
nodes), whose least loaded node then takes each new member. add_member onto a server that
holds a member of the queue already is refused then. shrink removes NODE from every quorum
queue that has it. Each change
is one etcd transaction on the queue's record; a new member is copied the queue by its leader
before it counts (docs/CLUSTER.md)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from broker.ctl.client import Client, CtlError, Verb, done, quote_name, table

__all__ = ["add_verbs"]


def _members_path(vhost: str, queue: str) -> str:
    return f"/api/queues/{quote_name(vhost)}/{quote_name(queue)}/members"


def _add_member(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("POST", _members_path(a.vhost, a.queue), {"node": a.node},
                what=f"queue '{a.queue}' in vhost '{a.vhost}'")
    return done(f"Adding a replica for queue {a.queue} on node {a.node}...")


def _delete_member(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("DELETE", f"{_members_path(a.vhost, a.queue)}/{quote_name(a.node)}",
                what=f"queue '{a.queue}' in vhost '{a.vhost}'")
    return done(f"Removing a replica of queue {a.queue} on node {a.node}...")


def _quorum_queues(client: Client) -> list[dict[str, Any]]:
    return [q for q in client.get("/api/queues") if q.get("type") == "quorum"]


def _each(client: Client, a: argparse.Namespace, queues: list[dict[str, Any]],
          change: Callable[[dict[str, Any]], None]) -> tuple[Any, str]:
    rows = []
    for q in queues:
        try:
            change(q)
            result = "ok"
        except CtlError as exc:
            result = f"error: {exc}"
        info = client.get(f"/api/queues/{quote_name(q['vhost'])}/{quote_name(q['name'])}")
        rows.append({"vhost": q["vhost"], "name": q["name"],
                     "size": len(info.get("members") or []), "result": result})
    if a.errors_only:
        rows = [r for r in rows if r["result"] != "ok"]
    if any(r["result"] != "ok" for r in rows):
        a.exit_code = 1
    return rows, table(rows, ("vhost", "name", "size", "result"))


def _grow(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    vhosts, queues = re.compile(a.vhost_pattern), re.compile(a.queue_pattern)
    nodes = client.get("/api/nodes")
    server = {n["name"]: n.get("server") or n["name"] for n in nodes}
    # one member per server while the running nodes span several (docs/CLUSTER.md,
    # "Servers"): a queue whose member is on NODE's server already is left as it is, as one
    # whose member NODE is
    spread = len({server[n["name"]] for n in nodes if n.get("running")}) > 1
    target = server.get(a.node, a.node)  # NODE may name a server: the broker picks its node

    def has(q: dict[str, Any]) -> bool:
        members = q.get("members") or []
        return a.node in members or (spread and target in {server.get(m, m) for m in members})

    wanted = [q for q in _quorum_queues(client)
              if vhosts.search(q["vhost"]) and queues.search(q["name"]) and not has(q)
              and (a.strategy == "all" or len(q.get("members") or []) % 2 == 0)]
    return _each(client, a, wanted, lambda q: client.call(
        "POST", _members_path(q["vhost"], q["name"]), {"node": a.node}))


def _shrink(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    wanted = [q for q in _quorum_queues(client) if a.node in (q.get("members") or [])]
    return _each(client, a, wanted, lambda q: client.call(
        "DELETE", f"{_members_path(q['vhost'], q['name'])}/{quote_name(a.node)}"))


def add_verbs(verb: Verb) -> None:
    sp = verb("add_member", _add_member, "add a member (replica) to a quorum queue", vhost=True)
    sp.add_argument("queue")
    sp.add_argument("node")
    sp = verb("delete_member", _delete_member, "remove a member from a quorum queue",
              vhost=True)
    sp.add_argument("queue")
    sp.add_argument("node")
    sp = verb("grow", _grow, "add a node to the quorum queues that match")
    sp.add_argument("node")
    sp.add_argument("strategy", choices=("all", "even"))
    sp.add_argument("--vhost-pattern", default=".*")
    sp.add_argument("--queue-pattern", default=".*")
    sp.add_argument("--errors-only", action="store_true")
    sp = verb("shrink", _shrink, "remove a node from every quorum queue that has it")
    sp.add_argument("node")
    sp.add_argument("--errors-only", action="store_true")
