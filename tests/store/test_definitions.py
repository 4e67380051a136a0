"""The definitions database: CRUD, restart, cascades, argument encoding, RabbitMQ passwords."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.store.definitions import (
    BindingDef,
    Definitions,
    DefinitionsCorrupt,
    ExchangeDef,
    PermissionDef,
    QueueDef,
    UserDef,
    check_password,
    decode_table,
    encode_table,
    password_hash,
)


@pytest.fixture
def db(tmp_path: Path) -> Definitions:
    return Definitions(tmp_path / "defs" / "definitions.db")


def reopen(db: Definitions) -> Definitions:
    db.close()
    return Definitions(db.path)


def test_vhosts_users_permissions_survive_a_restart(db: Definitions) -> None:
    db.put_vhost("/")
    db.put_vhost("prod")
    db.put_vhost("/")  # idempotent
    db.put_user("guest", password_hash("guest"), ["administrator"])
    db.put_user("app", "h1", [])
    db.put_user("app", "h2", ["monitoring", "management"])  # replaces
    db.put_permission("guest", "/", ".*", ".*", ".*")
    db.put_permission("app", "prod", "", "^out$", "^in$")
    db = reopen(db)
    assert db.vhosts() == ["/", "prod"]
    assert [u.name for u in db.users()] == ["app", "guest"]
    assert db.users()[0] == UserDef("app", "h2", ["monitoring", "management"])
    assert check_password("guest", db.users()[1].password_hash)
    assert db.permissions() == [
        PermissionDef("app", "prod", "", "^out$", "^in$"),
        PermissionDef("guest", "/", ".*", ".*", ".*"),
    ]
    db.delete_permission("app", "prod")
    assert [p.user for p in db.permissions()] == ["guest"]
    db.close()


def test_topology_survives_a_restart(db: Definitions) -> None:
    ex = ExchangeDef("/", "orders", "topic", True, False, False, {"alternate-exchange": "ae"})
    q = QueueDef("/", "work", True, False, False, {"x-max-length": 10, "x-queue-type": "classic"})
    b = BindingDef("/", "orders", "work", "queue", "order.*", {"x-match": "all"})
    db.put_exchange(ex)
    db.put_queue(q)
    db.put_binding(b)
    db.put_binding(b)  # idempotent
    db = reopen(db)
    assert db.exchanges() == [ex]
    assert db.queues() == [q]
    assert db.bindings() == [b]
    db.close()


def test_put_replaces_and_vhost_filter_selects(db: Definitions) -> None:
    db.put_exchange(ExchangeDef("a", "x", "direct"))
    db.put_exchange(ExchangeDef("a", "x", "fanout", auto_delete=True))
    db.put_exchange(ExchangeDef("b", "x", "direct"))
    db.put_queue(QueueDef("a", "q"))
    db.put_queue(QueueDef("b", "q", exclusive=True))
    assert [(e.vhost, e.type, e.auto_delete) for e in db.exchanges()] == [
        ("a", "fanout", True),
        ("b", "direct", False),
    ]
    assert db.exchanges("b") == [ExchangeDef("b", "x", "direct")]
    assert db.queues("b") == [QueueDef("b", "q", exclusive=True)]
    assert db.queues("nope") == []


def test_bindings_differ_by_arguments_in_any_key_order(db: Definitions) -> None:
    one = BindingDef("/", "h", "q", "queue", "", {"x-match": "any", "a": 1})
    same = BindingDef("/", "h", "q", "queue", "", {"a": 1, "x-match": "any"})
    other = BindingDef("/", "h", "q", "queue", "", {"x-match": "all", "a": 1})
    db.put_binding(one)
    db.put_binding(other)
    db.put_binding(same)  # the same binding as `one`: replaces it
    assert len(db.bindings()) == 2
    db.delete_binding(same)
    assert db.bindings() == [other]


def test_delete_exchange_cascades_to_its_bindings(db: Definitions) -> None:
    db.put_exchange(ExchangeDef("/", "src", "fanout"))
    db.put_exchange(ExchangeDef("/", "mid", "fanout"))
    db.put_queue(QueueDef("/", "q"))
    db.put_binding(BindingDef("/", "src", "mid", "exchange", ""))  # mid as destination
    db.put_binding(BindingDef("/", "mid", "q", "queue", ""))  # mid as source
    db.put_binding(BindingDef("/", "src", "q", "queue", "k"))  # untouched
    db.put_binding(BindingDef("other", "mid", "q", "queue", ""))  # another vhost: untouched
    db.delete_exchange("/", "mid")
    assert [e.name for e in db.exchanges()] == ["src"]
    assert [(b.vhost, b.source, b.destination) for b in db.bindings()] == [
        ("/", "src", "q"),
        ("other", "mid", "q"),
    ]


def test_delete_queue_cascades_to_bindings_to_it(db: Definitions) -> None:
    db.put_queue(QueueDef("/", "q"))
    db.put_queue(QueueDef("/", "keep"))
    db.put_binding(BindingDef("/", "amq.direct", "q", "queue", "q"))
    db.put_binding(BindingDef("/", "amq.direct", "keep", "queue", "keep"))
    db.put_binding(BindingDef("/", "amq.direct", "q", "exchange", "x"))  # an exchange named q
    db.delete_queue("/", "q")
    assert [q.name for q in db.queues()] == ["keep"]
    assert {(b.destination, b.destination_type) for b in db.bindings()} == {
        ("keep", "queue"),
        ("q", "exchange"),
    }


def test_delete_vhost_and_user_cascade(db: Definitions) -> None:
    for vh in ("/", "gone"):
        db.put_vhost(vh)
        db.put_exchange(ExchangeDef(vh, "x", "direct"))
        db.put_queue(QueueDef(vh, "q"))
        db.put_binding(BindingDef(vh, "x", "q", "queue", ""))
        db.put_permission("u", vh, ".*", ".*", ".*")
    db.put_user("u", "", [])
    db.delete_vhost("gone")
    assert db.vhosts() == ["/"]
    assert {e.vhost for e in db.exchanges()} == {q.vhost for q in db.queues()} == {"/"}
    assert {b.vhost for b in db.bindings()} == {p.vhost for p in db.permissions()} == {"/"}
    db.delete_user("u")
    assert db.users() == [] and db.permissions() == []


def test_binding_destination_type_is_checked(db: Definitions) -> None:
    with pytest.raises(ValueError):
        db.put_binding(BindingDef("/", "x", "q", "topic", ""))
    assert db.bindings() == []


def test_database_is_wal_with_full_sync(db: Definitions) -> None:
    db.put_vhost("/")
    db.close()
    raw = sqlite3.connect(db.path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
    raw.close()


def test_a_failed_import_changes_nothing(db: Definitions) -> None:
    doc = {
        "vhosts": [{"name": "/"}],
        "queues": [{"name": "q", "vhost": "/", "durable": True, "auto_delete": False}],
        "bindings": [{"source": "x", "vhost": "/", "destination": "q"}],  # no destination_type
    }
    with pytest.raises(KeyError):
        db.import_rabbitmq(doc)
    assert db.vhosts() == [] and db.queues() == []


def test_import_a_rabbitmq_definitions_export(db: Definitions) -> None:
    guest = password_hash("guest", bytes.fromhex("908dc60a"))
    doc: dict[str, Any] = {
        "rabbit_version": "3.13.0",
        "users": [
            {
                "name": "guest",
                "password_hash": guest,
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": ["administrator"],
                "limits": {},
            },
            {"name": "old", "password_hash": "ytUIm8s3AnKsXQjptplKFytfVxI=", "tags": "a,b"},
        ],
        "vhosts": [{"name": "/"}],
        "permissions": [
            {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
        ],
        "exchanges": [
            {
                "name": "ev",
                "vhost": "/",
                "type": "topic",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        ],
        "queues": [
            {
                "name": "jobs",
                "vhost": "/",
                "durable": True,
                "auto_delete": False,
                "arguments": {"x-queue-type": "classic", "x-message-ttl": 60000},
            }
        ],
        "bindings": [
            {
                "source": "ev",
                "vhost": "/",
                "destination": "jobs",
                "destination_type": "queue",
                "routing_key": "job.#",
                "arguments": {},
            }
        ],
    }
    db.import_rabbitmq(doc)
    users = {u.name: u for u in db.users()}
    assert check_password("guest", users["guest"].password_hash)
    assert check_password("simon", users["old"].password_hash)  # an md5-era hash
    assert users["old"].tags == ["a", "b"]
    assert db.queues() == [QueueDef("/", "jobs", arguments=doc["queues"][0]["arguments"])]
    assert db.bindings() == [BindingDef("/", "ev", "jobs", "queue", "job.#")]
    assert db.exchanges() == [ExchangeDef("/", "ev", "topic")]
    assert db.permissions() == [PermissionDef("guest", "/", ".*", ".*", ".*")]


# -- passwords ----------------------------------------------------------------------------------
def test_password_hash_fixed_salt_vector() -> None:
    # sha256(5ac9aa26 + "mypass") = 30504ecd...6b6b6c, a published worked example of the format.
    stored = password_hash("mypass", bytes.fromhex("5ac9aa26"))
    assert stored == "WsmqJjBQTs2r1O0IO9XQ8ciOGRiUviDd5vdsFnm3h7INa2ts"
    raw = base64.b64decode(stored)
    assert raw[:4] == bytes.fromhex("5ac9aa26") and raw[4:8] == bytes.fromhex("30504ecd")
    assert check_password("mypass", stored)
    assert not check_password("mypas", stored)


def test_password_hash_round_trip_uses_a_random_salt() -> None:
    a, b = password_hash("guest"), password_hash("guest")
    assert a != b  # 4 random salt bytes each time (equal with chance 2**-32)
    assert len(base64.b64decode(a)) == 36
    assert check_password("guest", a) and check_password("guest", b)
    assert not check_password("Guest", a)
    assert check_password("pässwörd", password_hash("pässwörd"))


def test_rabbitmq_md5_and_sha512_hashes_are_accepted() -> None:
    # The md5 worked example from RabbitMQ's own mailing list (salt cad5089b, password simon).
    assert check_password("simon", "ytUIm8s3AnKsXQjptplKFytfVxI=")

    salt = b"\x01\x02\x03\x04"
    sha512 = base64.b64encode(salt + hashlib.sha512(salt + b"pw").digest()).decode()
    assert check_password("pw", sha512) and not check_password("pW", sha512)


@pytest.mark.parametrize(
    "stored", ["", "not base64!", "AAAA", base64.b64encode(b"x" * 30).decode()]
)
def test_empty_or_malformed_hash_matches_nothing(stored: str) -> None:
    assert not check_password("", stored)
    assert not check_password("guest", stored)


def test_password_salt_must_be_four_bytes() -> None:
    with pytest.raises(ValueError):
        password_hash("x", b"12345")


# -- argument encoding ----------------------------------------------------------------------------
def same(a: Any, b: Any) -> bool:
    """Equal with equal types all the way down (True == 1 and 0.0 == -0.0 would hide bugs)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return bool(a.hex() == b.hex())
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, dt.datetime):
        return bool(a == b and a.tzinfo == b.tzinfo)
    return bool(a == b)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.decimals(allow_nan=False),
    st.text(),
    st.binary(),
    st.datetimes(timezones=st.one_of(st.none(), st.just(dt.UTC))),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(), inner, max_size=4)
    ),
    max_leaves=20,
)
tables = st.dictionaries(st.text(), values, max_size=6)


@given(tables)
def test_arguments_round_trip_losslessly(table: dict[str, Any]) -> None:
    assert same(decode_table(encode_table(table)), table)


@given(tables)
def test_canonical_encoding_ignores_key_order(table: dict[str, Any]) -> None:
    reordered = dict(reversed(list(table.items())))
    assert encode_table(table, canonical=True) == encode_table(reordered, canonical=True)


def test_arguments_survive_the_database(db: Definitions) -> None:
    args: dict[str, Any] = {
        "s": "text",
        "i": -(2**70),
        "f": -0.0,
        "b": False,
        "x": b"\x00\xff",
        "d": Decimal("1.250"),
        "t": dt.datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=dt.UTC),
        "n": None,
        "nested": {"z": [1, "two", {"three": 3.5}], "a": True},
    }
    db.put_queue(QueueDef("/", "q", arguments=args))
    db = reopen(db)
    [q] = db.queues()
    assert same(q.arguments, args)
    db.close()


def test_unknown_argument_types_are_refused() -> None:
    with pytest.raises(TypeError):
        encode_table({"k": object()})


def test_a_file_that_is_not_a_database_stops_the_open(tmp_path: Path) -> None:
    path = tmp_path / "definitions.db"
    path.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(DefinitionsCorrupt):
        Definitions(path)


def test_damaged_pages_stop_the_open(tmp_path: Path) -> None:
    path = tmp_path / "definitions.db"
    db = Definitions(path)
    for i in range(300):
        db.put_queue(QueueDef("/", f"queue-{i:04d}", arguments={"x-pad": "p" * 200}))
    db.close()  # the last connection closing checkpoints the WAL into the main file
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 8 * page
    data[5 * page : 6 * page] = b"\xa5" * page  # a page of a table b-tree overwritten
    path.write_bytes(data)
    with pytest.raises(DefinitionsCorrupt):
        Definitions(path)


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "definitions.db"
    Definitions(path).close()
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(DefinitionsCorrupt, match="newer"):
        Definitions(path)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tables, tables)
def test_any_arguments_survive_the_database(
    tmp_path_factory: pytest.TempPathFactory, qargs: dict[str, Any], bargs: dict[str, Any]
) -> None:
    path = tmp_path_factory.mktemp("defs") / "d.db"
    db = Definitions(path)
    db.put_exchange(ExchangeDef("/", "x", "headers", arguments=qargs))
    db.put_queue(QueueDef("/", "q", arguments=qargs))
    db.put_binding(BindingDef("/", "x", "q", "queue", "", bargs))
    db = reopen(db)
    assert same(db.exchanges()[0].arguments, qargs)
    assert same(db.queues()[0].arguments, qargs)
    assert same(db.bindings()[0].arguments, bargs)
    db.delete_binding(BindingDef("/", "x", "q", "queue", "", dict(reversed(bargs.items()))))
    assert db.bindings() == []
    db.close()


def test_copy_of_reads_commits_still_in_the_wal_and_writes_nothing_beside(
    db: Definitions, tmp_path: Path
) -> None:
    db.put_queue(QueueDef("/", "jobs"))  # the connection stays open, as in a crash
    d = db.path.parent
    assert (d / (db.path.name + "-wal")).stat().st_size > 0
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    into = tmp_path / "copy"
    into.mkdir()
    copy = Definitions.copy_of(db.path, into)
    assert copy.queues() == [QueueDef("/", "jobs")]
    copy.close()
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    with pytest.raises(FileNotFoundError):
        Definitions.copy_of(tmp_path / "none.sqlite", into)
