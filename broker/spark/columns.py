"""Column layout of the "amqp" source, and the conversions of AMQP values to column values that
every Hare source shares."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = ["SOURCE_SCHEMA", "header_strings"]

SOURCE_SCHEMA = StructType([
    StructField("body", BinaryType(), False),
    StructField("exchange", StringType(), False),
    StructField("routing_key", StringType(), False),
    StructField("delivery_tag", LongType(), False),
    StructField("redelivered", BooleanType(), False),
    StructField("message_id", StringType(), True),
    StructField("correlation_id", StringType(), True),
    StructField("content_type", StringType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("headers", MapType(StringType(), StringType(), True), True),
    StructField("queue", StringType(), False),
])


def header_strings(headers: Mapping[str, Any] | None) -> list[tuple[str, str | None]] | None:
    """An AMQP field table as the entries of a map<string,string> column: str as is, bool as
    true/false, numbers as str(), bytes as UTF-8 (undecodable bytes replaced), timestamps in
    ISO 8601, nested tables and arrays as JSON (same rules inside), void as null."""
    if headers is None:
        return None
    return [(key, None if v is None else _text(v)) for key, v in headers.items()]


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Mapping | list | tuple):
        return json.dumps(_plain(v), ensure_ascii=False, separators=(",", ":"))
    return str(_plain(v))


def _plain(v: Any) -> Any:
    """A field-table value as something json.dumps takes, by the same rules."""
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, dt.datetime):
        return v.isoformat()
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v
