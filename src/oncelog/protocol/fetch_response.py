"""A Fetch response encoded straight from the handler's figures, without building kio objects.

A consumer that fetches many partitions (librdkafka sends every assigned partition in every
Fetch: it has no fetch sessions) made the broker build a kio ``PartitionData`` per partition and
walk it with kio's generic writer: a third of the broker's CPU per fetch went there. This writer
appends each partition's fixed fields with one ``struct`` pack into one buffer, keeps record
sets (FileRegions left in segment files, or bytes) as parts of their own, and yields the frame
the way ``encode_response_parts`` does. It covers Fetch v4-v17 as Kafka's FetchResponse.json
lays them out, without tagged fields: a response that needs one (v16's current_leader and
node_endpoints, KIP-951) is built with kio instead. tests/test_fetch_response.py holds it to
kio's bytes for every version.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from ..primitives import encode_compact_string, encode_string, encode_uvarint
from ..records.region import FileRegion

_I32 = struct.Struct(">i")
_HEAD_V7 = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PARTITION_V4 = struct.Struct(">ihqq")  # index, error, high watermark, last stable offset
_PARTITION_V5 = struct.Struct(">ihqqq")  # ... log start offset
_ABORTED = struct.Struct(">qq")  # producer id, first offset
LARGE = 16 * 1024  # bytes record sets at least this long are kept by reference, not copied


def length_prefix(n: int, flexible: bool) -> bytes:
    """An array's count or a bytes' length: compact (unsigned varint of n + 1) in flexible
    versions, else an int32."""
    return encode_uvarint(n + 1) if flexible else _I32.pack(n)


class FetchResponseWriter:
    """Fill with ``topic`` then its ``partition``s, in order; ``encode_response_parts`` asks
    ``frame`` for the parts to write."""

    __slots__ = ("error_counts", "flexible", "parts", "size", "small", "version")

    def __init__(self, version: int, throttle_ms: int, error_code: int, session_id: int,
                 topics: int) -> None:
        if not 4 <= version <= 17:
            raise ValueError(f"Fetch v{version} is not written by hand")
        self.version = version
        self.flexible = version >= 12
        self.parts: list[Any] = []
        self.size = 0
        # error code -> how many times it is written (the broker's ErrorsPerSec metric)
        self.error_counts: dict[int, int] = {error_code: 1} if version >= 7 else {}
        small = bytearray(_I32.pack(throttle_ms)) if version < 7 else \
            bytearray(_HEAD_V7.pack(throttle_ms, error_code, session_id))
        small += length_prefix(topics, self.flexible)
        self.small = small

    def topic(self, key: str | uuid.UUID | None, partitions: int) -> None:
        """A topic's heading: its name (v4-v12) or id (v13+), and how many partitions follow."""
        small = self.small
        if self.version >= 13:  # kio reads the all-zero id as None
            small += key.bytes if key is not None else bytes(16)  # type: ignore[union-attr]
        elif self.flexible:
            small += encode_compact_string(key)  # type: ignore[arg-type]
        else:
            small += encode_string(key)  # type: ignore[arg-type]
        small += length_prefix(partitions, self.flexible)

    def partition(self, index: int, error_code: int, high_watermark: int,
                  last_stable_offset: int, log_start_offset: int,
                  aborted: list[tuple[int, int]] | None, records: Any) -> None:
        """One partition; ``aborted`` None is a null array (read_uncommitted); ``records`` a
        FileRegion or bytes. A topic's trailing tagged fields follow its last partition
        (``end_topic``)."""
        small = self.small
        version = self.version
        counts = self.error_counts
        counts[error_code] = counts.get(error_code, 0) + 1
        if version >= 5:
            small += _PARTITION_V5.pack(index, error_code, high_watermark, last_stable_offset,
                                        log_start_offset)
        else:
            small += _PARTITION_V4.pack(index, error_code, high_watermark, last_stable_offset)
        flexible = self.flexible
        if aborted is None:
            small += b"\x00" if flexible else b"\xff\xff\xff\xff"
        else:
            small += length_prefix(len(aborted), flexible)
            for producer_id, first_offset in aborted:
                small += _ABORTED.pack(producer_id, first_offset)
                if flexible:
                    small += b"\x00"
        if version >= 11:
            small += b"\xff\xff\xff\xff"  # preferred_read_replica: -1 (KIP-392 unused)
        n = len(records)
        small += length_prefix(n, flexible)
        if n:
            if type(records) is FileRegion or (n >= LARGE and type(records) is bytes):
                self._flush()
                self.parts.append(records)
                self.size += n
                small = self.small
            else:
                small += records
        if flexible:
            small += b"\x00"  # the partition's tagged fields: none

    def end_topic(self) -> None:
        if self.flexible:
            self.small += b"\x00"

    def _flush(self) -> None:
        if self.small:
            self.size += len(self.small)
            self.parts.append(bytes(self.small))
            self.small = bytearray()

    def frame(self, correlation_id: int) -> list[Any]:
        """The complete response frame as parts: size prefix and header, then the body."""
        if self.flexible:
            self.small += b"\x00"  # the response's tagged fields: none
        self._flush()
        head = _I32.pack(correlation_id) + (b"\x00" if self.flexible else b"")
        return [_I32.pack(len(head) + self.size) + head, *self.parts]
