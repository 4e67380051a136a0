"""hare-ctl: rabbitmqctl's verbs over Hare's management HTTP API.

    hare-ctl list_queues name messages consumers
    hare-ctl -p orders purge_queue orders.new
    hare-ctl --json list_connections

It finds the API by --url or HARE_MANAGEMENT_URL (default http://127.0.0.1:15672) and logs in
with --user/--password (guest/guest). HTTP goes through urllib only, so the command starts
fast. Exit codes are rabbitmqctl's: 0 ok, 64 usage, 65 bad data, 69 broker unreachable,
70 other failure, 77 refused credentials."""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

__all__ = ["CtlError", "main"]

DEFAULT_URL = "http://127.0.0.1:15672"
EX_USAGE, EX_DATAERR, EX_UNAVAILABLE, EX_SOFTWARE, EX_NOPERM = 64, 65, 69, 70, 77


class CtlError(Exception):
    """A one-line failure and its exit code."""

    def __init__(self, message: str, code: int = EX_SOFTWARE) -> None:
        super().__init__(message)
        self.code = code


# -- HTTP -----------------------------------------------------------------------------------------
class Client:
    def __init__(self, url: str, user: str, password: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.user = user
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.auth = f"Basic {token}"
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None, what: str = "") -> Any:
        """One request; `what` names the object for a 404 ("queue 'q' in vhost '/'")."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", self.auth)
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc, what or path) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ConnectionRefusedError):
                text = "connection refused"
            elif isinstance(reason, socket.timeout | TimeoutError):
                text = "timed out"
            else:
                text = str(getattr(reason, "strerror", None) or reason)
            raise CtlError(f"cannot reach the management API at {self.url}: {text}",
                           EX_UNAVAILABLE) from None
        return json.loads(raw) if raw.strip() else None

    def _http_error(self, exc: urllib.error.HTTPError, what: str) -> CtlError:
        try:
            reason = json.loads(exc.read()).get("reason", "")
        except (ValueError, AttributeError):
            reason = ""
        if exc.code == 401:
            why = f" ({reason})" if reason and reason != "Not_Authorized" else ""
            return CtlError(f"authentication failed for user '{self.user}' at {self.url} "
                            f"(401){why}", EX_NOPERM)
        if exc.code == 404:
            return CtlError(f"not found: {what}", EX_DATAERR)
        return CtlError(f"{reason or exc.reason} (HTTP {exc.code})",
                        EX_DATAERR if exc.code in (400, 403, 405) else EX_SOFTWARE)

    def get(self, path: str, what: str = "") -> Any:
        return self.call("GET", path, what=what)


def _q(name: str) -> str:
    return quote(name, safe="")


# -- output ---------------------------------------------------------------------------------------
def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(value) + "]"  # tags, as rabbitmqctl prints them
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    """Aligned columns with a header; numbers right-aligned."""
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    numeric = [all(row[i].lstrip("-").replace(".", "", 1).isdigit() for row in cells if row[i])
               and any(row[i] for row in cells) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w)
                 for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(columns)), *(line(row) for row in cells)])


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
}


# the list verbs whose API path names a vhost take -p, as rabbitmqctl's
_PER_VHOST = ("list_queues", "list_exchanges", "list_bindings", "list_consumers",
              "list_permissions")


def _list(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    path, default_columns, shape = LISTS[args.verb]
    rows = [shape(r) for r in client.get(path(args))]
    columns = tuple(args.columns) or default_columns
    unknown = [c for c in columns if rows and c not in rows[0]]
    if unknown:
        raise CtlError(f"unknown column(s) for {args.verb}: {', '.join(unknown)}", EX_USAGE)
    data = [{c: r.get(c) for c in columns} for r in rows]
    return data, table(data, columns)


# -- other verbs ----------------------------------------------------------------------------------
def _status(client: Client, args: argparse.Namespace) -> tuple[Any, str]:
    ov = client.get("/api/overview")
    [node] = client.get("/api/nodes")[:1] or [{}]
    alarms = [a for a, on in (("memory", node.get("mem_alarm")),
                              ("disk", node.get("disk_free_alarm"))) if on]
    data = {
        "node": ov["node"],
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


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _status_value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(value) if value else "none"
    return _cell(value)


def _done(message: str) -> tuple[Any, str]:
    return {"result": "ok", "message": message}, message


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
        defs = json.loads(raw)
    except OSError as exc:
        raise CtlError(f"cannot read {a.file}: {exc.strerror}", EX_DATAERR) from None
    except ValueError as exc:
        raise CtlError(f"{a.file} is not JSON: {exc}", EX_DATAERR) from None
    client.call("POST", "/api/definitions", defs)
    return _done(f"Importing definitions in JSON from a file at \"{a.file}\" ...")


def _verify(_: Client | None, a: argparse.Namespace) -> tuple[Any, str]:
    """Check a stopped broker's message store files offline (broker.store.verify)."""
    try:
        from broker.store import verify  # the store's own checker; imported only here
    except ImportError:
        raise CtlError("verify is not available in this build", EX_SOFTWARE) from None
    root = Path(a.data_dir)
    if not root.is_dir():
        raise CtlError(f"{root} is not a directory", EX_DATAERR)
    stores = [d for d in (root / "msg_store_persistent", root / "msg_store_transient")
              if d.is_dir()] or [root]
    reports = [verify(d) for d in stores]
    data: list[dict[str, Any]] = [{"directory": r.directory, "ok": r.ok, "segments": r.segments,
             "messages": r.messages, "bytes": r.bytes, "duplicates": r.duplicates,
             "clean_shutdown": r.clean_shutdown, "snapshot": r.snapshot,
             "quarantined": r.quarantined, "problems": r.problems()} for r in reports]
    lines = []
    for d in data:
        state = "ok" if d["ok"] else "DAMAGED"
        lines.append(f"{d['directory']}: {state} ({d['segments']} segment(s), "
                     f"{d['messages']} message(s), {d['bytes']} bytes, "
                     f"clean shutdown: {_cell(d['clean_shutdown'])}, "
                     f"snapshot: {d['snapshot']})")
        lines += [f"  {p}" for p in d["problems"]]
        lines += [f"  quarantined: {q}" for q in d["quarantined"]]
    if not all(d["ok"] for d in data):
        a.exit_code = EX_DATAERR
    return data, "\n".join(lines)


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
    for name, (_, cols, _) in LISTS.items():
        sp = verb(name, _list, f"list {name[5:]} (default columns: {' '.join(cols)})",
                  vhost=name in _PER_VHOST)
        sp.add_argument("columns", nargs="*", help="columns to show, as rabbitmqctl's items")
    sp = verb("add_user", _add_user, "add a user")
    sp.add_argument("name")
    sp.add_argument("new_password", metavar="password")  # not --password, the login's
    sp.add_argument("--tags", default="", help="comma-separated tags, e.g. administrator")
    sp = verb("set_user_tags", _set_user_tags, "replace a user's tags")
    sp.add_argument("name")
    sp.add_argument("tags", nargs="*")
    verb("delete_user", _delete_user, "delete a user").add_argument("name")
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
    verb("verify", _verify, "check a stopped broker's message store files (offline)"
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


if __name__ == "__main__":
    sys.exit(main())
