"""Column layout of the "amqp" source."""

from __future__ import annotations

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

__all__ = ["SOURCE_SCHEMA"]

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
