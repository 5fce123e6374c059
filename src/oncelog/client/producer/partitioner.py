"""Which partition a record goes to: the Java client's rules, so keys land where Java puts them.

Keyed records: ``(murmur2(key) & 0x7fffffff) % num_partitions`` (Java's
``BuiltInPartitioner.partitionForKey``; ``Utils.toPositive`` is the mask).

Unkeyed records: sticky (KIP-480). All unkeyed records of a topic go to one partition until the
batch they fill there is full, then the next batch goes to another partition chosen at random.
Batches get fuller than with round-robin (one record per partition per batch) while load still
spreads over time.
"""

from __future__ import annotations

import random
import threading

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), signed result."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    nblocks = length // 4
    for i in range(nblocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = nblocks * 4
    rest = length & 3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """The sticky choice for unkeyed records, per topic. Thread-safe (``send`` is)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[str, int] = {}
        self._random = random.Random()

    def partition(self, topic: str, partitions: list[int]) -> int:
        with self._lock:
            current = self._current.get(topic)
            if current is None or current not in partitions:
                current = self._random.choice(partitions)
                self._current[topic] = current
            return current

    def batch_full(self, topic: str, partition: int, partitions: list[int]) -> None:
        """The batch being filled on ``partition`` is full: stick to another partition next."""
        with self._lock:
            if self._current.get(topic) != partition:
                return  # another thread already moved on
            others = [p for p in partitions if p != partition] or partitions
            self._current[topic] = self._random.choice(others)
