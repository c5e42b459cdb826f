"""Spark discovers ``pyspark_*`` modules exposing ``DefaultSource``: enables ``.format("rocketmq")``."""

from ferrymq.spark.source import RocketMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
