"""What ``oncelog.spark.register(spark)`` does to a session besides registering the data source:
it makes sure the data source's Python workers can import oncelog, and it gives
``df.write.format("oncelog").save()`` the save modes of Spark's Kafka sink.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import warnings

from .write_checks import save_mode_error


class WorkerPythonWarning(UserWarning):
    """Spark's Python workers cannot import oncelog; the data source runs under this driver's
    Python instead."""


def _import_problem(python: str) -> str | None:
    """Why ``python`` cannot import oncelog (None when it can)."""
    try:
        r = subprocess.run([python, "-c", "import oncelog"], capture_output=True, text=True,
                           timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"it cannot be run: {exc}"
    if r.returncode == 0:
        return None
    lines = r.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {r.returncode}"


def workers_python(sc) -> tuple[str, str | None]:
    """The Python Spark starts its workers with (PYSPARK_PYTHON, which spark-submit sets from
    spark.pyspark.python, read when the SparkContext was created: ``sc.pythonExec``), and why it
    cannot import oncelog (None when it can). Only where the workers run on this machine (a
    local master) can this be known without running a job; elsewhere None."""
    python = sc.pythonExec
    if not str(sc.master).startswith("local"):
        return python, None
    same = shutil.which(python) or python
    if os.path.abspath(same) == os.path.abspath(sys.executable):
        return python, None
    return python, _import_problem(python)


def register_data_source(spark, source) -> None:
    """Register ``source``; when the workers' Python cannot import oncelog and they run here,
    run the data source's Python (Spark gives it the interpreter the SparkContext had when it
    was registered) under this driver's instead, and warn: the SparkContext exists, so
    PYSPARK_PYTHON itself cannot change any more."""
    try:
        sc = spark.sparkContext
    except NotImplementedError:  # Spark Connect: no SparkContext here, nothing to check
        spark.dataSource.register(source)
        return
    python, problem = workers_python(sc)
    if problem is None:
        spark.dataSource.register(source)
        return
    if not sys.executable:
        raise RuntimeError(
            f"Spark's Python workers ({python}, from PYSPARK_PYTHON) cannot import oncelog "
            f"({problem}): set PYSPARK_PYTHON to a Python that has oncelog installed before the "
            "SparkSession is created")
    warnings.warn(
        f"Spark's Python workers ({python}, from PYSPARK_PYTHON) cannot import oncelog "
        f"({problem}); the oncelog data source runs under {sys.executable} (this driver's "
        f"Python) instead. Set PYSPARK_PYTHON={sys.executable} before the SparkSession is "
        "created so that the rest of the job's Python (UDFs) runs there too.",
        WorkerPythonWarning, stacklevel=3)
    sc.pythonExec = sys.executable
    try:
        spark.dataSource.register(source)
    finally:
        sc.pythonExec = python


def apply_kafka_save_modes(w) -> None:
    """Spark's Kafka sink takes the default save mode (ErrorIfExists) as Append and refuses
    Overwrite and Ignore. Spark gives a Python data source only Append and Overwrite (the others
    fail with UNSUPPORTED_DATA_SOURCE_SAVE_MODE before any Python runs), so a ``save()`` to
    oncelog turns ErrorIfExists into Append and refuses the others here, with Spark's words."""
    from py4j.protocol import Py4JError

    try:
        source, mode = str(w._jwrite.source()), str(w._jwrite.curmode())
    except Py4JError:  # a Spark whose DataFrameWriter lacks these: leave the mode to Spark
        return
    if source.lower() != "oncelog":
        return
    if mode == "ErrorIfExists":
        w._jwrite = w._jwrite.mode("append")
    elif mode in ("Overwrite", "Ignore"):
        raise save_mode_error(mode)


def install_save_modes() -> None:
    """Make ``DataFrameWriter.save`` apply ``apply_kafka_save_modes`` (once per process; other
    formats are untouched)."""
    from pyspark.sql.readwriter import DataFrameWriter

    if getattr(DataFrameWriter.save, "_oncelog_save_modes", False):
        return
    original = DataFrameWriter.save

    @functools.wraps(original)
    def save(self, path=None, format=None, mode=None, partitionBy=None, **options):
        # As DataFrameWriter.save does, the arguments first: the mode is known only then.
        self.mode(mode)
        if format is not None:
            self.format(format)
        apply_kafka_save_modes(self)
        return original(self, path, None, None, partitionBy, **options)

    save._oncelog_save_modes = True  # type: ignore[attr-defined]
    DataFrameWriter.save = save  # type: ignore[method-assign]
