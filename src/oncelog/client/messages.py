"""Build kio request objects for whichever version a broker negotiated, from plain values.

kio has one dataclass per API version, and fields come and go between versions. Callers here
describe a request once, as nested dicts holding the union of the fields they care about; this
module picks the fields the chosen version has, fills nested dataclasses, turns millisecond
ints into timedeltas, and lets kio's defaults cover the rest. A field the version requires but
the caller did not give is a bug on our side, so it raises.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from functools import lru_cache
from typing import Any, Mapping

from ..protocol import request_class


@lru_cache(maxsize=None)
def _fields(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        has_default = (f.default is not dataclasses.MISSING
                       or f.default_factory is not dataclasses.MISSING)
        out.append((f.name, hints[f.name], has_default))
    return tuple(out)


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    tp = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if origin is tuple:
        args = typing.get_args(tp)
        item = args[0] if args else Any
        if dataclasses.is_dataclass(item):
            return tuple(build(item, v) if isinstance(v, Mapping) else v for v in value)
        return tuple(value)
    if dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        return build(tp, value)
    if isinstance(tp, type) and issubclass(tp, datetime.timedelta) and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    return value


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance of kio dataclass ``cls`` from ``values``; keys ``cls`` lacks are ignored."""
    kwargs = {}
    for name, tp, has_default in _fields(cls):
        if name in values:
            kwargs[name] = _convert(tp, values[name])
        elif not has_default:
            raise TypeError(f"{cls.__qualname__} v{cls.__version__} needs field {name!r}")
    return cls(**kwargs)


def build_request(api_key: int, version: int, values: Mapping[str, Any]) -> Any:
    return build(request_class(api_key, version), values)


def ms(value: datetime.timedelta | int | None) -> int:
    """kio hands durations back as timedeltas; we think in milliseconds."""
    if value is None:
        return 0
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)
