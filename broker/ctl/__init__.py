"""hare-ctl: rabbitmqctl's verbs over Hare's management HTTP API.

    hare-ctl list_queues name messages consumers
    hare-ctl -p orders purge_queue orders.new
    hare-ctl --json list_connections

It finds the API by --url or HARE_MANAGEMENT_URL (default http://127.0.0.1:15672) and logs in
with --user/--password (guest/guest); what it may do is what the API lets that user do (its
tags and vhosts: docs/SECURITY.md). HTTP goes through urllib only, so the command starts
fast. Exit codes are rabbitmqctl's: 0 ok, 64 usage, 65 bad data, 69 broker unreachable,
70 other failure, 77 refused credentials."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from broker.ctl.access import add_verbs as add_access_verbs
from broker.ctl.client import (
    DEFAULT_URL,
    EX_DATAERR,
    EX_SOFTWARE,
    EX_USAGE,
    Client,
    CtlError,
    json_arg,
    reason_of,
    table,
)
from broker.ctl.client import cell as _cell
from broker.ctl.client import done as _done
from broker.ctl.client import quote_name as _q
from broker.ctl.federation import add_verbs as add_federation_verbs
from broker.ctl.lists import add_verbs as add_list_verbs
from broker.ctl.policy import add_verbs as add_policy_verbs
from broker.ctl.quorum import add_verbs as add_quorum_verbs
from broker.ctl.shovel import add_verbs as add_shovel_verbs

__all__ = ["CtlError", "main"]


# -- other verbs ----------------------------------------------------------------------------------
def _status(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    ov = client.get("/api/overview")
    # node figures are for monitoring users and administrators; others see what is theirs
    tags = set(client.get("/api/whoami").get("tags") or [])
    nodes = client.get("/api/nodes") if tags & {"monitoring", "administrator"} else []
    [node] = nodes[:1] or [{}]
    alarms = [a for a, on in (("memory", node.get("mem_alarm")),
                              ("disk", node.get("disk_free_alarm"))) if on]
    data = {
        "node": ov.get("node", ov.get("cluster_name", "")),
        "product": f"{ov.get('product_name', 'Hare')} {ov.get('product_version', '')}".strip(),
        "os_pid": node.get("os_pid"),
        "uptime_seconds": int(node.get("uptime", 0)) // 1000,
        "memory_used_bytes": node.get("mem_used"),
        "memory_limit_bytes": node.get("mem_limit"),
        "disk_free_bytes": node.get("disk_free"),
        "alarms": alarms,
        "listeners": [f"{x['protocol']} {_host(x['ip_address'])}:{x['port']}"
                      for x in ov.get("listeners", [])],
        **{k: v for k, v in ov["object_totals"].items()},
        "messages": ov["queue_totals"].get("messages", 0),
        "messages_ready": ov["queue_totals"].get("messages_ready", 0),
        "messages_unacknowledged": ov["queue_totals"].get("messages_unacknowledged", 0),
    }
    width = max(len(k) for k in data)
    text = "\n".join(f"{k.ljust(width)}  {_status_value(v)}" for k, v in data.items())
    return data, f"Status of node {data['node']}\n{text}"


def _cluster_status(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    """rabbitmqctl cluster_status: the cluster's name, its nodes (disc and running), and
    the alarms in effect anywhere in it; Hare adds the servers: which nodes are the workers
    of one hare-server (a single-process node is its own)."""
    ov = client.get("/api/overview")
    nodes = client.get("/api/nodes")
    status, raw = client.request("GET", "/api/health/checks/alarms")
    if status not in (200, 503):
        raise CtlError(f"{reason_of(raw) or 'error'} (HTTP {status})", EX_SOFTWARE)
    alarms = json.loads(raw).get("alarms", [])
    servers: dict[str, list[str]] = {}
    for n in nodes:
        servers.setdefault(n.get("server", n["name"]), []).append(n["name"])
    data = {
        "cluster_name": ov.get("cluster_name", ov["node"]),
        "disk_nodes": [n["name"] for n in nodes],
        "running_nodes": [n["name"] for n in nodes if n.get("running")],
        "alarms": [{"node": a["node"], "resource": a["resource"]} for a in alarms],
        "servers": servers,
    }
    lines = [f"Cluster status of node {ov['node']} ...", "Basics", "",
             f"Cluster name: {data['cluster_name']}", "", "Disk Nodes", "",
             *data["disk_nodes"], "", "Running Nodes", "", *data["running_nodes"], "",
             "Alarms", ""]
    lines += [f"{_ALARM_TEXT.get(a['resource'], a['resource'])} on node {a['node']}"
              for a in alarms] or ["(none)"]
    lines += ["", "Servers", "", *(f"{server}: {', '.join(names)}"
                                   for server, names in sorted(servers.items()))]
    return data, "\n".join(lines)


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _status_value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(value) if value else "none"
    return _cell(value)


def _add_user(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("PUT", f"/api/users/{_q(a.name)}", {"password": a.new_password, "tags": a.tags})
    return _done(f"Adding user \"{a.name}\" ...")


def _set_user_tags(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.get(f"/api/users/{_q(a.name)}", what=f"user '{a.name}'")  # never create one
    client.call("PUT", f"/api/users/{_q(a.name)}", {"tags": ",".join(a.tags)})
    return _done(f"Setting tags for user \"{a.name}\" to [{', '.join(a.tags)}] ...")


def _delete_user(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("DELETE", f"/api/users/{_q(a.name)}", what=f"user '{a.name}'")
    return _done(f"Deleting user \"{a.name}\" ...")


def _change_password(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.get(f"/api/users/{_q(a.name)}", what=f"user '{a.name}'")  # never create one
    client.call("PUT", f"/api/users/{_q(a.name)}", {"password": a.new_password})
    return _done(f"Changing password for user \"{a.name}\" ...")


def _authenticate_user(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    """Log in as that user: any answer but 401 Not_Authorized means the password is right
    (a user without management tags is refused the API, not the login)."""
    as_user = Client(client.url, a.name, a.user_password, client.timeout)
    status, raw = as_user.request("GET", "/api/whoami")
    if status == 401 and reason_of(raw) == "Not_Authorized":
        raise CtlError(f"failed to authenticate user \"{a.name}\"\n"
                       f"user '{a.name}' - invalid credentials", EX_DATAERR)
    return _done(f"Authenticating user \"{a.name}\" ...\nSuccess")


def _user_permissions(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    rows = client.get(f"/api/users/{_q(a.name)}/permissions", what=f"user '{a.name}'")
    columns = ("vhost", "configure", "write", "read")
    data = [{c: r.get(c) for c in columns} for r in rows]
    return data, f"Listing permissions for user \"{a.name}\" ...\n{table(data, columns)}"


def _clear_permissions(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    """As rabbitmqctl: the user and vhost must exist; no permissions to clear is fine."""
    client.get(f"/api/users/{_q(a.perm_user)}", what=f"user '{a.perm_user}'")
    client.get(f"/api/vhosts/{_q(a.vhost)}", what=f"vhost '{a.vhost}'")
    status, raw = client.request("DELETE", f"/api/permissions/{_q(a.vhost)}/{_q(a.perm_user)}")
    if status >= 400 and status != 404:
        raise CtlError(f"{reason_of(raw) or 'error'} (HTTP {status})", EX_DATAERR)
    return _done(f"Clearing permissions for user \"{a.perm_user}\" in vhost \"{a.vhost}\" ...")


def _ping(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    node = client.get("/api/overview")["node"]
    return _done(f"Will ping {node}. This checks that the node answers its management API "
                 "and accepts these credentials.\nPing succeeded")


_ALARM_TEXT = {"memory": "Memory alarm", "disk space": "Free disk space alarm"}


def _alarms(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    """Lists the alarms in effect (exit 0 either way: the health check is what fails)."""
    status, raw = client.request("GET", "/api/health/checks/local-alarms")
    if status not in (200, 503):
        raise CtlError(f"{reason_of(raw) or 'error'} (HTTP {status})", EX_SOFTWARE)
    alarms = json.loads(raw).get("alarms", [])
    node = client.get("/api/overview")["node"]
    head = f"Asking node {node} to report any known resource alarms ..."
    if not alarms:
        return alarms, f"{head}\nNode {node} reported no alarms, local or clusterwide"
    lines = [f"{_ALARM_TEXT.get(x['resource'], x['resource'])} on node {x['node']}"
             for x in alarms]
    return alarms, "\n".join([head, *lines])


def _add_vhost(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("PUT", f"/api/vhosts/{_q(a.name)}", {})
    return _done(f"Adding vhost \"{a.name}\" ...")


def _delete_vhost(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("DELETE", f"/api/vhosts/{_q(a.name)}", what=f"vhost '{a.name}'")
    return _done(f"Deleting vhost \"{a.name}\" ...")


def _set_permissions(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("PUT", f"/api/permissions/{_q(a.vhost)}/{_q(a.perm_user)}",
                {"configure": a.configure, "write": a.write, "read": a.read})
    return _done(f"Setting permissions for user \"{a.perm_user}\" in vhost \"{a.vhost}\" ...")


def _purge_queue(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("DELETE", f"/api/queues/{_q(a.vhost)}/{_q(a.queue)}/contents",
                what=f"queue '{a.queue}' in vhost '{a.vhost}'")
    return _done(f"Purging queue '{a.queue}' in vhost '{a.vhost}' ...")


def _delete_queue(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    query = "&".join(f for f, on in (("if-empty=true", a.if_empty),
                                     ("if-unused=true", a.if_unused)) if on)
    suffix = f"?{query}" if query else ""
    client.call("DELETE", f"/api/queues/{_q(a.vhost)}/{_q(a.queue)}{suffix}",
                what=f"queue '{a.queue}' in vhost '{a.vhost}'")
    return _done(f"Deleting queue '{a.queue}' on vhost '{a.vhost}' ...")


def _close_connection(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    client.call("DELETE", f"/api/connections/{_q(a.connection)}",
                headers={"X-Reason": a.reason}, what=f"connection '{a.connection}'")
    return _done(f"Closing connection {a.connection}, reason: {a.reason}...")


def _export(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    defs = client.get("/api/definitions")
    text = json.dumps(defs, indent=2, sort_keys=False)
    if a.file == "-":
        return defs, text
    try:
        Path(a.file).write_text(text + "\n")
    except OSError as exc:
        raise CtlError(f"cannot write {a.file}: {exc.strerror}", EX_DATAERR) from None
    return _done(f"Exported definitions for the node to \"{a.file}\"")


def _import(client: Client, a: argparse.Namespace) -> tuple[Any, str]:
    try:
        raw = sys.stdin.read() if a.file == "-" else Path(a.file).read_text()
    except OSError as exc:
        raise CtlError(f"cannot read {a.file}: {exc.strerror}", EX_DATAERR) from None
    client.call("POST", "/api/definitions", json_arg(raw, a.file))
    return _done(f"Importing definitions in JSON from a file at \"{a.file}\" ...")


def _verify(_: Client | None, a: argparse.Namespace) -> tuple[Any, str]:
    """Check a stopped broker's message store and queue index files offline
    (broker.store.verify: the parsers recovery uses); a multi-worker server's data directory
    is each worker's node directory in turn."""
    try:  # the store's own checker; imported only here
        from broker.store import layout, verify  # noqa: F401 - _verify_node's
    except ImportError:
        raise CtlError("verify is not available in this build", EX_SOFTWARE) from None
    root = Path(a.data_dir)
    if not root.is_dir():
        raise CtlError(f"{root} is not a directory", EX_DATAERR)
    data: list[dict[str, Any]] = []
    lines: list[str] = []
    for node_dir in layout.node_dirs(root):
        _verify_node(node_dir, data, lines)
    if not all(d["ok"] for d in data):
        a.exit_code = EX_DATAERR
    return data, "\n".join(lines)


def _verify_node(root: Path, data: list[dict[str, Any]], lines: list[str]) -> None:
    """One node directory's stores, queue indexes and streams: reports onto `data`, `lines`."""
    from broker.store import layout
    from broker.store.verify import verify, verify_queue_indexes, verify_streams

    stores = [d for d in (root / layout.MSG_STORE_PERSISTENT, root / layout.MSG_STORE_TRANSIENT)
              if d.is_dir()] or [root]
    reports = [verify(d) for d in stores]
    mine: list[dict[str, Any]] = [{
        "directory": r.directory, "ok": r.ok, "segments": r.segments,
        "messages": r.messages, "bytes": r.bytes, "duplicates": r.duplicates,
        "clean_shutdown": r.clean_shutdown, "snapshot": r.snapshot,
        "quarantined": r.quarantined, "quarantined_messages": r.quarantined_messages,
        "problems": r.problems()} for r in reports]
    data += mine
    for d in mine:
        state = "ok" if d["ok"] else "DAMAGED"
        lines.append(f"{d['directory']}: {state} ({d['segments']} segment(s), "
                     f"{d['messages']} message(s), {d['bytes']} bytes, "
                     f"clean shutdown: {_cell(d['clean_shutdown'])}, "
                     f"snapshot: {d['snapshot']})")
        lines += [f"  {p}" for p in d["problems"]]
        lines += [f"  quarantined: {q}" for q in d["quarantined"]]
        lines += [f"  quarantined message {m.get('msg_id')} of queue '{m.get('queue')}' in "
                  f"vhost '{m.get('vhost')}': {m.get('segment')} at {m.get('offset')}, "
                  f"{m.get('error')} ({m.get('file')}, {m.get('quarantined_at')})"
                  for m in d["quarantined_messages"]]
    if (root / layout.QUEUES).is_dir():
        ix = verify_queue_indexes(root / layout.QUEUES)
        data.append({"directory": ix.directory, "ok": ix.ok, "queues": ix.queues,
                     "segments": ix.segments, "messages": ix.messages, "bytes": ix.bytes,
                     "quarantined": ix.quarantined, "problems": ix.problems()})
        lines.append(f"{ix.directory}: {'ok' if ix.ok else 'DAMAGED'} ({ix.queues} queue "
                     f"index(es), {ix.segments} segment(s), {ix.messages} message(s), "
                     f"{ix.bytes} bytes)")
        lines += [f"  {p}" for p in ix.problems()]
        lines += [f"  quarantined: {q}" for q in ix.quarantined]
    if (root / layout.STREAMS).is_dir():
        st = verify_streams(root / layout.STREAMS)
        data.append({"directory": st.directory, "ok": st.ok, "streams": st.streams,
                     "segments": st.segments, "messages": st.messages, "bytes": st.bytes,
                     "quarantined": st.quarantined, "problems": st.problems()})
        lines.append(f"{st.directory}: {'ok' if st.ok else 'DAMAGED'} ({st.streams} "
                     f"stream(s), {st.segments} segment(s), {st.messages} message(s), "
                     f"{st.bytes} bytes)")
        lines += [f"  {p}" for p in st.problems()]
        lines += [f"  quarantined: {q}" for q in st.quarantined]


# -- arguments ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    # the common options are accepted before or after the verb (rabbitmqctl takes both)
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--url", help="management API base URL (env HARE_MANAGEMENT_URL; "
                                      f"default {DEFAULT_URL})")
    common.add_argument("--user", "-u", help="user name (default guest)")
    common.add_argument("--password", help="password (default guest)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON instead of tables")
    common.add_argument("--timeout", type=float, help="seconds per HTTP request (default 10)")
    p = argparse.ArgumentParser(
        prog="hare-ctl", parents=[common],
        description="Manage a running Hare broker through its management API.")
    vhost_help = "virtual host (default /)"
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, func: Callable[..., tuple[Any, str]], help_: str,
             vhost: bool = False) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_, parents=[common])
        sp.set_defaults(func=func)
        if vhost:
            sp.add_argument("-p", "--vhost", default="/", help=vhost_help)
        return sp

    verb("status", _status, "node, memory, alarms, listeners and object counts")
    verb("cluster_status", _cluster_status,
         "the cluster's nodes, which run, its alarms and servers")
    add_list_verbs(verb)
    sp = verb("add_user", _add_user, "add a user")
    sp.add_argument("name")
    sp.add_argument("new_password", metavar="password")  # not --password, the login's
    sp.add_argument("--tags", default="", help="comma-separated tags, e.g. administrator")
    sp = verb("set_user_tags", _set_user_tags, "replace a user's tags")
    sp.add_argument("name")
    sp.add_argument("tags", nargs="*")
    verb("delete_user", _delete_user, "delete a user").add_argument("name")
    sp = verb("change_password", _change_password, "set a user's password")
    sp.add_argument("name")
    sp.add_argument("new_password", metavar="password")
    sp = verb("authenticate_user", _authenticate_user,
              "check a user's password (exit 65 when refused)")
    sp.add_argument("name")
    sp.add_argument("user_password", metavar="password")
    verb("list_user_permissions", _user_permissions, "a user's permissions in every vhost"
         ).add_argument("name")
    verb("clear_permissions", _clear_permissions, "remove a user's permissions in a vhost",
         vhost=True).add_argument("perm_user", metavar="user")
    verb("ping", _ping, "check that the broker answers (exit 69 when it does not)")
    verb("alarms", _alarms, "list the resource alarms in effect")
    add_policy_verbs(verb)
    add_access_verbs(verb)
    add_quorum_verbs(verb)
    add_shovel_verbs(verb)
    add_federation_verbs(verb)
    verb("add_vhost", _add_vhost, "add a virtual host").add_argument("name")
    verb("delete_vhost", _delete_vhost, "delete a virtual host and all in it").add_argument(
        "name")
    sp = verb("set_permissions", _set_permissions, "set a user's permissions in a vhost",
              vhost=True)
    sp.add_argument("perm_user", metavar="user")  # not --user, the login's
    for arg in ("configure", "write", "read"):
        sp.add_argument(arg)
    verb("purge_queue", _purge_queue, "remove a queue's ready messages", vhost=True
         ).add_argument("queue")
    sp = verb("delete_queue", _delete_queue, "delete a queue", vhost=True)
    sp.add_argument("queue")
    sp.add_argument("--if-empty", action="store_true")
    sp.add_argument("--if-unused", action="store_true")
    sp = verb("close_connection", _close_connection,
              "close a connection (320 CONNECTION_FORCED) with a reason")
    sp.add_argument("connection", help="connection name, as list_connections name shows it")
    sp.add_argument("reason")
    verb("export_definitions", _export, "write definitions JSON to FILE ('-': stdout)"
         ).add_argument("file")
    verb("import_definitions", _import, "load definitions JSON from FILE ('-': stdin)"
         ).add_argument("file")
    verb("verify", _verify, "check a stopped broker's message store and queue index files "
         "(offline)"
         ).add_argument("data_dir")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EX_USAGE if exc.code not in (0, None) else 0
    # defaults filled here: set_defaults would write into the actions the verbs share
    for key, value in (("url", os.environ.get("HARE_MANAGEMENT_URL", DEFAULT_URL)),
                       ("user", "guest"), ("password", "guest"), ("json", False),
                       ("timeout", 10.0)):
        if not hasattr(args, key):
            setattr(args, key, value)
    args.exit_code = 0
    client = Client(args.url, args.user, args.password, args.timeout)
    try:
        data, text = args.func(None if args.verb == "verify" else client, args)
    except CtlError as exc:
        print(f"hare-ctl: {exc}", file=sys.stderr)
        return exc.code
    if args.json:
        print(json.dumps(data, indent=2))
    elif text:
        print(text)
    return int(args.exit_code)

