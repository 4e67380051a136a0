"""The "amqp" data source: a queue as a streaming source, an exchange as a sink."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.types import StructType

from broker.spark.columns import SOURCE_SCHEMA
from broker.spark.options import SinkOptions, SourceOptions
from broker.spark.sink import AmqpBatchWriter, AmqpStreamWriter, check_sink_schema
from broker.spark.source import AmqpStreamReader

__all__ = ["AmqpDataSource"]


class AmqpDataSource(DataSource):
    """Spark makes one per read or write, with the options, and pickles it to its workers."""

    @classmethod
    def name(cls) -> str:
        return "amqp"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        return AmqpStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        check_sink_schema(schema)
        return AmqpBatchWriter(SinkOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        check_sink_schema(schema)
        return AmqpStreamWriter(SinkOptions.parse(self.options))
