"""Kafka's encoding primitives, in one place: fixed-width integers, unsigned varints, zig-zag
varints (Kafka's ByteUtils), and int16-length and compact strings.

The record batch (records/), the internal topics' record layouts (txn/, group/) and the request
header and bounds walk (protocol/) all read and write these. Readers are kio's (the protocol
codec's, in Rust) where kio has one: they take ``(buffer, offset)`` and raise kio's errors;
here they return ``(value, new offset)`` and raise ``DecodeError``, which each caller turns
into its own error (a corrupt record, a bad transaction log entry, a malformed request).
Writers are ours: kio's write to a stream a byte at a time, while our callers build records
with ``bytes``/``bytearray`` concatenation.

This module sits at the bottom of the package (it imports nothing of oncelog), so that the
record format and the protocol can both use it.
"""

from __future__ import annotations

import struct
from typing import Any

from kio.serial.errors import BufferUnderflow, SerialError
from kio.serial.readers import (
    read_compact_string as _kio_read_compact_string,
)
from kio.serial.readers import (
    read_legacy_bytes as _kio_read_legacy_bytes,
)
from kio.serial.readers import (
    read_nullable_legacy_string as _kio_read_nullable_legacy_string,
)
from kio.serial.readers import (
    read_signed_varlong as _kio_read_signed_varlong,
)
from kio.serial.readers import (
    read_unsigned_varint as _kio_read_unsigned_varint,
)

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")


class DecodeError(ValueError):
    """Bytes that do not hold the primitive asked for: truncated, too long, not UTF-8."""


def _decode_error(what: str, exc: Exception) -> DecodeError:
    if isinstance(exc, BufferUnderflow):
        return DecodeError(f"truncated {what}")
    return DecodeError(f"bad {what}: {exc}")


# --- unsigned varints (Kafka's 32-bit ones: lengths, counts, tags of the flexible versions) ---

# The one-byte varints, made once: most lengths, counts and deltas are below 128.
_ONE_BYTE = tuple(bytes((b,)) for b in range(0x80))


def encode_uvarint(value: int) -> bytes:
    """An unsigned varint, as Kafka's ByteUtils.writeUnsignedVarint."""
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_uvarint(buf: Any, pos: int) -> tuple[int, int]:
    """(value, new position) of an unsigned varint of at most five bytes at ``pos``."""
    try:
        b = buf[pos]
    except IndexError:
        raise DecodeError("truncated varint") from None
    if b < 0x80:  # one byte: most counts, lengths and tags; no call into kio
        return b, pos + 1
    try:
        value, size = _kio_read_unsigned_varint(buf, pos)
    except (SerialError, ValueError) as exc:  # kio: BufferUnderflow; ValueError: > 5 bytes
        raise _decode_error("varint", exc) from None
    return value, pos + size


# --- zig-zag varints (the record format's: signed, up to 64 bits) -----------------------------

def encode_varint(value: int) -> bytes:
    """Zig-zag varint (signed), as Kafka's ByteUtils.writeVarint/writeVarlong."""
    v = (value << 1) ^ (value >> 63)
    if v < 0x80:
        return _ONE_BYTE[v]
    out = bytearray()
    while v & ~0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def read_varint(buf: Any, pos: int) -> tuple[int, int]:
    """(value, new position) of a zig-zag varint (at most ten bytes) at ``pos``."""
    try:
        b = buf[pos]
    except IndexError:
        raise DecodeError("truncated varint") from None
    if b < 0x80:  # one byte, most of a record's varints: no call into kio
        return (b >> 1) ^ -(b & 1), pos + 1
    try:
        value, size = _kio_read_signed_varlong(buf, pos)
    except (SerialError, ValueError) as exc:  # kio: BufferUnderflow; ValueError: > 10 bytes
        raise _decode_error("varint", exc) from None
    return value, pos + size


# --- strings and bytes ---------------------------------------------------------------------------

def encode_string(s: str | None) -> bytes:
    """An int16-length-prefixed UTF-8 string; None as length -1."""
    if s is None:
        return INT16.pack(-1)
    data = s.encode()
    return INT16.pack(len(data)) + data


def read_string(buf: Any, pos: int) -> tuple[str | None, int]:
    """(string or None for length -1, new position) of an int16-length-prefixed string."""
    try:
        value, size = _kio_read_nullable_legacy_string(buf, pos)
    except (SerialError, ValueError) as exc:
        raise _decode_error("string", exc) from None
    return value, pos + size


def encode_compact_string(s: str) -> bytes:
    """A compact string (flexible versions): unsigned varint length + 1, then UTF-8."""
    data = s.encode()
    return encode_uvarint(len(data) + 1) + data


def read_compact_string(buf: Any, pos: int) -> tuple[str, int]:
    """(string, new position) of a non-null compact string."""
    try:
        value, size = _kio_read_compact_string(buf, pos)
    except (SerialError, ValueError) as exc:
        raise _decode_error("compact string", exc) from None
    return value, pos + size


def encode_bytes(b: bytes) -> bytes:
    """int32-length-prefixed bytes."""
    return INT32.pack(len(b)) + b


def read_bytes(buf: Any, pos: int) -> tuple[bytes, int]:
    """(bytes, new position) of non-null int32-length-prefixed bytes."""
    try:
        value, size = _kio_read_legacy_bytes(buf, pos)
    except (SerialError, ValueError) as exc:
        raise _decode_error("bytes", exc) from None
    return value, pos + size
