"""oncelog as a PySpark data source (``format("oncelog")``), with the options and the output
schema of Spark's Kafka source, reading read_committed by default.

    import oncelog.spark
    oncelog.spark.register(spark)
    df = (spark.readStream.format("oncelog")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "purchases").load())
"""

from __future__ import annotations

from .source import OncelogDataSource


def register(spark) -> None:
    """Make ``format("oncelog")`` available to ``read``/``readStream`` (and the writers)."""
    spark.dataSource.register(OncelogDataSource)


__all__ = ["OncelogDataSource", "register"]
