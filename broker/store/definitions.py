"""The definitions database: durable exchanges, queues and bindings, users, vhosts,
permissions, topic permissions, user limits, policies and vhost limits, restored at start
(RabbitMQ keeps these in Mnesia/Khepri).

Why SQLite (standard library): each put/delete is one transaction, so a crash never leaves an
exchange deleted but its bindings kept; with WAL a crash mid-write leaves the database at its
last commit; and it costs no extra dependency. Writes are small and rare (declares, deletes,
user changes), so everything is synchronous.

Why synchronous=FULL (not NORMAL): under WAL, NORMAL can lose the last commits on power loss.
A client that got declare-ok for a durable queue must find it after a power cut, and the fsync
per commit is irrelevant at declare rates.

Arguments are AMQP field tables (str, int, float, bool, bytes, Decimal, datetime, None, nested
tables and arrays). They are stored as a tagged JSON encoding (`encode_table`/`decode_table`)
that round-trips every such value exactly, key order included; a binding's identity uses the
canonical (key-sorted) form, as RabbitMQ compares binding arguments sorted.

Passwords use RabbitMQ's rabbit_password_hashing_sha256 format, so hashes from a RabbitMQ
definitions export work here (and `check_password` also accepts its md5 and sha512 hashes)."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import pathlib
import shutil
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from broker.config.passwords import check_password, hash_password

__all__ = [
    "BindingDef",
    "Definitions",
    "DefinitionsCorrupt",
    "ExchangeDef",
    "PermissionDef",
    "PolicyDef",
    "QueueDef",
    "TopicPermissionDef",
    "UserDef",
    "check_password",
    "decode_table",
    "encode_table",
    "password_hash",
]

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class ExchangeDef:
    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueDef:
    vhost: str
    name: str
    durable: bool = True
    auto_delete: bool = False
    exclusive: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BindingDef:
    vhost: str
    source: str
    destination: str
    destination_type: str  # "queue" | "exchange"
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class UserDef:
    name: str
    password_hash: str
    tags: list[str]


@dataclass(frozen=True, slots=True)
class PermissionDef:
    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class PolicyDef:
    """A policy (operator=False) or operator policy; `body` is its JSON as PUT takes it
    (pattern, definition, priority, apply-to), validated again when it is restored."""

    vhost: str
    name: str
    operator: bool
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TopicPermissionDef:
    user: str
    vhost: str
    exchange: str
    write: str
    read: str


class DefinitionsCorrupt(RuntimeError):
    """The database cannot be trusted (not SQLite, damaged pages, a newer schema)."""


# -- passwords: one implementation, in broker.config.passwords; re-exported under the names
# this module has always offered.
password_hash = hash_password


# -- field tables as tagged JSON ---------------------------------------------------------------
# Every value becomes [tag, payload]; a table is a list of [key, value] pairs so order survives.
def _enc(v: Any, canonical: bool) -> list[Any]:
    if v is None:
        return ["V"]
    if isinstance(v, bool):  # before int: bool is an int subclass
        return ["t", v]
    if isinstance(v, int):
        return ["i", v]
    if isinstance(v, float):
        return ["f", v.hex()]  # exact, including -0.0, inf and nan
    if isinstance(v, Decimal):
        return ["d", str(v)]
    if isinstance(v, str):
        return ["s", v]
    if isinstance(v, bytes | bytearray | memoryview):
        return ["x", base64.b64encode(bytes(v)).decode("ascii")]
    if isinstance(v, dt.datetime):
        return ["T", v.isoformat()]
    if isinstance(v, Mapping):
        return ["F", _enc_pairs(v, canonical)]
    if isinstance(v, list | tuple):
        return ["A", [_enc(x, canonical) for x in v]]
    raise TypeError(f"not an AMQP field value: {type(v).__name__}")


def _enc_pairs(table: Mapping[str, Any], canonical: bool) -> list[list[Any]]:
    items = sorted(table.items()) if canonical else table.items()
    return [[str(k), _enc(v, canonical)] for k, v in items]


def _dec(e: list[Any]) -> Any:
    tag = e[0]
    if tag == "V":
        return None
    if tag in ("t", "i", "s"):
        return e[1]
    if tag == "f":
        return float.fromhex(e[1])
    if tag == "d":
        return Decimal(e[1])
    if tag == "x":
        return base64.b64decode(e[1])
    if tag == "T":
        return dt.datetime.fromisoformat(e[1])
    if tag == "F":
        return {k: _dec(v) for k, v in e[1]}
    if tag == "A":
        return [_dec(x) for x in e[1]]
    raise ValueError(f"unknown field value tag {tag!r}")


def encode_table(table: Mapping[str, Any], *, canonical: bool = False) -> str:
    """A field table as tagged JSON text. canonical=True sorts keys at every level, so equal
    tables give equal text (used as part of a binding's key)."""
    return json.dumps(_enc_pairs(table, canonical), separators=(",", ":"))


def decode_table(text: str) -> dict[str, Any]:
    """The inverse of encode_table (arrays come back as lists, bytes-likes as bytes)."""
    return {k: _dec(v) for k, v in json.loads(text)}


# -- the database ------------------------------------------------------------------------------
_SCHEMA = """
CREATE TABLE IF NOT EXISTS vhosts (name TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY, password_hash TEXT NOT NULL, tags TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS permissions (
    user TEXT NOT NULL, vhost TEXT NOT NULL,
    configure TEXT NOT NULL, write TEXT NOT NULL, read TEXT NOT NULL,
    PRIMARY KEY (user, vhost));
CREATE TABLE IF NOT EXISTS exchanges (
    vhost TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
    durable INTEGER NOT NULL, auto_delete INTEGER NOT NULL, internal INTEGER NOT NULL,
    arguments TEXT NOT NULL,
    PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS queues (
    vhost TEXT NOT NULL, name TEXT NOT NULL,
    durable INTEGER NOT NULL, auto_delete INTEGER NOT NULL, exclusive INTEGER NOT NULL,
    arguments TEXT NOT NULL,
    PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS bindings (
    vhost TEXT NOT NULL, source TEXT NOT NULL,
    destination TEXT NOT NULL, destination_type TEXT NOT NULL, routing_key TEXT NOT NULL,
    arguments TEXT NOT NULL, args_key TEXT NOT NULL,
    PRIMARY KEY (vhost, source, destination_type, destination, routing_key, args_key));
CREATE TABLE IF NOT EXISTS topic_permissions (
    user TEXT NOT NULL, vhost TEXT NOT NULL, exchange TEXT NOT NULL,
    write TEXT NOT NULL, read TEXT NOT NULL,
    PRIMARY KEY (user, vhost, exchange));
CREATE TABLE IF NOT EXISTS user_limits (
    user TEXT NOT NULL, name TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY (user, name));
CREATE INDEX IF NOT EXISTS bindings_by_destination
    ON bindings (vhost, destination_type, destination);
CREATE TABLE IF NOT EXISTS policies (
    vhost TEXT NOT NULL, name TEXT NOT NULL, operator INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (vhost, operator, name));
CREATE TABLE IF NOT EXISTS vhost_limits (
    vhost TEXT PRIMARY KEY, limits TEXT NOT NULL) WITHOUT ROWID;
"""


class Definitions:
    """The durable topology and access database at `path` (created if missing)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: transactions are explicit (see _tx), one per put/delete.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()  # the connection may be shared with an executor thread
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            # A damaged database must stop the boot, not come up with no users or queues.
            check = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise DefinitionsCorrupt(f"{self.path}: {check}")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise DefinitionsCorrupt(f"{self.path}: schema {version} is newer than this broker")
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise DefinitionsCorrupt(f"{self.path}: {e}") from e
        except BaseException:
            self._db.close()
            raise
        with self._tx() as db:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @classmethod
    def copy_of(cls, path: pathlib.Path, into: pathlib.Path) -> Definitions:
        """The database at `path` opened from a copy made in directory `into`, so that reading
        a stopped broker's (or a running one's) database writes nothing beside it: SQLite would
        create or update the -shm file, and replay the WAL into it, even when opened read-only.
        The WAL is copied too: after a crash the last commits may be only there."""
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such database")
        target = pathlib.Path(into) / path.name
        shutil.copyfile(path, target)
        wal = path.with_name(path.name + "-wal")
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(wal, target.with_name(target.name + "-wal"))
        return cls(target)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # -- vhosts / users / permissions ----------------------------------------------------------
    def put_vhost(self, name: str) -> None:
        with self._tx() as db:
            _put_vhost(db, name)

    def delete_vhost(self, name: str) -> None:
        """Also deletes everything that lives in the vhost, and permissions on it."""
        with self._tx() as db:
            db.execute("DELETE FROM vhosts WHERE name = ?", (name,))
            for table in ("permissions", "topic_permissions", "exchanges", "queues",
                          "bindings", "policies", "vhost_limits"):
                db.execute(f"DELETE FROM {table} WHERE vhost = ?", (name,))

    def vhosts(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT name FROM vhosts ORDER BY name")]

    def put_user(self, name: str, password_hash: str, tags: list[str]) -> None:
        with self._tx() as db:
            _put_user(db, name, password_hash, tags)

    def delete_user(self, name: str) -> None:
        """Also deletes the user's permissions, topic permissions and limits."""
        with self._tx() as db:
            db.execute("DELETE FROM users WHERE name = ?", (name,))
            for table in ("permissions", "topic_permissions", "user_limits"):
                db.execute(f"DELETE FROM {table} WHERE user = ?", (name,))

    def users(self) -> list[UserDef]:
        rows = self._rows("SELECT name, password_hash, tags FROM users ORDER BY name")
        return [UserDef(n, h, json.loads(t)) for n, h, t in rows]

    def put_permission(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        with self._tx() as db:
            _put_permission(db, PermissionDef(user, vhost, configure, write, read))

    def delete_permission(self, user: str, vhost: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM permissions WHERE user = ? AND vhost = ?", (user, vhost))

    def permissions(self) -> list[PermissionDef]:
        rows = self._rows("SELECT * FROM permissions ORDER BY user, vhost")
        return [PermissionDef(*r) for r in rows]

    def put_topic_permission(self, p: TopicPermissionDef) -> None:
        with self._tx() as db:
            _put_topic_permission(db, p)

    def delete_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> None:
        with self._tx() as db:
            if exchange is None:
                db.execute("DELETE FROM topic_permissions WHERE user = ? AND vhost = ?",
                           (user, vhost))
            else:
                db.execute("DELETE FROM topic_permissions WHERE user = ? AND vhost = ? "
                           "AND exchange = ?", (user, vhost, exchange))

    def topic_permissions(self) -> list[TopicPermissionDef]:
        rows = self._rows("SELECT * FROM topic_permissions ORDER BY user, vhost, exchange")
        return [TopicPermissionDef(*r) for r in rows]

    def put_user_limit(self, user: str, name: str, value: int) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO user_limits VALUES (?, ?, ?)", (user, name, value))

    def delete_user_limit(self, user: str, name: str | None = None) -> None:
        """One limit, or all of the user's."""
        with self._tx() as db:
            if name is None:
                db.execute("DELETE FROM user_limits WHERE user = ?", (user,))
            else:
                db.execute("DELETE FROM user_limits WHERE user = ? AND name = ?", (user, name))

    def user_limits(self) -> list[tuple[str, str, int]]:
        return [(u, n, int(v)) for u, n, v in
                self._rows("SELECT user, name, value FROM user_limits ORDER BY user, name")]

    # -- policies and limits -------------------------------------------------------------------
    def put_policy(self, d: PolicyDef) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO policies VALUES (?, ?, ?, ?)",
                       (d.vhost, d.name, d.operator, json.dumps(d.body)))

    def delete_policy(self, vhost: str, name: str, operator: bool) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM policies WHERE vhost = ? AND operator = ? AND name = ?",
                       (vhost, operator, name))

    def policies(self) -> list[PolicyDef]:
        rows = self._rows("SELECT vhost, name, operator, body FROM policies "
                          "ORDER BY vhost, operator, name")
        return [PolicyDef(v, n, bool(o), json.loads(b)) for v, n, o, b in rows]

    def put_vhost_limits(self, vhost: str, limits: Mapping[str, int]) -> None:
        """Replace a vhost's limits ({} clears them)."""
        with self._tx() as db:
            db.execute("DELETE FROM vhost_limits WHERE vhost = ?", (vhost,))
            if limits:
                db.execute("INSERT INTO vhost_limits VALUES (?, ?)",
                           (vhost, json.dumps(dict(limits))))

    def vhost_limits(self) -> dict[str, dict[str, int]]:
        rows = self._rows("SELECT vhost, limits FROM vhost_limits ORDER BY vhost")
        return {v: json.loads(text) for v, text in rows}

    # -- topology ------------------------------------------------------------------------------
    def put_exchange(self, d: ExchangeDef) -> None:
        with self._tx() as db:
            _put_exchange(db, d)

    def delete_exchange(self, vhost: str, name: str) -> None:
        """Also deletes the bindings it is the source or the destination of."""
        with self._tx() as db:
            db.execute("DELETE FROM exchanges WHERE vhost = ? AND name = ?", (vhost, name))
            db.execute(
                "DELETE FROM bindings WHERE vhost = ? AND (source = ? OR "
                "(destination_type = 'exchange' AND destination = ?))",
                (vhost, name, name),
            )

    def exchanges(self, vhost: str | None = None) -> list[ExchangeDef]:
        rows = self._select("exchanges", vhost, "vhost, name")
        return [
            ExchangeDef(v, n, t, bool(d), bool(a), bool(i), decode_table(args))
            for v, n, t, d, a, i, args in rows
        ]

    def put_queue(self, d: QueueDef) -> None:
        with self._tx() as db:
            _put_queue(db, d)

    def delete_queue(self, vhost: str, name: str) -> None:
        """Also deletes the bindings to it."""
        with self._tx() as db:
            db.execute("DELETE FROM queues WHERE vhost = ? AND name = ?", (vhost, name))
            db.execute(
                "DELETE FROM bindings WHERE vhost = ? AND destination_type = 'queue' "
                "AND destination = ?",
                (vhost, name),
            )

    def queues(self, vhost: str | None = None) -> list[QueueDef]:
        rows = self._select("queues", vhost, "vhost, name")
        return [
            QueueDef(v, n, bool(d), bool(a), bool(x), decode_table(args))
            for v, n, d, a, x, args in rows
        ]

    def put_binding(self, d: BindingDef) -> None:
        with self._tx() as db:
            _put_binding(db, d)

    def delete_binding(self, d: BindingDef) -> None:
        with self._tx() as db:
            db.execute(
                "DELETE FROM bindings WHERE vhost = ? AND source = ? AND destination_type = ? "
                "AND destination = ? AND routing_key = ? AND args_key = ?",
                (
                    d.vhost,
                    d.source,
                    d.destination_type,
                    d.destination,
                    d.routing_key,
                    encode_table(d.arguments, canonical=True),
                ),
            )

    def bindings(self, vhost: str | None = None) -> list[BindingDef]:
        rows = self._select(
            "bindings",
            vhost,
            "vhost, source, destination_type, destination, routing_key, args_key",
            "vhost, source, destination, destination_type, routing_key, arguments",
        )
        return [BindingDef(v, s, d, t, k, decode_table(args)) for v, s, d, t, k, args in rows]

    def _select(
        self, table: str, vhost: str | None, order: str, columns: str = "*"
    ) -> list[tuple[Any, ...]]:
        if vhost is None:
            return self._rows(f"SELECT {columns} FROM {table} ORDER BY {order}")
        return self._rows(f"SELECT {columns} FROM {table} WHERE vhost = ? ORDER BY {order}", vhost)

    # -- RabbitMQ definitions import -----------------------------------------------------------
    def import_rabbitmq(self, doc: Mapping[str, Any]) -> None:
        """Load a RabbitMQ definitions export (the JSON of `rabbitmqctl export_definitions`)
        in one transaction: all of it or, on a malformed entry, none of it. Users may carry
        `password_hash` (any rabbit_password_hashing_* module) or a plain `password`."""
        with self._tx() as db:
            for v in doc.get("vhosts", ()):
                _put_vhost(db, v["name"])
            for u in doc.get("users", ()):
                tags = u.get("tags", [])
                if isinstance(tags, str):  # older exports: "administrator,monitoring"
                    tags = [t for t in tags.split(",") if t]
                stored = u.get("password_hash")
                if stored is None:
                    stored = hash_password(u["password"]) if "password" in u else ""
                _put_user(db, u["name"], stored, list(tags))
            for p in doc.get("permissions", ()):
                perm = PermissionDef(p["user"], p["vhost"], p["configure"], p["write"], p["read"])
                _put_permission(db, perm)
            for t in doc.get("topic_permissions", ()):
                _put_topic_permission(db, TopicPermissionDef(t["user"], t["vhost"],
                                                             t["exchange"], t["write"],
                                                             t["read"]))
            for e in doc.get("exchanges", ()):
                _put_exchange(
                    db,
                    ExchangeDef(
                        e["vhost"],
                        e["name"],
                        e["type"],
                        bool(e.get("durable", True)),
                        bool(e.get("auto_delete", False)),
                        bool(e.get("internal", False)),
                        dict(e.get("arguments") or {}),
                    ),
                )
            for q in doc.get("queues", ()):
                _put_queue(
                    db,
                    QueueDef(
                        q["vhost"],
                        q["name"],
                        bool(q.get("durable", True)),
                        bool(q.get("auto_delete", False)),
                        bool(q.get("exclusive", False)),
                        dict(q.get("arguments") or {}),
                    ),
                )
            for b in doc.get("bindings", ()):
                _put_binding(
                    db,
                    BindingDef(
                        b["vhost"],
                        b["source"],
                        b["destination"],
                        b["destination_type"],
                        b.get("routing_key", ""),
                        dict(b.get("arguments") or {}),
                    ),
                )


# -- single-row writes, run inside the caller's transaction ---------------------------------
def _put_vhost(db: sqlite3.Connection, name: str) -> None:
    db.execute("INSERT OR IGNORE INTO vhosts VALUES (?)", (name,))


def _put_user(db: sqlite3.Connection, name: str, stored_hash: str, tags: list[str]) -> None:
    db.execute(
        "INSERT OR REPLACE INTO users VALUES (?, ?, ?)",
        (name, stored_hash, json.dumps(list(tags))),
    )


def _put_permission(db: sqlite3.Connection, p: PermissionDef) -> None:
    db.execute(
        "INSERT OR REPLACE INTO permissions VALUES (?, ?, ?, ?, ?)",
        (p.user, p.vhost, p.configure, p.write, p.read),
    )


def _put_topic_permission(db: sqlite3.Connection, p: TopicPermissionDef) -> None:
    db.execute(
        "INSERT OR REPLACE INTO topic_permissions VALUES (?, ?, ?, ?, ?)",
        (p.user, p.vhost, p.exchange, p.write, p.read),
    )


def _put_exchange(db: sqlite3.Connection, d: ExchangeDef) -> None:
    db.execute(
        "INSERT OR REPLACE INTO exchanges VALUES (?, ?, ?, ?, ?, ?, ?)",
        (d.vhost, d.name, d.type, d.durable, d.auto_delete, d.internal, encode_table(d.arguments)),
    )


def _put_queue(db: sqlite3.Connection, d: QueueDef) -> None:
    db.execute(
        "INSERT OR REPLACE INTO queues VALUES (?, ?, ?, ?, ?, ?)",
        (d.vhost, d.name, d.durable, d.auto_delete, d.exclusive, encode_table(d.arguments)),
    )


def _put_binding(db: sqlite3.Connection, d: BindingDef) -> None:
    if d.destination_type not in ("queue", "exchange"):
        raise ValueError(f"bad destination_type {d.destination_type!r}")
    db.execute(
        "INSERT OR REPLACE INTO bindings VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            d.vhost,
            d.source,
            d.destination,
            d.destination_type,
            d.routing_key,
            encode_table(d.arguments),
            encode_table(d.arguments, canonical=True),
        ),
    )
