"""The small value types users see: what they pass in and what they get back."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import NamedTuple

from ..security.acls import Operation


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """What a producer's future resolves to once the broker has acknowledged the record.

    ``offset`` is -1 when the broker did not say (acks=0). ``timestamp`` is the broker's
    LogAppendTime when the topic uses it, else the record's CreateTime.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass
class NewTopic:
    name: str
    num_partitions: int = 1
    replication_factor: int = 1
    config: dict[str, str] = field(default_factory=dict)


@dataclass
class NewPartitions:
    """Kafka's NewPartitions.increaseTo: the topic's new partition count and, optionally, the
    replicas (broker ids) of each added partition, else the controller places them."""

    total_count: int
    new_assignments: list[list[int]] | None = None


@dataclass(frozen=True)
class BrokerNode:
    """A broker: from Metadata, or a group's coordinator (``ConsumerGroupDescription``)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True)
class PartitionInfo:
    partition: int
    leader: int  # node id, -1 when there is none
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()


@dataclass(frozen=True)
class TopicDescription:
    name: str
    internal: bool
    partitions: list[PartitionInfo]
    config: dict[str, str | None]
    topic_id: uuid.UUID | None = None  # Metadata v10+ (KIP-516)
    # KIP-430: what the caller may do on the topic (describe_topics(...,
    # include_authorized_operations=True); None when not asked)
    authorized_operations: frozenset[Operation] | None = None


class ConsumerGroupMetadata(NamedTuple):
    """What ``Consumer.group_metadata()`` returns and ``Producer.send_offsets_to_transaction``
    takes: the group and this member's place in it, so that the group coordinator can fence a
    zombie's transactional offset commit (KIP-447)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


@dataclass(frozen=True)
class TransactionListing:
    """One line of ``Admin.list_transactions``."""

    transactional_id: str
    producer_id: int
    state: str  # as Kafka names it: Empty, Ongoing, PrepareCommit, CompleteAbort ...
    coordinator_id: int = -1  # the broker that answered (Kafka's allByBrokerId key)


@dataclass(frozen=True)
class TransactionDescription:
    """``Admin.describe_transactions``: what the coordinator holds for a transactional id."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_ms: int | None  # when the current or last transaction began; None after InitProducerId
    partitions: frozenset[TopicPartition]
    coordinator_id: int = -1  # the broker coordinating the id (Kafka's coordinatorId())


@dataclass(frozen=True)
class ProducerState:
    """``Admin.describe_producers``: a producer id's state in one partition."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int  # -1 when it has no open transaction there


@dataclass(frozen=True)
class ConsumerGroupListing:
    """One line of ``Admin.list_consumer_groups`` (Kafka's ConsumerGroupListing)."""

    group_id: str
    is_simple_consumer_group: bool  # no members ever joined (offsets committed by assign())
    state: str  # Kafka's names: Empty, PreparingRebalance, CompletingRebalance, Stable, Dead
    type: str  # KIP-848's group type: "classic" for every group of the classic protocol


@dataclass(frozen=True)
class MemberDescription:
    """A member of a described consumer group (Kafka's MemberDescription)."""

    member_id: str
    group_instance_id: str | None  # KIP-345's static member id; None for a dynamic member
    client_id: str
    host: str
    assignment: frozenset[TopicPartition]  # decoded with Kafka's ConsumerProtocol


@dataclass(frozen=True)
class ConsumerGroupDescription:
    """``Admin.describe_consumer_groups``: a consumer group (Kafka's
    ConsumerGroupDescription)."""

    group_id: str
    is_simple_consumer_group: bool  # no protocol type: offsets committed, nobody joined
    members: tuple[MemberDescription, ...]
    partition_assignor: str  # the protocol the group chose (range, cooperative-sticky ...); ""
    state: str  # Kafka's names: Stable, PreparingRebalance, CompletingRebalance, Empty, Dead
    coordinator: BrokerNode
    # KIP-430: what the caller may do on the group (None when not asked)
    authorized_operations: frozenset[Operation] | None = None


class ListOffsetsResultInfo(NamedTuple):
    """``Admin.list_offsets``: a partition's offset for the spec asked (Kafka's
    ListOffsetsResultInfo)."""

    offset: int
    timestamp: int  # -1 unless the spec was a timestamp or the largest one (-3)
    leader_epoch: int  # -1 when the broker did not say


class OffsetAndTimestamp(NamedTuple):
    """``Consumer.offsets_for_times``: the first offset whose record's timestamp is at or
    after the one asked, and that record's timestamp (Kafka's OffsetAndTimestamp)."""

    offset: int
    timestamp: int
