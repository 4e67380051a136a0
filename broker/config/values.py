"""Value types of the settings and the parsers that turn raw values into them.

Each parser takes the raw value and `from_text`: False for a TOML value (already typed: int,
float, str, list, table), True for an environment variable or a flag (always a string). It
returns the typed value or raises ValueError with a message that names the problem but never
echoes a secret; the loader prefixes the key and its source.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from broker.config.passwords import hash_password, is_password_hash
from broker.config.sizes import parse_size

__all__ = [
    "AUTH_MECHANISMS",
    "AuthHttpMethod",
    "CertLoginFrom",
    "Fsync",
    "LogFormat",
    "MemoryWatermark",
    "Parser",
    "PermissionSpec",
    "ShovelSpec",
    "SslVerify",
    "TlsVersion",
    "Unroutable",
    "UserSpec",
]

Parser = Callable[[object, bool], Any]


class Fsync(StrEnum):
    """When the message store calls fsync."""

    ALWAYS = "always"  # before every confirm / tx.commit-ok
    BATCH = "batch"  # once per write batch, before the batch's confirms go out
    NEVER = "never"  # leave it to the OS (tests, throwaway brokers)


class LogFormat(StrEnum):
    CONSOLE = "console"
    JSON = "json"
    AUTO = "auto"  # console when stderr is a terminal, JSON lines otherwise


class AuthHttpMethod(StrEnum):
    """How the HTTP auth backend sends its questions (rabbitmq_auth_backend_http)."""

    GET = "get"  # a query string (RabbitMQ's default)
    POST = "post"  # a form body: the password stays out of access logs


class Unroutable(StrEnum):
    """What a confirm channel gets for a non-mandatory message that routed nowhere."""

    ACK = "ack"  # RabbitMQ's behaviour
    NACK = "nack"  # Hare's stricter option


class SslVerify(StrEnum):
    """ssl_options.verify: whether a listener asks for and checks a client certificate."""

    VERIFY_NONE = "verify_none"
    VERIFY_PEER = "verify_peer"


class TlsVersion(StrEnum):
    """The oldest TLS version a listener accepts (RabbitMQ's names for them)."""

    TLS1_2 = "tlsv1.2"
    TLS1_3 = "tlsv1.3"


class CertLoginFrom(StrEnum):
    """ssl_cert_login_from: which part of a client certificate EXTERNAL takes as user name."""

    COMMON_NAME = "common_name"
    DISTINGUISHED_NAME = "distinguished_name"  # RFC 4514, e.g. "CN=alice,O=Example"


# The SASL mechanisms the broker knows; auth_mechanisms picks the ones offered.
AUTH_MECHANISMS = ("PLAIN", "AMQPLAIN", "EXTERNAL")


@dataclass(frozen=True)
class MemoryWatermark:
    """vm_memory_high_watermark: a fraction of total memory or an absolute byte count."""

    relative: float | None = 0.4
    absolute_bytes: int | None = None

    def limit_bytes(self, total_memory_bytes: int) -> int:
        """The memory use (bytes) at which the memory alarm goes off."""
        if self.absolute_bytes is not None:
            return self.absolute_bytes
        return int(total_memory_bytes * (self.relative or 0.0))

    def __str__(self) -> str:
        if self.absolute_bytes is not None:
            return str(self.absolute_bytes)
        return str(self.relative)


@dataclass(frozen=True)
class UserSpec:
    """A user declared in the config file; the password is already hashed."""

    name: str
    password_hash: str = field(repr=False)
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class PermissionSpec:
    """Regular expressions on resource names, as in `rabbitmqctl set_permissions`."""

    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True)
class ShovelSpec:
    """A static shovel from the config file: its name and the dynamic shovel's keys
    (`src-uri`, `src-queue`, ...), checked by the shovel plugin when the server starts."""

    name: str
    value: dict[str, Any] = field(compare=True, hash=False)

    def shown(self) -> dict[str, object]:
        """For the start-up log line: the URIs' passwords left out."""
        return {"name": self.name,
                "value": {k: _no_password(v) if k.endswith("-uri") else v
                          for k, v in self.value.items()}}


def _no_password(uris: object) -> object:
    if isinstance(uris, list):
        return [_no_password(u) for u in uris]
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", uris) if isinstance(uris, str) else uris


# ---- scalar parsers -------------------------------------------------------------------------


def _type_name(value: object) -> str:
    return type(value).__name__


def int_value(lo: int, hi: int | None = None) -> Parser:
    def parse(value: object, from_text: bool) -> int:
        if from_text and isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise ValueError(f"expected an integer, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {_type_name(value)} {value!r}")
        if value < lo or (hi is not None and value > hi):
            bounds = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise ValueError(f"must be {bounds}, got {value}")
        return value

    return parse


def workers_value(value: object, from_text: bool) -> int:
    """`auto` (stored as 0: the cores this process may use, resolved at start) or a count."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return 0
    try:
        return int_value(1, 1024)(value, from_text)
    except ValueError as exc:
        raise ValueError(f"expected auto or {exc.args[0].removeprefix('expected ')}") from None


def locator_value(value: object, from_text: bool) -> str:
    """RabbitMQ's queue_master_locator values Hare places by (random: not offered), and
    Hare's auto."""
    text = string_value(value, from_text)
    if text not in ("auto", "client-local", "balanced", "min-masters"):
        raise ValueError(f"expected auto, client-local, balanced or min-masters, got {text!r}")
    return text


def _to_float(value: object, from_text: bool) -> float:
    if from_text and isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {_type_name(value)} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return float(value)


def float_value(lo: float, hi: float | None = None, *, lo_open: bool = False) -> Parser:
    def parse(value: object, from_text: bool) -> float:
        number = _to_float(value, from_text)
        too_low = number <= lo if lo_open else number < lo
        if too_low or (hi is not None and number > hi):
            low = f"more than {lo}" if lo_open else f"at least {lo}"
            bounds = f"{low} and at most {hi}" if hi is not None else low
            raise ValueError(f"must be {bounds}, got {number}")
        return number

    return parse


def size_value(lo: int = 0, hi: int | None = None) -> Parser:
    def parse(value: object, from_text: bool) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"expected a size like 256MiB, got {_type_name(value)}")
        size = parse_size(value)
        if size < lo:
            raise ValueError(f"must be at least {lo} bytes, got {size}")
        if hi is not None and size > hi:
            raise ValueError(f"must be at most {hi} bytes, got {size}")
        return size

    return parse


def choice_value(enum: type[StrEnum]) -> Parser:
    def parse(value: object, from_text: bool) -> StrEnum:
        allowed = ", ".join(repr(member.value) for member in enum)
        if not isinstance(value, str):
            raise ValueError(f"expected one of {allowed}, got {_type_name(value)}")
        try:
            return enum(value.strip().lower())
        except ValueError:
            raise ValueError(f"expected one of {allowed}, got {value!r}") from None

    return parse


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def log_level_value(value: object, from_text: bool) -> str:
    level = value.strip().lower() if isinstance(value, str) else None
    level = "warning" if level == "warn" else level
    if level not in _LOG_LEVELS:
        allowed = ", ".join(repr(name) for name in _LOG_LEVELS)
        shown = repr(value) if isinstance(value, str) else _type_name(value)
        raise ValueError(f"expected one of {allowed}, got {shown}")
    return level


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def bool_value(value: object, from_text: bool) -> bool:
    if from_text and isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ValueError(f"expected true or false, got {value!r}")
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {_type_name(value)} {value!r}")
    return value


def string_value(value: object, from_text: bool) -> str:
    # The value is never echoed: this parser also reads passwords.
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_type_name(value)}")
    return value


def nonempty_string_value(value: object, from_text: bool) -> str:
    text = string_value(value, from_text)
    if not text:
        raise ValueError("must not be empty")
    return text


def path_value(value: object, from_text: bool) -> Path:
    return Path(nonempty_string_value(value, from_text)).expanduser()


def optional_path_value(value: object, from_text: bool) -> Path | None:
    """A path, or None for the empty string (how an environment variable or flag unsets it)."""
    text = string_value(value, from_text)
    return Path(text).expanduser() if text else None


def _string_list(value: object, from_text: bool) -> tuple[str, ...]:
    if from_text and isinstance(value, str):
        # Comma-separated in env and flags; "" is the empty list.
        return tuple(item.strip() for item in value.split(",") if item.strip())
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"expected a list of strings, got {_type_name(value)}")
    return tuple(value)


def string_list_value(value: object, from_text: bool) -> tuple[str, ...]:
    items = _string_list(value, from_text)
    duplicates = sorted({item for item in items if items.count(item) > 1})
    if duplicates:
        raise ValueError(f"duplicate entries {duplicates}")
    return items


def mechanisms_value(value: object, from_text: bool) -> tuple[str, ...]:
    items = string_list_value(value, from_text)
    names = tuple(item.upper() for item in items)
    unknown = [item for item, name in zip(items, names, strict=True) if name not in AUTH_MECHANISMS]
    if unknown:
        raise ValueError(f"unknown mechanism {unknown[0]!r} (known: {', '.join(AUTH_MECHANISMS)})")
    if not names:
        raise ValueError("must name at least one mechanism")
    return names


AUTH_BACKENDS = ("internal", "http")


def auth_backends_value(value: object, from_text: bool) -> tuple[str, ...]:
    items = string_list_value(value, from_text)
    if not items:
        raise ValueError("at least one backend is needed")
    unknown = [item for item in items if item not in AUTH_BACKENDS]
    if unknown:
        allowed = ", ".join(repr(name) for name in AUTH_BACKENDS)
        raise ValueError(f"expected backends among {allowed}, got {unknown[0]!r}")
    return items


def url_value(value: object, from_text: bool) -> str:
    text = string_value(value, from_text).strip()
    if text and not text.startswith(("http://", "https://")):
        raise ValueError(f"expected an http:// or https:// URL, got {text!r}")
    return text


def watermark_value(value: object, from_text: bool) -> MemoryWatermark:
    """A number in [0, 1] is a fraction of total memory; a size ("1GiB", 1073741824) is bytes."""
    problem = f"expected a fraction in [0, 1] or a size like 256MiB, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(problem)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d*\.\d+|\d+\.?", text):
            value = float(text) if "." in text else int(text)
        else:
            try:
                return MemoryWatermark(relative=None, absolute_bytes=parse_size(text))
            except ValueError:
                raise ValueError(problem) from None
    if isinstance(value, float) and not (0.0 <= value <= 1.0):
        raise ValueError(problem)
    if isinstance(value, int) and value > 1:
        return MemoryWatermark(relative=None, absolute_bytes=value)
    if value < 0:
        raise ValueError(problem)
    return MemoryWatermark(relative=float(value))


# ---- file-only tables -----------------------------------------------------------------------


def _table(value: object, index: int, allowed: set[str], required: set[str]) -> dict[str, Any]:
    where = f"entry {index + 1}"
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a table, got {_type_name(value)}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ValueError(
            f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))}; "
            "top-level keys must come before the first [[...]] table)"
        )
    missing = sorted(required - set(value))
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r}")
    for key, item in value.items():
        if key != "tags" and not isinstance(item, str):
            raise ValueError(f"{where}: {key}: expected a string, got {_type_name(item)}")
    return value


def _table_list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ValueError(f"expected an array of tables ([[...]]), got {_type_name(value)}")
    return value


def users_value(value: object, from_text: bool) -> tuple[UserSpec, ...]:
    users: list[UserSpec] = []
    for index, raw in enumerate(_table_list(value)):
        entry = _table(raw, index, {"name", "password", "password_hash", "tags"}, {"name"})
        where = f"entry {index + 1} (user {entry['name']!r})"
        if ("password" in entry) == ("password_hash" in entry):
            raise ValueError(f"{where}: give exactly one of 'password' or 'password_hash'")
        if "password" in entry:
            stored = hash_password(entry["password"])
        elif is_password_hash(entry["password_hash"]):
            stored = entry["password_hash"]
        else:
            raise ValueError(
                f"{where}: password_hash is not base64(4-byte salt + sha256), "
                "the rabbit_password_hashing_sha256 format"
            )
        try:
            tags = _string_list(entry.get("tags", []), from_text=False)
        except ValueError as exc:
            raise ValueError(f"{where}: tags: {exc}") from None
        if any(user.name == entry["name"] for user in users):
            raise ValueError(f"{where}: user declared twice")
        users.append(UserSpec(name=entry["name"], password_hash=stored, tags=tags))
    return tuple(users)


def permissions_value(value: object, from_text: bool) -> tuple[PermissionSpec, ...]:
    keys = {"user", "vhost", "configure", "write", "read"}
    permissions: list[PermissionSpec] = []
    for index, raw in enumerate(_table_list(value)):
        entry = _table(raw, index, keys, keys)
        for kind in ("configure", "write", "read"):
            try:
                re.compile(entry[kind])
            except re.error as exc:
                raise ValueError(
                    f"entry {index + 1}: {kind}: not a regular expression ({exc})"
                ) from None
        spec = PermissionSpec(**entry)
        if any((p.user, p.vhost) == (spec.user, spec.vhost) for p in permissions):
            raise ValueError(
                f"entry {index + 1}: user {spec.user!r} on vhost {spec.vhost!r} given twice"
            )
        permissions.append(spec)
    return tuple(permissions)


def shovels_value(value: object, from_text: bool) -> tuple[ShovelSpec, ...]:
    """[[shovels]] tables: a `name` and the dynamic shovel's keys. Only the shape is checked
    here; the keys are the shovel plugin's to judge (broker/shovel/definition.py), which
    hare-server does before anything starts."""
    shovels: list[ShovelSpec] = []
    for index, raw in enumerate(_table_list(value)):
        if not isinstance(raw, dict):
            raise ValueError(f"entry {index + 1}: expected a table, got {_type_name(raw)}")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"entry {index + 1}: missing key 'name' (a non-empty string)")
        if any(shovel.name == name for shovel in shovels):
            raise ValueError(f"entry {index + 1}: shovel {name!r} declared twice")
        shovels.append(ShovelSpec(name, {k: v for k, v in raw.items() if k != "name"}))
    return tuple(shovels)
