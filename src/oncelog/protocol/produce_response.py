"""A Produce response encoded straight from the handler's results, without kio objects.

Kio's writer walked a ``PartitionProduceResponse`` per partition of every Produce request: with
small batches (one batch per partition per request) encoding the answer cost the broker as much
as appending the records. This writer packs each partition's fixed fields with one ``struct``
call. It covers Produce v3-v12 as Kafka's ProduceResponse.json lays them out, without tagged
fields (v10's current_leader and node_endpoints, KIP-951, which the broker does not send).
tests/test_produce_response.py holds it to kio's bytes for every version.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ..primitives import encode_compact_string, encode_string
from .fetch_response import length_prefix

_I32 = struct.Struct(">i")
_PARTITION_V2 = struct.Struct(">ihqq")  # index, error, base offset, log append time
_PARTITION_V5 = struct.Struct(">ihqqq")  # ... log start offset


def _compact_nullable_string(s: str | None) -> bytes:
    return b"\x00" if s is None else encode_compact_string(s)


class ProduceResponseWriter:
    """Fill with ``topic`` then its ``partition``s in order; ``encode_response_parts`` asks
    ``frame`` for the bytes to write."""

    __slots__ = ("buf", "error_counts", "flexible", "version")

    def __init__(self, version: int, topics: int) -> None:
        if not 3 <= version <= 12:
            raise ValueError(f"Produce v{version} is not written by hand")
        self.version = version
        self.flexible = version >= 9
        self.buf = bytearray(length_prefix(topics, self.flexible))
        # error code -> how many times it is written (the broker's ErrorsPerSec metric)
        self.error_counts: dict[int, int] = {}

    def topic(self, name: str, partitions: int) -> None:
        buf = self.buf
        buf += _compact_nullable_string(name) if self.flexible else encode_string(name)
        buf += length_prefix(partitions, self.flexible)

    def partition(self, index: int, error_code: int, base_offset: int, log_append_time: int,
                  log_start_offset: int, record_errors: Sequence[tuple[int, str | None]] = (),
                  error_message: str | None = None) -> None:
        buf = self.buf
        version = self.version
        counts = self.error_counts
        counts[error_code] = counts.get(error_code, 0) + 1
        if version >= 5:
            buf += _PARTITION_V5.pack(index, error_code, base_offset, log_append_time,
                                      log_start_offset)
        else:
            buf += _PARTITION_V2.pack(index, error_code, base_offset, log_append_time)
        if version >= 8:  # KIP-467
            flexible = self.flexible
            buf += length_prefix(len(record_errors), flexible)
            for batch_index, message in record_errors:
                buf += _I32.pack(batch_index)
                if flexible:
                    buf += _compact_nullable_string(message)
                    buf += b"\x00"
                else:
                    buf += encode_string(message)
            buf += _compact_nullable_string(error_message) if flexible \
                else encode_string(error_message)
        if self.flexible:
            buf += b"\x00"  # the partition's tagged fields: none

    def end_topic(self) -> None:
        if self.flexible:
            self.buf += b"\x00"

    def frame(self, correlation_id: int) -> list[bytes]:
        buf = self.buf
        buf += _I32.pack(0)  # throttle_time_ms
        if self.flexible:
            buf += b"\x00"  # the response's tagged fields: none
        head = _I32.pack(correlation_id) + (b"\x00" if self.flexible else b"")
        return [_I32.pack(len(head) + len(buf)) + head + bytes(buf)]
