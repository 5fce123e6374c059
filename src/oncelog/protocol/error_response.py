"""An error response for any request: what Kafka's ``AbstractRequest.getErrorResponse`` builds.

When a handler fails unexpectedly, Kafka logs it and answers the request with every error code
set (UNKNOWN_SERVER_ERROR), mirroring the topics and partitions the request named, so that the
client retries or fails that request and keeps its connection. Kafka writes one such method
per API; here one walk of the response schema serves them all: each array of the response is
filled from the request's array of the same name (or its only array at that level), each
scalar copied from the request field of the same name (topic/name and partition/index/
partition_index are the same thing under different names), every error code set, the rest
zero, empty or null.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import uuid
from functools import cache
from types import UnionType
from typing import Any, Union, get_args, get_origin

from kio.schema.errors import ErrorCode
from kio.serial._introspect import EntityField, EntityTupleField, classify_field

_ALIASES = {
    "name": ("name", "topic"),
    "topic": ("topic", "name"),
    "partition_index": ("partition_index", "partition", "index"),
    "partition": ("partition", "partition_index", "index"),
    "index": ("index", "partition_index", "partition"),
}

_ZERO: dict[str, Any] = {
    "bool": False, "int8": 0, "int16": 0, "uint16": 0, "int32": 0, "int64": 0,
    "float64": 0.0, "string": "", "bytes": b"", "records": b"", "uuid": uuid.UUID(int=0),
    "timedelta_i32": _dt.timedelta(0), "timedelta_i64": _dt.timedelta(0),
    "datetime_i64": _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC),
}


def _nullable(field: dataclasses.Field) -> bool:
    return get_origin(field.type) in (UnionType, Union) and type(None) in get_args(field.type)


@cache
def _entity_arrays(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls)
                 if isinstance(classify_field(f), EntityTupleField))


def _source_items(name: str, source: Any) -> tuple:
    if source is None:
        return ()
    value = getattr(source, name, None)
    if isinstance(value, tuple) and (not value or dataclasses.is_dataclass(value[0])):
        return value
    arrays = _entity_arrays(type(source)) if dataclasses.is_dataclass(source) \
        and not isinstance(source, type) else ()
    if len(arrays) == 1:
        return getattr(source, arrays[0]) or ()
    return ()


def _scalar(field: dataclasses.Field, source: Any) -> Any:
    if source is not None:
        for name in _ALIASES.get(field.name, (field.name,)):
            value = getattr(source, name, None)
            if value is not None and not isinstance(value, tuple) \
                    and not dataclasses.is_dataclass(value):
                return value
    if _nullable(field):
        return None
    if field.default is not dataclasses.MISSING:
        return field.default
    return _ZERO[field.metadata["kafka_type"]]


def _mirror(cls: type, source: Any, error: ErrorCode) -> Any:
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        if field.metadata.get("kafka_type") == "error_code":
            values[field.name] = error
        elif isinstance(kind, EntityTupleField):
            values[field.name] = tuple(_mirror(kind.type_, item, error)
                                       for item in _source_items(field.name, source))
        elif isinstance(kind, EntityField):
            values[field.name] = None if _nullable(field) else _mirror(kind.type_, None, error)
        elif get_origin(field.type) is tuple:  # an array of primitives
            values[field.name] = None if _nullable(field) else ()
        else:
            values[field.name] = _scalar(field, source)
    return cls(**values)


def error_response(response_cls: type, request: Any,
                   error: ErrorCode = ErrorCode.unknown_server_error) -> Any:
    """``response_cls`` answering ``request`` with ``error`` everywhere."""
    return _mirror(response_cls, request, error)
