"""Spark discovers ``pyspark_*`` modules exposing ``DefaultSource``: enables ``.format("ferrymq")``."""

from ferrymq.spark.source import FerryMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
