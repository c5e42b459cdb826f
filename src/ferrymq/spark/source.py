"""The DataSource classes: ``.format("rocketmq")`` and ``.format("ferrymq")`` (same connector)."""

from __future__ import annotations

import os
import sys
from types import FrameType

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ferrymq.errors import ConfigError
from ferrymq.spark.options import parse_sink_options, parse_source_options


def source_schema() -> StructType:
    """The fixed row schema (built by hand: ``StructType.fromDDL`` needs a JVM, workers have none)."""
    return StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("brokerName", StringType()),
            StructField("queueId", IntegerType()),
            StructField("queueOffset", LongType()),
            StructField("tags", StringType()),
            StructField("msgId", StringType()),
            StructField("bornTimestamp", TimestampType()),
            StructField("storeTimestamp", TimestampType()),
            StructField("properties", MapType(StringType(), StringType())),
        ]
    )


#: PySpark's worker that calls ``pushFilters`` (it runs only when spark.sql.python.filterPushdown.enabled=true),
#: by module name or, when started with ``python -m``, by file name.
PUSHDOWN_WORKER_MODULE = "pyspark.sql.worker.data_source_pushdown_filters"
#: Caller frames looked at for it.
CALLER_FRAMES = 4


def _called_from(module: str) -> bool:
    """True when a caller a few frames up lives in ``module``. Used to hand the pushdown-capable reader only
    to PySpark's pushdown step: on any other path (or a PySpark that moved the step) reads work unfiltered."""
    file_name = module.rsplit(".", 1)[-1] + ".py"
    frame: FrameType | None = sys._getframe(2)
    for _ in range(CALLER_FRAMES):
        if frame is None:
            return False
        if frame.f_globals.get("__name__") == module or os.path.basename(frame.f_code.co_filename) == file_name:
            return True
        frame = frame.f_back
    return False


def _check_user_schema(schema: StructType) -> None:
    if schema is not None and [(f.name, f.dataType) for f in schema.fields] != [
        (f.name, f.dataType) for f in source_schema().fields
    ]:
        from ferrymq.spark.arrow import SOURCE_SCHEMA_DDL  # imports pyarrow.compute: only on this error

        raise ConfigError(
            "schema", f"the rocketmq source has a fixed schema ({SOURCE_SCHEMA_DDL}); do not set one"
        )


class RocketMQDataSource(DataSource):
    """Apache RocketMQ 4.x / ferrymq topics as a Spark source and sink. See docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> StructType:
        # Called by load() (never by writes): fail at once on options that are bad for batch *and*
        # streaming; mode-specific checks (endingOffsets, trigger options) follow in (stream)reader().
        try:
            parse_source_options(self.options, streaming=False)
        except ConfigError:
            parse_source_options(self.options, streaming=True)
        return source_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        from ferrymq.spark.reader import RocketMQBatchReader, RocketMQFilteringBatchReader

        _check_user_schema(schema)
        opts = parse_source_options(self.options, streaming=False)
        if _called_from(PUSHDOWN_WORKER_MODULE):
            return RocketMQFilteringBatchReader(opts)
        return RocketMQBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ferrymq.spark.reader import RocketMQStreamReader

        _check_user_schema(schema)
        return RocketMQStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ferrymq.spark.writer import RocketMQBatchWriter, validate_sink_schema

        if overwrite:
            raise ConfigError(
                "mode", "save mode overwrite is not supported by the rocketmq sink; use .mode('append')"
            )
        opts = parse_sink_options(self.options)
        return RocketMQBatchWriter(opts, validate_sink_schema(schema, opts))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from ferrymq.spark.writer import RocketMQStreamWriter, validate_sink_schema

        opts = parse_sink_options(self.options)
        return RocketMQStreamWriter(opts, validate_sink_schema(schema, opts))


class FerryMQDataSource(RocketMQDataSource):
    @classmethod
    def name(cls) -> str:
        return "ferrymq"
