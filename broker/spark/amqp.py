"""The "amqp" data source: a queue as a streaming source, an exchange as a sink."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructType

from broker.spark.columns import SOURCE_SCHEMA
from broker.spark.options import SourceOptions

__all__ = ["AmqpDataSource"]


class AmqpDataSource(DataSource):
    """Spark instantiates this on the driver (and pickles it to workers) with the options."""

    @classmethod
    def name(cls) -> str:
        return "amqp"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from broker.spark.source import AmqpStreamReader

        return AmqpStreamReader(SourceOptions.parse(self.options))
