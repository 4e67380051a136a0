"""Column layout of the "amqp" source, deliveries turned into Arrow record batches, and the
conversions of AMQP values to column values that every Hare source shares.

Headers become ``map<string,string>`` (`header_strings`): a typed map would need one Spark type
for every AMQP field-value type.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
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

if TYPE_CHECKING:
    from broker.spark.consumer import Delivery

__all__ = ["SOURCE_ARROW_SCHEMA", "SOURCE_SCHEMA", "header_strings", "to_record_batch"]

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

# What Spark expects from a Python data source's read(): timestamps in UTC microseconds.
SOURCE_ARROW_SCHEMA = to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")


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


def to_record_batch(deliveries: Sequence[Delivery], queue: str) -> pa.RecordBatch:
    """The deliveries as one Arrow batch in SOURCE_ARROW_SCHEMA, built column by column."""
    props = [d.properties for d in deliveries]
    headers = [header_strings(p.headers) for p in props]
    stamps = [None if p.timestamp is None else p.timestamp * 1_000_000 for p in props]
    fields = SOURCE_ARROW_SCHEMA
    columns = [
        [d.body for d in deliveries],
        [d.exchange for d in deliveries],
        [d.routing_key for d in deliveries],
        [d.delivery_tag for d in deliveries],
        [d.redelivered for d in deliveries],
        [p.message_id for p in props],
        [p.correlation_id for p in props],
        [p.content_type for p in props],
        stamps,
        headers,
        [queue] * len(deliveries),
    ]
    arrays = [pa.array(col, type=field.type) for col, field in zip(columns, fields, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=fields)
