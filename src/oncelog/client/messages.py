"""Build nested kio request objects for whichever version a broker negotiated.

kio has one dataclass per API version, and fields come and go between versions. Callers here
describe a request once, as nested dicts holding the union of the fields they care about.
``protocol.make`` does the per-entity work (keep the fields this version has, milliseconds to
timedeltas, ints to ErrorCode); this module adds the nesting: dicts inside become the
version's nested dataclasses, lists become tuples. A field the version requires but the caller
did not give is a bug on our side; the dataclass constructor raises TypeError for it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

from ..protocol import make, request_class


@cache
def _field_hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _nest(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    tp = _strip_optional(tp)
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        item = args[0] if args else None
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            return tuple(build(item, v) if isinstance(v, Mapping) else v for v in value)
        return tuple(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, Mapping):
        return build(tp, value)
    return value


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance of kio dataclass ``cls`` from nested ``values``; keys ``cls`` lacks are
    ignored (they belong to other versions)."""
    hints = _field_hints(cls)
    return make(cls, **{name: _nest(hints[name], v) for name, v in values.items()
                        if name in hints})


def build_request(api_key: int, version: int, values: Mapping[str, Any]) -> Any:
    return build(request_class(api_key, version), values)
