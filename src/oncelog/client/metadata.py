"""What a client knows about the cluster: brokers, topics, partitions and their leaders.

``Cluster`` is an immutable snapshot; a metadata response produces a new one, so readers on
other threads (the producer's ``send``) can use the current snapshot without locks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .types import BrokerNode, PartitionInfo, TopicPartition


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    error_code: int
    is_internal: bool
    partitions: dict[int, PartitionInfo]
    # Metadata v10+ (KIP-516); None from older brokers, which then get fetches by name.
    topic_id: uuid.UUID | None = None


@dataclass(frozen=True)
class Cluster:
    brokers: dict[int, BrokerNode] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    controller_id: int = -1
    cluster_id: str | None = None
    # KIP-320: each partition's leader epoch as the metadata gave it (Metadata v7+)
    leader_epochs: dict[TopicPartition, int] = field(default_factory=dict)

    def partitions_for(self, topic: str) -> list[int] | None:
        """Partition ids of a known topic, None while the topic is unknown."""
        meta = self.topics.get(topic)
        if meta is None or meta.error_code or not meta.partitions:
            return None
        return sorted(meta.partitions)

    def leader_for(self, tp: TopicPartition) -> int | None:
        meta = self.topics.get(tp.topic)
        if meta is None:
            return None
        info = meta.partitions.get(tp.partition)
        if info is None or info.leader < 0 or info.leader not in self.brokers:
            return None
        return info.leader

    def leader_epoch(self, tp: TopicPartition) -> int:
        """The partition's leader epoch as last seen (-1: not known)."""
        return self.leader_epochs.get(tp, -1)

    def topic_id(self, topic: str) -> uuid.UUID | None:
        meta = self.topics.get(topic)
        return meta.topic_id if meta is not None else None

    def topic_error(self, topic: str) -> int:
        meta = self.topics.get(topic)
        return meta.error_code if meta is not None else 0

    def with_response(self, response: Any, requested: Iterable[str] | None) -> Cluster:
        """A new snapshot: brokers replaced, topics in the response replaced, others kept.

        Topics we asked for that the response does not mention are dropped (deleted).

        KIP-320, as Kafka's clients: a partition whose leader epoch in the response is older
        than the one already known keeps what is known. The answer comes from a broker that
        has not heard of the newer leader yet -- a deposed leader cut off from ZooKeeper still
        names itself -- and following it would send reads and writes back to that broker
        (a consumer there finds its position out of range and resets: a read that goes back).
        """
        brokers = {int(b.node_id): BrokerNode(int(b.node_id), b.host, int(b.port),
                                              getattr(b, "rack", None))
                   for b in response.brokers}
        topics = dict(self.topics) if requested is not None else {}
        if requested is not None:
            for name in requested:
                topics.pop(name, None)
        epochs = {tp: e for tp, e in self.leader_epochs.items() if tp.topic in topics}
        for t in response.topics:
            if t.name is None:
                continue
            topic_id = getattr(t, "topic_id", None)
            topic_id = topic_id if topic_id and topic_id.int else None
            known = self.topics.get(t.name)
            # (by topic id: a topic deleted and created again starts its epochs over)
            same_topic = known is not None and topic_id is not None \
                and known.topic_id == topic_id
            partitions = {}
            for p in t.partitions:
                index = int(p.partition_index)
                tp = TopicPartition(t.name, index)
                epoch = int(getattr(p, "leader_epoch", -1))
                known_epoch = self.leader_epochs.get(tp, -1) if same_topic else -1
                if known is not None and same_topic and 0 <= epoch < known_epoch \
                        and index in known.partitions:
                    partitions[index] = known.partitions[index]  # stale: keep what we know
                    epochs[tp] = known_epoch
                    continue
                partitions[index] = PartitionInfo(
                    index, int(p.leader_id),
                    tuple(int(r) for r in getattr(p, "replica_nodes", ())),
                    tuple(int(r) for r in getattr(p, "isr_nodes", ())))
                epochs[tp] = epoch
            topics[t.name] = TopicMetadata(t.name, int(t.error_code),
                                           bool(getattr(t, "is_internal", False)), partitions,
                                           topic_id)
        return Cluster(brokers, topics, int(getattr(response, "controller_id", -1)),
                       getattr(response, "cluster_id", None),
                       {tp: e for tp, e in epochs.items() if tp.topic in topics})


def metadata_request(topics: list[str] | None, allow_auto_topic_creation: bool = True
                     ) -> Callable[[int], dict[str, Any]]:
    """Request body as a function of the version: v0 says "all topics" with an empty list."""

    def values(version: int) -> dict[str, Any]:
        listed: list[dict[str, Any]] | None
        if topics is None:
            listed = [] if version == 0 else None
        else:
            listed = [{"name": t, "topic_id": None} for t in topics]
        return {
            "topics": listed,
            "allow_auto_topic_creation": allow_auto_topic_creation,
            "include_topic_authorized_operations": False,
            "include_cluster_authorized_operations": False,
        }

    return values
