"""register() makes the "amqp" format known to a SparkSession."""

from __future__ import annotations


def test_amqp_source_schema(spark) -> None:
    names = spark.readStream.format("amqp").option("url", "amqp://x/").option(
        "queue", "q").load().schema.fieldNames()
    assert names == ["body", "exchange", "routing_key", "delivery_tag", "redelivered",
                     "message_id", "correlation_id", "content_type", "timestamp", "headers",
                     "queue"]
