"""Every length in a request or response body checked against the bytes that are there, before
kio's native reader sizes anything.

kio 0.6.5 (the newest release) decodes bodies in Rust and reserves memory for the count an
array or string claims before it reads the elements: a compact array length of 2^32 in a
23-byte Metadata request made it ask for 34 GB and abort the process (issue 16). Fixing the
decoder is not ours to do, so this module walks the body first, with the same layout kio reads
(``kio.serial._introspect`` classifies the fields the same way), and refuses with ProtocolError
any array whose count times its smallest possible element exceeds the bytes left, any string,
bytes or record set longer than the bytes left, any tagged field past the end, and varints
longer than five bytes. What passes holds at most one element per byte left, so kio then
allocates at most a small multiple of the frame's own size.

One checker is compiled per kio entity class (a closure per field, fixed-size runs merged),
so a Produce request costs a handful of Python calls per partition.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from functools import cache
from types import UnionType
from typing import Any, Union, get_args, get_origin

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
)

from .. import primitives
from ..primitives import DecodeError


class BoundsError(ValueError):
    """A body whose lengths do not fit the bytes it has."""


# (buf, pos, end) -> new pos
Step = Callable[[Any, int, int], int]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# Wire size of each fixed-size kafka_type.
_FIXED = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4,
    "timedelta_i32": 4, "int64": 8, "timedelta_i64": 8, "datetime_i64": 8, "float64": 8,
    "uuid": 16,
}
_MAX_LENGTH = 0x7FFFFFFF  # Kafka reads lengths into a Java int


def read_uvarint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint of at most five bytes (Kafka's 32-bit varints) before ``end``."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:  # one byte: most counts, lengths and tags
            return b, pos + 1
    try:
        value, after = primitives.read_uvarint(buf, pos)
    except DecodeError as exc:
        raise BoundsError(str(exc)) from None
    if after > end:
        raise BoundsError("truncated varint")
    return value, after


def _fixed(n: int) -> Step:
    def step(buf: Any, pos: int, end: int) -> int:
        pos += n
        if pos > end:
            raise BoundsError("truncated body")
        return pos
    return step


def _compact_length(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """A compact (flexible) length: -1 for null, else the length."""
    n, pos = read_uvarint(buf, pos, end)
    if n > _MAX_LENGTH:
        raise BoundsError(f"length {n - 1} out of range")
    return n - 1, pos


def _blob(flexible: bool, width: int, nullable: bool) -> Step:
    """A string or bytes: compact (uvarint length + 1) or classic (int16 or int32 length);
    -1 (null) only where the schema allows it, as Kafka's generated readers check."""
    unpack = (_I16 if width == 2 else _I32).unpack_from

    def step(buf: Any, pos: int, end: int) -> int:
        if flexible:
            n, pos = _compact_length(buf, pos, end)
        else:
            if pos + width > end:
                raise BoundsError("truncated length")
            (n,) = unpack(buf, pos)
            pos += width
        if n > 0:
            pos += n
            if pos > end:
                raise BoundsError(f"a field of {n} bytes past the end")
        elif n < 0 and (n < -1 or not nullable):
            raise BoundsError(f"length {n} of a non-nullable field" if n == -1
                              else f"length {n}")
        return pos

    return step


def _array(flexible: bool, element: Step, element_min: int, fixed: int | None,
           nullable: bool) -> Step:
    """An array of ``element``s; ``fixed`` is the element's size when every element has one."""
    least = max(element_min, 1)

    def step(buf: Any, pos: int, end: int) -> int:
        if flexible:
            n, pos = _compact_length(buf, pos, end)
        else:
            if pos + 4 > end:
                raise BoundsError("truncated array length")
            (n,) = _I32.unpack_from(buf, pos)
            pos += 4
        if n <= 0:
            if n < -1 or (n == -1 and not nullable):
                raise BoundsError(f"array length {n}" if n < -1 else "a null non-nullable array")
            return pos
        if n * least > end - pos:
            raise BoundsError(f"an array of {n} elements in {end - pos} bytes")
        if fixed is not None:
            return pos + n * fixed
        for _ in range(n):
            pos = element(buf, pos, end)
        return pos

    return step


def _primitive(kafka_type: str, flexible: bool, nullable: bool
               ) -> tuple[Step, int, int | None]:
    """(step, smallest size, fixed size or None) of one primitive value."""
    size = _FIXED.get(kafka_type)
    if size is not None:
        return _fixed(size), size, size
    if kafka_type == "string":
        return _blob(flexible, 2, nullable), 1 if flexible else 2, None
    if kafka_type in ("bytes", "records"):
        return _blob(flexible, 4, nullable), 1 if flexible else 4, None
    raise TypeError(f"no bounds check for kafka_type {kafka_type!r}")


def _nullable_struct(struct_step: Step) -> Step:
    def step(buf: Any, pos: int, end: int) -> int:
        if pos >= end:
            raise BoundsError("truncated body")
        marker = buf[pos]
        pos += 1
        return pos if marker >= 0x80 else struct_step(buf, pos, end)
    return step


def _field(field: dataclasses.Field, flexible: bool) -> tuple[Step, int, int | None]:
    kind = classify_field(field)
    # kio types a nullable field (or array) as ``X | None``; a tuple of optional elements
    # does not occur in Kafka's schemas.
    nullable = get_origin(field.type) in (UnionType, Union) and type(None) in get_args(field.type)
    if isinstance(kind, EntityField):
        checker = entity_checker(kind.type_)
        if nullable:  # a nullable struct: an int8 marker first, negative for null (KIP-966)
            return _nullable_struct(checker.step), 1, None
        return checker.step, checker.min_size, None
    if isinstance(kind, EntityTupleField):
        checker = entity_checker(kind.type_)
        return (_array(flexible, checker.step, checker.min_size, None, nullable),
                1 if flexible else 4, None)
    kafka_type = field.metadata["kafka_type"]
    step, least, fixed = _primitive(kafka_type, flexible, nullable)
    if isinstance(kind, PrimitiveTupleField):
        return _array(flexible, step, least, fixed, nullable), 1 if flexible else 4, None
    assert isinstance(kind, PrimitiveField)
    return step, least, fixed


class _EntityChecker:
    __slots__ = ("min_size", "step")

    def __init__(self, step: Step, min_size: int) -> None:
        self.step = step
        self.min_size = min_size


@cache
def entity_checker(cls: type) -> _EntityChecker:
    """The compiled checker of one kio entity class (request, response or nested)."""
    flexible = bool(cls.__flexible__)  # type: ignore[attr-defined]  # every kio entity has it
    steps: list[Step] = []
    tagged: dict[int, Step] = {}
    min_size = 0
    run = 0  # bytes of consecutive fixed-size fields, checked as one

    for f in dataclasses.fields(cls):
        step, least, fixed = _field(f, flexible)
        tag = f.metadata.get("tag")
        if tag is not None:
            tagged[int(tag)] = step
            continue
        min_size += least
        if fixed is not None:
            run += fixed
            continue
        if run:
            steps.append(_fixed(run))
            run = 0
        steps.append(step)
    if run:
        steps.append(_fixed(run))
    if flexible:
        min_size += 1  # the tagged-field count

    def tagged_fields(buf: Any, pos: int, end: int) -> int:
        count, pos = read_uvarint(buf, pos, end)
        if count * 2 > end - pos:
            raise BoundsError(f"{count} tagged fields in {end - pos} bytes")
        for _ in range(count):
            tag, pos = read_uvarint(buf, pos, end)
            size, pos = read_uvarint(buf, pos, end)
            stop = pos + size
            if stop > end:
                raise BoundsError(f"tagged field {tag} of {size} bytes past the end")
            known = tagged.get(tag)
            if known is not None and known(buf, pos, stop) > stop:
                raise BoundsError(f"tagged field {tag} overruns its size")
            pos = stop
        return pos

    all_steps = (*steps, tagged_fields) if flexible else tuple(steps)

    def check(buf: Any, pos: int, end: int) -> int:
        for s in all_steps:
            pos = s(buf, pos, end)
        return pos

    return _EntityChecker(check, min_size)


def check_body(cls: type, buf: Any, pos: int) -> int:
    """Walk the body of ``cls`` at ``pos`` in ``buf`` and return where it ends; BoundsError if
    any length claims more than the bytes there."""
    return entity_checker(cls).step(buf, pos, len(buf))
