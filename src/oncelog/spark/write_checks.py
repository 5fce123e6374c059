"""What the ``oncelog`` sink refuses before any task runs, with the words of Spark's Kafka sink
(``KafkaWriter.validateQuery`` and ``KafkaSourceProvider.createRelation``), so that a job moved
from ``format("kafka")`` meets the same errors.

Spark hands a Python data source the DataFrame's schema in ``DataSource.writer(schema,
overwrite)`` (``streamWriter`` for streams), on the driver, before it starts the write's tasks:
raising there fails ``save()`` (or the query) with nothing written and no transaction opened.
"""

from __future__ import annotations

from pyspark.errors import AnalysisException

HEADERS_TYPE = "array<struct<key:string,value:binary>>"

# Spark's Kafka sink: each column it reads and the types it takes (catalog strings, which
# carry no nullability, as Spark compares them).
_COLUMN_TYPES = {
    "topic": ("string",),
    "key": ("string", "binary"),
    "value": ("string", "binary"),
    "headers": (HEADERS_TYPE,),
    "partition": ("int",),
}


def validate_query(schema, topic: str | None) -> None:
    """Refuse a DataFrame the sink cannot write: no ``value`` column, no ``topic`` column and no
    topic option, or a column of a type Spark's Kafka sink does not take. With the topic option,
    the ``topic`` column is not read at all (the option wins), so its type does not matter."""
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    if topic is None and "topic" not in types:
        raise AnalysisException("topic option required when no 'topic' attribute is present. "
                                "Use the topic option for setting a topic.")
    if "value" not in types:
        raise AnalysisException("Required attribute 'value' not found")
    for name, desired in _COLUMN_TYPES.items():
        if name == "topic" and topic is not None:
            continue
        if name in types and types[name] not in desired:
            raise AnalysisException(
                f"{name} attribute unsupported type {types[name]}. {name} must be a(n) "
                + " or ".join(desired))


def save_mode_error(mode: str) -> AnalysisException:
    """Spark's Kafka sink takes Append and ErrorIfExists (its default: a topic is not a table
    that either exists or not, so both append); Overwrite and Ignore are refused."""
    return AnalysisException(f"Save mode {mode} not allowed for oncelog. Allowed save modes are "
                             "Append and ErrorIfExists (default).")


# Spark's Kafka writer's words for a row whose topic column is null, without a topic option
NULL_TOPIC = ("null topic present in the data. Use the topic option for setting a default "
              "topic.")
