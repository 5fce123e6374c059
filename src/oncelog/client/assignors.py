"""Partition assignment for consumer groups: Kafka's ConsumerProtocol encoding of
subscriptions and assignments (so that our consumers, librdkafka's, kafka-python's and the Java
client's can share one group), and the assignors the group leader runs: "range",
"roundrobin" (eager: every member gives up everything at each rebalance) and
"cooperative-sticky" (KIP-429: members keep what they own, only what moves is revoked, in a
second rebalance).

    Subscription => version int16, [topic string], user_data nullable bytes,
                    v1+: owned_partitions [topic string, [partition int32]]
    Assignment   => version int16, [topic string, [partition int32]], user_data nullable bytes

We write subscriptions in version 1 and assignments in version 0, and read any version (later
versions only append fields).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .types import TopicPartition

_H = struct.Struct(">h")
_I = struct.Struct(">i")


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()


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


def _partitions(partitions: Iterable[TopicPartition]) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    out = bytearray(_I.pack(len(by_topic)))
    for topic, ps in by_topic.items():
        out += _string(topic) + _I.pack(len(ps)) + b"".join(_I.pack(p) for p in ps)
    return bytes(out)


def _read_partitions(r: _Reader) -> list[TopicPartition]:
    out: list[TopicPartition] = []
    for _ in range(r.int32()):
        topic = r.string()
        out.extend(TopicPartition(topic, r.int32()) for _p in range(r.int32()))
    return out


def encode_subscription(sub: Subscription) -> bytes:
    out = _H.pack(1) + _I.pack(len(sub.topics)) + b"".join(_string(t) for t in sub.topics)
    out += (_I.pack(-1) if sub.user_data is None else _I.pack(len(sub.user_data))
            + sub.user_data)
    return out + _partitions(sub.owned_partitions)


def decode_subscription(data: bytes) -> Subscription:
    r = _Reader(data)
    version = r.int16()
    topics = tuple(r.string() for _ in range(r.int32()))
    user_data = r.nullable_bytes()
    owned: tuple[TopicPartition, ...] = ()
    if version >= 1 and r.pos < len(r.data):
        owned = tuple(_read_partitions(r))
    return Subscription(topics, user_data, owned)


def encode_assignment(partitions: list[TopicPartition]) -> bytes:
    return _H.pack(0) + _partitions(partitions) + _I.pack(-1)


def decode_assignment(data: bytes) -> list[TopicPartition]:
    if not data:
        return []
    r = _Reader(data)
    r.int16()
    return _read_partitions(r)


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


def assign_cooperative_sticky(subscriptions: Mapping[str, Subscription],
                              partitions: Mapping[str, int]) -> dict[str, list[TopicPartition]]:
    """KIP-429's cooperative sticky assignor: a balanced assignment that keeps every member's
    owned partitions where balance allows; a partition that moves from one member to another is
    left out of this round (its owner revokes it and rejoins, and the next round hands it over).
    """
    members = sorted(subscriptions)
    out: dict[str, list[TopicPartition]] = {m: [] for m in members}
    if not members:
        return out
    all_tps = [TopicPartition(t, p) for t in sorted(partitions) for p in range(partitions[t])]
    wanted = {tp for tp in all_tps if any(tp.topic in s.topics for s in subscriptions.values())}
    owner: dict[TopicPartition, str] = {}
    for m in members:  # keep owned partitions still subscribed (first claim wins)
        for tp in subscriptions[m].owned_partitions:
            if tp in wanted and tp.topic in subscriptions[m].topics and tp not in owner:
                owner[tp] = m
    kept: dict[str, list[TopicPartition]] = {m: sorted(tp for tp, o in owner.items() if o == m)
                                             for m in members}
    # Quotas: |wanted| split as evenly as possible; the members already holding more get the
    # larger share, so that the fewest partitions move.
    floor, extra = divmod(len(wanted), len(members))
    by_holding = sorted(members, key=lambda m: (-len(kept[m]), m))
    quota = {m: floor + (1 if i < extra else 0) for i, m in enumerate(by_holding)}
    target: dict[str, list[TopicPartition]] = {m: kept[m][:quota[m]] for m in members}
    taken = {tp for ps in target.values() for tp in ps}
    for tp in sorted(wanted - taken):  # the rest to the least loaded subscriber
        eligible = [m for m in members if tp.topic in subscriptions[m].topics]
        m = min(eligible, key=lambda m: (len(target[m]) >= quota[m], len(target[m]), m))
        target[m].append(tp)
    for m in members:
        # A partition still owned by another member waits for that member's revocation.
        out[m] = sorted(tp for tp in target[m] if owner.get(tp, m) == m)
    return out


ASSIGNORS = {"range": assign_range, "roundrobin": assign_roundrobin,
             "cooperative-sticky": assign_cooperative_sticky}
COOPERATIVE = {"cooperative-sticky"}
