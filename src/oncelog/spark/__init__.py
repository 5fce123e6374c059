"""oncelog as a PySpark data source (``format("oncelog")``), with the options and the output
schema of Spark's Kafka source, reading read_committed by default.

    import oncelog.spark
    oncelog.spark.register(spark)
    df = (spark.readStream.format("oncelog")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "purchases").load())
"""

from __future__ import annotations

from .session import WorkerPythonWarning, install_save_modes, register_data_source
from .source import OncelogDataSource


def register(spark) -> None:
    """Make ``format("oncelog")`` available to ``read``/``readStream`` and the writers.

    Also: checks that Spark's Python workers can import oncelog (with a local master; when they
    cannot, the data source runs under this driver's Python and a ``WorkerPythonWarning`` says
    to set PYSPARK_PYTHON), and gives ``df.write.format("oncelog").save()`` the save modes of
    Spark's Kafka sink (the default, ErrorIfExists, appends; Overwrite and Ignore are refused).
    """
    register_data_source(spark, OncelogDataSource)
    install_save_modes()


__all__ = ["OncelogDataSource", "WorkerPythonWarning", "register"]
