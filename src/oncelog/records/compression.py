"""Compression codecs of the v2 batch (attributes bits 0-2), all through cramjam.

Every decompression is bounded (issue 16, "Decompression bombs"): the caller names the most bytes
the records may inflate to, and a payload that would produce more is refused after producing at
most that many, never inflated whole in memory first.
"""

from __future__ import annotations

import enum
import mmap
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


class CompressionError(ValueError):
    """A payload that does not decompress, names no known codec, or inflates past its limit."""


# How far a batch's records may inflate. Kafka bounds nothing explicitly (its iterators stream one
# record at a time); we inflate a batch whole, so the bound is what its records could reasonably
# be: INFLATE_RATIO times the largest batch its reader accepts (the broker: the topic's
# max.message.bytes; our client: max.partition.fetch.bytes or the batch itself if larger), and
# never less than DEFAULT_INFLATE_LIMIT (64 x Kafka's default message.max.bytes of 1 MiB).
INFLATE_RATIO = 64
DEFAULT_INFLATE_LIMIT = 64 << 20


def inflate_limit(max_batch_bytes: int) -> int:
    """The most bytes a batch's records may inflate to when batches are at most
    ``max_batch_bytes`` (see INFLATE_RATIO)."""
    return max(DEFAULT_INFLATE_LIMIT, INFLATE_RATIO * max_batch_bytes)


# A produced batch is held to a bound that does not grow with max.message.bytes (issue 29: a
# 16 MB batch under INFLATE_RATIO could make the leader inflate 1 GB): its records may inflate
# to PRODUCE_INFLATE_LIMIT, or to the batch's own size when that is larger (data that does not
# compress never inflates past its compressed size, so no batch max.message.bytes admits is
# refused for being incompressible). Kafka bounds nothing here: its streaming iterator reads
# what the records claim, one record at a time.
PRODUCE_INFLATE_LIMIT = DEFAULT_INFLATE_LIMIT


def produce_inflate_limit(batch_bytes: int) -> int:
    """The most bytes the records of a produced batch of ``batch_bytes`` may inflate to."""
    return max(PRODUCE_INFLATE_LIMIT, batch_bytes)


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


def _snappy_decompress(data: bytes, limit: int) -> bytes:
    # Raw snappy states its uncompressed length up front (a varint preamble): check it before
    # inflating anything; xerial is a sequence of raw blocks, each checked the same way.
    if not data.startswith(_XERIAL_MAGIC):
        if cramjam.snappy.decompress_raw_len(data) > limit:
            raise CompressionError(f"SNAPPY payload inflates past the limit of {limit} bytes")
        return bytes(cramjam.snappy.decompress_raw(data))
    blocks = []
    total = 0
    pos = len(_XERIAL_HEADER)
    while pos < len(data):
        if pos + 4 > len(data):
            raise CompressionError("SNAPPY (xerial) block length truncated")
        (n,) = _BE32.unpack_from(data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise CompressionError("SNAPPY (xerial) block overruns the payload")
        block = data[pos : pos + n]
        total += cramjam.snappy.decompress_raw_len(block)
        if total > limit:
            raise CompressionError(f"SNAPPY payload inflates past the limit of {limit} bytes")
        blocks.append(block)
        pos += n
    return b"".join(bytes(cramjam.snappy.decompress_raw(b)) for b in blocks)


def _streamed(module, data: bytes, limit: int) -> bytes:
    """Decompress with cramjam's streaming decoder into an anonymous mapping of ``limit + 1``
    bytes: the decoder stops when the mapping is full, and only the pages it wrote are ever
    resident, so a bomb costs at most ``limit`` bytes and the time to produce them."""
    out = mmap.mmap(-1, limit + 1)
    try:
        try:
            n = module.decompress_into(data, out)
        except Exception as exc:  # cramjam's DecompressionError, also when the mapping is full
            if "whole buffer" in str(exc):
                raise CompressionError(f"payload inflates past the limit of {limit} bytes"
                                       ) from None
            raise
        if n > limit:
            raise CompressionError(f"payload inflates past the limit of {limit} bytes")
        return out[:n]
    finally:
        out.close()


def inflate_prefix(codec: Compression | int, data, window: int
                   ) -> tuple[bytes | bytearray, bool]:
    """(the first bytes of the payload decompressed, whether there are more): at most
    ``window + 1`` bytes are produced, so a bomb costs what its first ``window`` bytes cost.
    The produce path reads a batch's first records this way before inflating it whole
    (records/batch.py ``check_records``). Snappy states its length up front: it is inflated
    whole when that is within ``window``, else nothing is (more: True, nothing read)."""
    if codec not in Compression.__members__.values():
        raise CompressionError(f"unknown compression codec {codec}")
    name = Compression(codec).name
    try:
        if codec == Compression.NONE:
            return bytes(data[:window + 1]), len(data) > window
        if codec == Compression.SNAPPY:
            raw = bytes(data)
            if not raw.startswith(_XERIAL_MAGIC) and \
                    cramjam.snappy.decompress_raw_len(raw) > window:
                return b"", True
            try:
                return _snappy_decompress(raw, window), False
            except CompressionError:  # past the window: read whole later, within the limit
                return b"", True
        if window > _HEAP_WINDOW:  # only the pages written become resident
            return _mapped_prefix(Compression(codec), bytes(data), window)
        # a small window from the heap: a fresh mapping costs more than the inflating (3 ms
        # against 0.3 ms for 1 MiB, from its page faults and unmapping)
        buf = bytearray(window + 1)
        try:
            n = _STREAMED[Compression(codec)].decompress_into(bytes(data), buf)
        except Exception as exc:  # the buffer is full: the payload goes on
            if "whole buffer" not in str(exc):
                raise
            return buf, True
        del buf[n:]
        return buf, n > window
    except CompressionError as exc:
        raise CompressionError(f"{name}: {exc}") from None
    except Exception as exc:  # cramjam raises its own DecompressionError
        raise CompressionError(f"cannot decompress {name}: {exc}") from exc


_HEAP_WINDOW = 8 << 20


def _mapped_prefix(codec: Compression, data: bytes, window: int
                   ) -> tuple[bytes | bytearray, bool]:
    out = mmap.mmap(-1, window + 1)
    try:
        try:
            n = _STREAMED[codec].decompress_into(data, out)
        except Exception as exc:  # the mapping is full: the payload goes on
            if "whole buffer" not in str(exc):
                raise
            return out[:window + 1], True
        return out[:n], n > window
    finally:
        out.close()


def compress(codec: Compression, data: bytes, level: int | None = None) -> bytes:
    """``level``: the codec's level (Kafka's compression.<codec>.level, KIP-390); None or -1
    for the codec's default. Snappy has none."""
    if level == -1:
        level = None
    if codec == Compression.NONE:
        return data
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data, level=level))
    if codec == Compression.SNAPPY:
        return _snappy_compress(data)
    if codec == Compression.LZ4:
        return _lz4_frame(data, level)
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=level))
    raise ValueError(f"unknown compression codec {codec}")


# The LZ4 frame as Kafka's Lz4BlockOutputStream writes it (KIP-57): version 1, independent
# blocks of at most 64 KiB, no block or content checksum, no content size, then the end mark.
# Kafka's reader refuses a frame of linked blocks ("Dependent block stream is unsupported"),
# which is what cramjam's frame compressor writes.
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_FLG = 0x60  # version 01, block independence
_LZ4_BD = 0x40   # block maximum size 64 KiB
_LZ4_BLOCK = 64 << 10
_LZ4_UNCOMPRESSED = 0x80000000


def _xxh32(data: bytes, seed: int = 0) -> int:
    """xxHash32 of a few bytes (the LZ4 frame's header checksum)."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    n, i = len(data), 0
    if n >= 16:
        v = [(seed + p1 + p2) & mask, (seed + p2) & mask, seed & mask, (seed - p1) & mask]
        while i + 16 <= n:
            for j in range(4):
                lane = int.from_bytes(data[i + 4 * j:i + 4 * j + 4], "little")
                v[j] = (rotl((v[j] + lane * p2) & mask, 13) * p1) & mask
            i += 16
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & mask
    else:
        h = (seed + p5) & mask
    h = (h + n) & mask
    while i + 4 <= n:
        h = (rotl((h + int.from_bytes(data[i:i + 4], "little") * p3) & mask, 17) * p4) & mask
        i += 4
    while i < n:
        h = (rotl((h + data[i] * p5) & mask, 11) * p1) & mask
        i += 1
    h ^= h >> 15
    h = (h * p2) & mask
    h ^= h >> 13
    h = (h * p3) & mask
    return h ^ (h >> 16)


_LZ4_HEADER = (_LZ4_MAGIC + bytes([_LZ4_FLG, _LZ4_BD])
               + bytes([(_xxh32(bytes([_LZ4_FLG, _LZ4_BD])) >> 8) & 0xFF]))


def lz4_frame_problem(payload) -> str | None:
    """What Kafka's LZ4 reader refuses in a frame's descriptor (its FLG checks), or None. A
    payload that is no LZ4 frame at all is left to the decompression to refuse."""
    head = bytes(payload[:5])
    if len(head) < 5 or head[:4] != _LZ4_MAGIC:
        return None
    flg = head[4]
    if flg >> 6 != 1:
        return f"LZ4 frame version {flg >> 6} is unsupported"
    if flg & 0x03:
        return "LZ4 frame descriptor: reserved bits must be 0"
    if not flg & 0x20:
        return "LZ4 frame of linked blocks: dependent block stream is unsupported (Kafka)"
    return None


def _lz4_frame(data: bytes, level: int | None) -> bytes:
    out = bytearray(_LZ4_HEADER)
    view = memoryview(data)
    for start in range(0, len(data), _LZ4_BLOCK):
        chunk = view[start:start + _LZ4_BLOCK]
        if level is None:
            block = cramjam.lz4.compress_block(chunk, store_size=False)
        else:
            block = cramjam.lz4.compress_block(chunk, mode="high_compression",
                                               compression=level, store_size=False)
        if len(block) < len(chunk):
            out += struct.pack("<I", len(block)) + bytes(block)
        else:  # incompressible: the block is stored as it is
            out += struct.pack("<I", len(chunk) | _LZ4_UNCOMPRESSED) + chunk
    out += b"\x00\x00\x00\x00"  # end mark
    return bytes(out)


_STREAMED = {Compression.GZIP: cramjam.gzip, Compression.LZ4: cramjam.lz4,
             Compression.ZSTD: cramjam.zstd}


def decompress(codec: Compression | int, data, limit: int = DEFAULT_INFLATE_LIMIT) -> bytes:
    """The payload decompressed, at most ``limit`` bytes; CompressionError otherwise."""
    if codec not in Compression.__members__.values():
        raise CompressionError(f"unknown compression codec {codec}")
    name = Compression(codec).name
    try:
        if codec == Compression.NONE:
            if len(data) > limit:
                raise CompressionError(f"payload larger than the limit of {limit} bytes")
            return bytes(data)
        if codec == Compression.SNAPPY:
            return _snappy_decompress(bytes(data), limit)
        return _streamed(_STREAMED[Compression(codec)], bytes(data), limit)
    except CompressionError as exc:
        raise CompressionError(f"{name}: {exc}") from None
    except Exception as exc:  # cramjam raises its own DecompressionError
        raise CompressionError(f"cannot decompress {name}: {exc}") from exc
