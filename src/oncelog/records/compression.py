"""Compression codecs of the v2 batch (attributes bits 0-2), all through cramjam."""

from __future__ import annotations

import enum
import struct

import cramjam


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str | None) -> Compression:
        if name is None or name == "":
            return cls.NONE
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(
                f"unknown compression type {name!r}: use none, gzip, snappy, lz4 or zstd"
            ) from None


# The Java client frames snappy the xerial way; librdkafka writes raw snappy. Read both,
# write xerial so that every client (Java included) can read what we produce.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_BE32 = struct.Struct(">i")


def _snappy_compress(data: bytes) -> bytes:
    out = bytearray(_XERIAL_HEADER)
    for i in range(0, len(data), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(data[i : i + _XERIAL_BLOCK]))
        out += _BE32.pack(len(block))
        out += block
    return bytes(out)


def _snappy_decompress(data) -> bytes:
    data = bytes(data)
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out = bytearray()
    pos = len(_XERIAL_HEADER)
    while pos < len(data):
        (n,) = _BE32.unpack_from(data, pos)
        pos += 4
        out += bytes(cramjam.snappy.decompress_raw(data[pos : pos + n]))
        pos += n
    return bytes(out)


def compress(codec: Compression, data: bytes) -> bytes:
    if codec == Compression.NONE:
        return data
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == Compression.SNAPPY:
        return _snappy_compress(data)
    if codec == Compression.LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(codec: Compression | int, data) -> bytes:
    from .batch import CorruptRecordError

    try:
        if codec == Compression.GZIP:
            return bytes(cramjam.gzip.decompress(bytes(data)))
        if codec == Compression.SNAPPY:
            return _snappy_decompress(data)
        if codec == Compression.LZ4:
            return bytes(cramjam.lz4.decompress(bytes(data)))
        if codec == Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(bytes(data)))
        if codec == Compression.NONE:
            return bytes(data)
    except CorruptRecordError:
        raise
    except Exception as exc:  # cramjam raises its own DecompressionError
        raise CorruptRecordError(f"cannot decompress {Compression(codec).name}: {exc}") from exc
    raise CorruptRecordError(f"unknown compression codec {codec}")
