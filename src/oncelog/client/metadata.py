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

    def topic_id(self, topic: str) -> uuid.UUID | None:
        meta = self.topics.get(topic)
        return meta.topic_id if meta is not None else None

    def topic_error(self, topic: str) -> int:
        meta = self.topics.get(topic)
        return meta.error_code if meta is not None else 0

    def with_response(self, response: Any, requested: Iterable[str] | None) -> Cluster:
        """A new snapshot: brokers replaced, topics in the response replaced, others kept.

        Topics we asked for that the response does not mention are dropped (deleted).
        """
        brokers = {int(b.node_id): BrokerNode(int(b.node_id), b.host, int(b.port),
                                              getattr(b, "rack", None))
                   for b in response.brokers}
        topics = dict(self.topics) if requested is not None else {}
        if requested is not None:
            for name in requested:
                topics.pop(name, None)
        for t in response.topics:
            if t.name is None:
                continue
            partitions = {
                int(p.partition_index): PartitionInfo(
                    int(p.partition_index), int(p.leader_id),
                    tuple(int(r) for r in getattr(p, "replica_nodes", ())),
                    tuple(int(r) for r in getattr(p, "isr_nodes", ())),
                )
                for p in t.partitions
            }
            topic_id = getattr(t, "topic_id", None)
            topics[t.name] = TopicMetadata(t.name, int(t.error_code),
                                           bool(getattr(t, "is_internal", False)), partitions,
                                           topic_id if topic_id and topic_id.int else None)
        return Cluster(brokers, topics, int(getattr(response, "controller_id", -1)),
                       getattr(response, "cluster_id", None))


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
