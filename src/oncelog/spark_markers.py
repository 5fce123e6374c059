"""The topic the Spark sink (``oncelog.spark.sink``) keeps its bookkeeping under, named here so
that the broker and the CLI know it without importing pyspark.

The sink records "micro-batch B of Spark partition P is written" as the committed offset
``B + 1`` of a consumer group of its own for partition 0 of this topic, in the same
transaction as the rows (``send_offsets_to_transaction``). Nothing is ever produced to the
topic: its log end offset stays 0, so those offsets are batch ids, not positions in a log, and
a lag computed from them would be negative. The broker marks the topic internal (Metadata's
``is_internal``, as Kafka marks ``__consumer_offsets``): listings leave it out unless asked
for internal topics, and lag views leave its offsets out.
"""

from __future__ import annotations

MARKER_TOPIC = "__oncelog_spark_batches"


def is_marker_offset(topic: str) -> bool:
    """Is an offset committed for ``topic`` a Spark sink marker (not a position)?"""
    return topic == MARKER_TOPIC
