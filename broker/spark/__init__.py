"""Hare's Spark connector: data sources on Spark 4's Python Data Source API.

Install with ``pip install 'hare-broker[spark]'``. Nothing else in ``broker`` imports this
package (or pyspark): the broker runs without Spark installed. See docs/SPARK.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: SparkSession) -> None:
    """Register Hare's data sources with `spark`: "amqp" (a queue as a streaming source, an
    exchange as a sink), "amqp-stream" (a stream queue read by offset) and "hare-store" (a
    stopped broker's data directory, read offline)."""
    from broker.spark.amqp import AmqpDataSource
    from broker.spark.store_source import HareStoreDataSource
    from broker.spark.stream_source import AmqpStreamDataSource

    spark.dataSource.register(AmqpDataSource)
    spark.dataSource.register(AmqpStreamDataSource)
    spark.dataSource.register(HareStoreDataSource)
