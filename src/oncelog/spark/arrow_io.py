"""The connector's data path in Arrow: Spark hands the sink's tasks ``pyarrow.RecordBatch``es
(``DataSourceArrowWriter``) and takes ``RecordBatch``es from the reader's, so no row becomes a
Python object on either side. Records go to and from the log through our client's bulk calls
(``Producer.send_batch``, ``Consumer.poll_columns``), which encode and decode whole columns in C.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .write_checks import NULL_TOPIC


class RowError(RuntimeError):
    """A row the sink cannot write (no topic, a value of the wrong kind)."""


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i)


def _headers(column: pa.Array | None) -> list | None:
    """Spark's ``headers`` column (array<struct<key: string, value: binary>>) as our client's
    per-row header lists; None when no row has any."""
    if column is None or column.null_count == len(column):
        return None
    rows = column.to_pylist()
    if not any(rows):
        return None
    return [[(h["key"], h["value"]) for h in row] if row else [] for row in rows]


def send_record_batch(producer: Any, batch: pa.RecordBatch, topic_option: str | None
                      ) -> list[tuple[str, Any, Future]]:
    """Queue every row of ``batch`` with ``producer`` (in its transaction): the ``topic``
    option names the topic of every row when given (Spark's rule: it wins over a ``topic``
    column), else each row's ``topic``; ``partition`` (when given and not null) picks the
    partition, else the key does (Kafka's default partitioner). Returns (topic, partition
    spec, future) per bulk send, each future failing if any of its records cannot be
    written."""
    if batch.num_rows == 0:
        return []
    value = _column(batch, "value")
    if value is None:
        raise RowError("the data has no value column")
    if topic_option:
        groups: list[tuple[str, pa.RecordBatch]] = [(topic_option, batch)]
    else:
        topics = _column(batch, "topic")
        if topics is None or topics.null_count:
            raise RowError(NULL_TOPIC)
        distinct = pc.unique(topics)
        if len(distinct) == 1:
            groups = [(distinct[0].as_py(), batch)]
        else:
            groups = [(t.as_py(), batch.filter(pc.equal(topics, t))) for t in distinct]
    sent: list[tuple[str, Any, Future]] = []
    for topic, rows in groups:
        partition = _column(rows, "partition")
        if partition is None or partition.null_count == len(partition):
            parts: list[tuple[Any, pa.RecordBatch]] = [(None, rows)]
        elif partition.null_count == 0:
            parts = [(partition, rows)]
        else:  # some rows name their partition, the others are placed by their key
            given = pc.is_valid(partition)
            named = rows.filter(given)
            parts = [(_column(named, "partition"), named),
                     (None, rows.filter(pc.invert(given)))]
        for spec, part_rows in parts:
            future = producer.send_batch(
                topic, _column(part_rows, "value"), _column(part_rows, "key"), partition=spec,
                headers=_headers(_column(part_rows, "headers")))
            where = None if spec is None else pc.unique(spec).to_pylist()
            sent.append((topic, where[0] if where and len(where) == 1 else where, future))
    return sent


def spark_schema(include_headers: bool):
    """Spark's Kafka source's columns, as a StructType (``includeHeaders``: with headers)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [StructField("key", BinaryType()), StructField("value", BinaryType()),
              StructField("topic", StringType()), StructField("partition", IntegerType()),
              StructField("offset", LongType()), StructField("timestamp", TimestampType()),
              StructField("timestampType", IntegerType())]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType(
            [StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark expects of the reader's batches (it checks it)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema(include_headers), timezone="UTC")


_UTC_US = pa.timestamp("us", tz="UTC")


def spark_batch(schema: pa.Schema, topic: str, partition: int, columns: dict, end: int
                ) -> pa.RecordBatch | None:
    """One partition's decoded records (``RecordColumns.to_arrow()``) as a batch of Spark's
    Kafka rows, without the records at or past ``end`` (the consumer fetches ahead)."""
    offsets = columns["offset"]
    n = len(offsets)
    cut = int(np.searchsorted(offsets.to_numpy(zero_copy_only=False), end))
    if cut == 0:
        return None
    names = ("key", "value", "offset", "timestamp", "timestamp_type", "headers")
    cols = {k: columns[k] for k in names if k in columns}
    if cut < n:
        cols = {k: v.slice(0, cut) for k, v in cols.items()}
    if "timestamp_type" in cols:
        ts_type = cols["timestamp_type"].cast(pa.int32())
    else:
        ts_type = pa.repeat(pa.scalar(int(columns.get("timestamp_types", 0)), pa.int32()), cut)
    arrays = [cols["key"], cols["value"], pa.repeat(pa.scalar(topic, pa.string()), cut),
              pa.repeat(pa.scalar(partition, pa.int32()), cut), cols["offset"],
              pc.multiply(cols["timestamp"], 1000).cast(_UTC_US), ts_type]
    if len(schema) > 7:
        arrays.append(cols["headers"].cast(schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
