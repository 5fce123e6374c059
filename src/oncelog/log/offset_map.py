"""The log cleaner's map from key to the offset of its latest record (Kafka's OffsetMap and
SkimpyOffsetMap), in bounded memory.

Kafka keeps, per key, a 16-byte MD5 of the key and an 8-byte offset in one preallocated
buffer (``log.cleaner.dedupe.buffer.size``, split between the cleaner threads), so the memory
a cleaning takes does not depend on the keys' sizes. This map does the same with a dict from a
16-byte BLAKE2b digest to the offset: every entry costs the same, whatever the key, and the map
refuses entries past the number the buffer allows (``BYTES_PER_ENTRY`` each: the digest's
bytes object, the offset's int and the dict's slot). A cleaning whose dirty section has more
keys than that cleans what the map covered and leaves the rest dirty for the next pass, as
Kafka's does. Two keys that collide (a 2**-128 chance) would lose the older one's record, as
in Kafka.
"""

from __future__ import annotations

from hashlib import blake2b

# What one entry costs in CPython (a 16-byte bytes object ~49, an int ~32, a dict slot ~40).
BYTES_PER_ENTRY = 128
LOAD_FACTOR = 0.9  # Kafka's log.cleaner.io.buffer.load.factor


def key_digest(key: bytes) -> bytes:
    return blake2b(key, digest_size=16).digest()


class OffsetMap:
    """key → offset of its latest record, at most ``slots`` keys (``memory_bytes`` worth)."""

    def __init__(self, memory_bytes: int) -> None:
        self.slots = max(1, int(memory_bytes // BYTES_PER_ENTRY * LOAD_FACTOR))
        self._map: dict[bytes, int] = {}
        # The largest offset put: records beyond it were not seen when the map was built, so
        # the cleaner keeps them (Kafka's latestOffset).
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self._map)

    @property
    def full(self) -> bool:
        return len(self._map) >= self.slots

    def room_for(self, count: int) -> bool:
        """Whether ``count`` more keys surely fit (a batch is mapped whole or not at all)."""
        return len(self._map) + count <= self.slots

    def put(self, key: bytes, offset: int) -> None:
        self._map[key_digest(key)] = offset
        self.latest_offset = max(self.latest_offset, offset)

    def get(self, key: bytes) -> int:
        """The latest offset of ``key``, -1 when the map does not hold it."""
        return self._map.get(key_digest(key), -1)

    def clear(self) -> None:
        self._map.clear()
        self.latest_offset = -1

    @property
    def utilization(self) -> float:
        return len(self._map) / self.slots
