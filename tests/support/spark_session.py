"""The one SparkSession a Spark test module shares: local[2], no UI, two shuffle partitions,
its Python workers on this interpreter, the oncelog data source registered. Used by the
module-scoped ``spark`` fixtures of tests/test_spark_*.py (each imports pyspark first, or
skips)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def local_spark(**conf: str) -> Iterator:
    """A SparkSession with ``conf`` (Spark settings) on top of the tests' own; stopped at the
    end."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import oncelog.spark

    builder = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    s = builder.getOrCreate()
    oncelog.spark.register(s)
    try:
        yield s
    finally:
        s.stop()
