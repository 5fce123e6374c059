"""Partition assignment for consumer groups: Kafka's ConsumerProtocol encoding of
subscriptions and assignments (so that our consumers, librdkafka's, kafka-python's and the Java
client's can share one group), and the "range" and "roundrobin" assignors the group leader runs.

    Subscription => version int16, [topic string], user_data nullable bytes, (v1+: owned ...)
    Assignment   => version int16, [topic string, [partition int32]], user_data nullable bytes

We write version 0 and read any version (later versions only append fields).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from .types import TopicPartition

_H = struct.Struct(">h")
_I = struct.Struct(">i")


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]
    user_data: bytes | None = None


def _string(s: str) -> bytes:
    data = s.encode()
    return _H.pack(len(data)) + data


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def int16(self) -> int:
        (v,) = _H.unpack_from(self.data, self.pos)
        self.pos += 2
        return v

    def int32(self) -> int:
        (v,) = _I.unpack_from(self.data, self.pos)
        self.pos += 4
        return v

    def string(self) -> str:
        n = self.int16()
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def nullable_bytes(self) -> bytes | None:
        if self.pos >= len(self.data):
            return None
        n = self.int32()
        if n < 0:
            return None
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return bytes(b)


def encode_subscription(sub: Subscription) -> bytes:
    out = _H.pack(0) + _I.pack(len(sub.topics)) + b"".join(_string(t) for t in sub.topics)
    return out + (_I.pack(-1) if sub.user_data is None else _I.pack(len(sub.user_data))
                  + sub.user_data)


def decode_subscription(data: bytes) -> Subscription:
    r = _Reader(data)
    r.int16()
    topics = tuple(r.string() for _ in range(r.int32()))
    return Subscription(topics, r.nullable_bytes())


def encode_assignment(partitions: list[TopicPartition]) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    out = bytearray(_H.pack(0) + _I.pack(len(by_topic)))
    for topic, ps in by_topic.items():
        out += _string(topic) + _I.pack(len(ps)) + b"".join(_I.pack(p) for p in ps)
    return bytes(out + _I.pack(-1))


def decode_assignment(data: bytes) -> list[TopicPartition]:
    if not data:
        return []
    r = _Reader(data)
    r.int16()
    out: list[TopicPartition] = []
    for _ in range(r.int32()):
        topic = r.string()
        out.extend(TopicPartition(topic, r.int32()) for _p in range(r.int32()))
    return out


def assign_range(subscriptions: Mapping[str, Subscription], partitions: Mapping[str, int]
                 ) -> dict[str, list[TopicPartition]]:
    """Per topic, its subscribers in member-id order get consecutive ranges; the first ones
    get one more when the partitions do not divide evenly (Kafka's RangeAssignor)."""
    out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
    for topic in sorted(partitions):
        members = sorted(m for m, s in subscriptions.items() if topic in s.topics)
        if not members:
            continue
        n = partitions[topic]
        per, extra = divmod(n, len(members))
        start = 0
        for i, m in enumerate(members):
            count = per + (1 if i < extra else 0)
            out[m].extend(TopicPartition(topic, p) for p in range(start, start + count))
            start += count
    return out


def assign_roundrobin(subscriptions: Mapping[str, Subscription], partitions: Mapping[str, int]
                      ) -> dict[str, list[TopicPartition]]:
    """All partitions in (topic, partition) order dealt to the members in member-id order,
    skipping members not subscribed to the topic (Kafka's RoundRobinAssignor)."""
    out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
    members = sorted(subscriptions)
    if not members:
        return out
    i = 0
    for topic in sorted(partitions):
        for p in range(partitions[topic]):
            for _ in range(len(members)):
                m = members[i % len(members)]
                i += 1
                if topic in subscriptions[m].topics:
                    out[m].append(TopicPartition(topic, p))
                    break
    return out


ASSIGNORS = {"range": assign_range, "roundrobin": assign_roundrobin}
