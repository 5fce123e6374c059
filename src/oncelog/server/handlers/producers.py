"""DescribeProducers (KIP-664): the producer state of partitions, for finding hanging
transactions: each producer id's epoch, last sequence and timestamp, the coordinator epoch of
its last marker and the first offset of its open transaction (-1 when none is open)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ..context import RequestContext
from ..ports import ReplicaApiPort
from . import acl


async def handle_describe_producers(broker: ReplicaApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.DESCRIBE_PRODUCERS, ctx.version)
    topics_out = []
    for t in request.topics:
        parts = []
        readable = acl.topic(broker, ctx, acl.Op.READ, t.name)
        for index in t.partition_indexes:
            if not readable:  # Kafka: Read on the topic, TOPIC_AUTHORIZATION_FAILED
                parts.append(make(mod.PartitionResponse, partition_index=index,
                                  error_code=ErrorCode.topic_authorization_failed,
                                  error_message=None, active_producers=()))
                continue
            partition = broker.topics.partition(t.name, index)
            if partition is None:
                parts.append(make(mod.PartitionResponse, partition_index=index,
                                  error_code=ErrorCode.unknown_topic_or_partition,
                                  error_message=f"{t.name}-{index} is not hosted here",
                                  active_producers=()))
                continue
            producers = tuple(
                make(mod.ProducerState, producer_id=e.producer_id,
                     producer_epoch=e.producer_epoch, last_sequence=e.last_seq,
                     last_timestamp=e.last_timestamp, coordinator_epoch=e.coordinator_epoch,
                     current_txn_start_offset=e.current_txn_first_offset)
                for e in partition.log.producer_state.producers.values())
            parts.append(make(mod.PartitionResponse, partition_index=index, error_code=0,
                              error_message=None, active_producers=producers))
        topics_out.append(make(mod.TopicResponse, name=t.name, partitions=tuple(parts)))
    return make(mod.DescribeProducersResponse, throttle_time=0, topics=tuple(topics_out))
