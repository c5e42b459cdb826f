"""PySpark data source and sink for ferrymq / Apache RocketMQ 4.x topics (extra ``ferrymq[spark]``).

After ``pip install 'ferrymq[spark]'`` the formats ``rocketmq`` and ``ferrymq`` are found by Spark's
``pyspark_*`` module discovery; ``register(spark)`` is only needed when the package is not installed in
the workers' interpreter. See docs/spark.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FerryMQDataSource", "RocketMQDataSource", "register"]


def register(spark: Any) -> None:
    """Register both formats on a SparkSession explicitly."""
    from ferrymq.spark.source import FerryMQDataSource, RocketMQDataSource

    spark.dataSource.register(RocketMQDataSource)
    spark.dataSource.register(FerryMQDataSource)


def __getattr__(name: str) -> Any:
    if name in ("RocketMQDataSource", "FerryMQDataSource"):
        from ferrymq.spark import source

        return getattr(source, name)
    raise AttributeError(name)
