"""ApiVersions, Metadata and DescribeCluster: what a client asks before anything else."""

from __future__ import annotations

import asyncio
import uuid
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_class, response_module
from ...protocol.error_response import error_response
from ..context import RequestContext
from ..ports import ClusterApiPort
from ..topics import INTERNAL_TOPICS, SHOWN_INTERNAL, TopicError, check_topic_name
from . import acl
from .util import error_code

_NULL_UUID = uuid.UUID(int=0)
_YIELD_EVERY = 1000  # topics answered between two turns of the event loop


async def handle_api_versions(broker: ClusterApiPort, ctx: RequestContext, request: Any) -> Any:
    return broker.api_versions_response(ctx.version)


async def _metadata(broker: ClusterApiPort, ctx: RequestContext, request: Any, mod: ModuleType):
    """Brokers, leaders, epochs, replicas and ISRs from the metadata's view; topics are
    created through it too (auto-creation, internal topics)."""
    metadata = broker.metadata
    view = metadata.view
    asked_ids: dict[int, uuid.UUID] = {}  # position in the request -> the id it named
    if request.topics is None or (ctx.version == 0 and not request.topics):
        names = [n for n in sorted(view.topics) if acl.topic(broker, ctx, acl.Op.DESCRIBE, n)]
    else:
        names = []
        for t in request.topics:
            name = getattr(t, "name", t)
            if name is None and getattr(t, "topic_id", None) is not None:
                asked_ids[len(names)] = t.topic_id  # v12 looks a topic up by id (KIP-516)
                name = view.topic_names.get(t.topic_id)
            names.append(name)
    # Kafka's default: v0-v3 always auto-create; v4+ when the client allows it.
    allow_auto = getattr(request, "allow_auto_topic_creation", True)

    def topic_ops(name: str) -> int:  # KIP-430 (v8+), when asked
        if not getattr(request, "include_topic_authorized_operations", False):
            return acl.OPERATIONS_OMITTED
        return acl.authorized_operations(broker, ctx, acl.R.TOPIC, name)

    topics_out = []
    for i, name in enumerate(names):
        if i % _YIELD_EVERY == _YIELD_EVERY - 1:
            await asyncio.sleep(0)  # a request naming 300,000 topics must not stall the rest
        err = None
        assignment = view.topics.get(name) if name is not None else None
        if name is None:
            err = ErrorCode.unknown_topic_id
        elif not acl.topic(broker, ctx, acl.Op.DESCRIBE, name):
            err, assignment = ErrorCode.topic_authorization_failed, None
            if i in asked_ids:
                name = None  # Kafka: the id is no secret, the name of a topic one may not see is
        elif assignment is None:
            try:
                check_topic_name(name)
                if name in INTERNAL_TOPICS:  # Kafka creates these on first use, whoever asks
                    err = metadata.request_internal_topic(name)
                elif not (acl.cluster(broker, ctx, acl.Op.CREATE)
                          or acl.topic(broker, ctx, acl.Op.CREATE, name)):
                    err = ErrorCode.topic_authorization_failed  # auto-creation needs Create
                elif not (allow_auto and broker.config.get("auto.create.topics.enable")):
                    err = ErrorCode.unknown_topic_or_partition
                else:
                    err = metadata.request_topic(name, broker.config.int("num.partitions"),
                                                 broker.config.int("default.replication.factor"),
                                                 {})
            except TopicError as exc:
                err = exc.error_name
            view = metadata.view  # a cluster of one has created it already
            assignment = view.topics.get(name) if err is None else None
        if assignment is None:
            # Kafka's answer names the operations of every topic the caller may describe,
            # unknown ones too; not of those refused (Describe, or Create to auto-create).
            ops = topic_ops(name) if err != ErrorCode.topic_authorization_failed and name is not None \
                else acl.OPERATIONS_OMITTED
            topics_out.append(make(mod.MetadataResponseTopic, error_code=error_code(err),
                                   name=name, topic_id=asked_ids.get(i, _NULL_UUID),
                                   is_internal=False, partitions=(),
                                   topic_authorized_operations=ops))
            continue
        parts = []
        for index, replicas in sorted(assignment.partitions.items()):
            found = view.states.get((name, index))
            offline = tuple(r for r in replicas if r not in view.brokers)
            if found is None or found[0].leader < 0 or found[0].leader not in view.brokers:
                state = found[0] if found else None
                parts.append(make(
                    mod.MetadataResponsePartition, error_code=ErrorCode.leader_not_available,
                    partition_index=index, leader_id=-1,
                    leader_epoch=state.leader_epoch if state else -1,
                    replica_nodes=tuple(replicas), isr_nodes=tuple(state.isr) if state else (),
                    offline_replicas=offline))
                continue
            state = found[0]
            # A replica that is down is listed in offline_replicas; no error (Kafka reports
            # REPLICA_NOT_AVAILABLE to v0 clients only, which clients then ignore anyway).
            parts.append(make(
                mod.MetadataResponsePartition, error_code=0, partition_index=index,
                leader_id=state.leader, leader_epoch=state.leader_epoch,
                replica_nodes=tuple(replicas), isr_nodes=tuple(state.isr),
                offline_replicas=offline))
        topics_out.append(make(mod.MetadataResponseTopic, error_code=0, name=name,
                               topic_id=assignment.topic_id, is_internal=name in SHOWN_INTERNAL,
                               partitions=tuple(parts),
                               topic_authorized_operations=topic_ops(name)))
    brokers = tuple(make(mod.MetadataResponseBroker, node_id=b, host=info.host, port=info.port,
                         rack=getattr(info, "rack", None))
                    for b, info in sorted(view.brokers.items()))
    controller = view.controller_id if view.controller_id is not None else -1
    return make(mod.MetadataResponse, throttle_time=0, brokers=brokers,
                cluster_id=broker.cluster_id, controller_id=controller,
                topics=tuple(topics_out), cluster_authorized_operations=acl.cluster_operations(
                    broker, ctx, getattr(request, "include_cluster_authorized_operations",
                                         False)))


def _topic_ids_refused(ctx: RequestContext, request: Any, mod: ModuleType):
    """Topic ids in a Metadata request before v12 are an invalid request (KafkaApis refuses
    them; v10 and v11 carry the field but answer names only, never null): every topic is
    answered INVALID_REQUEST under its name, "" where it had none, as Kafka's error response
    for Metadata does."""
    if ctx.version >= 12 or not request.topics or all(
            t.name is not None and t.topic_id in (None, _NULL_UUID) for t in request.topics):
        return None
    return make(mod.MetadataResponse, throttle_time=0, brokers=(), cluster_id=None,
                controller_id=-1, cluster_authorized_operations=-2147483648, topics=tuple(
                    make(mod.MetadataResponseTopic, error_code=ErrorCode.invalid_request,
                         name=t.name or "", topic_id=t.topic_id or _NULL_UUID,
                         is_internal=False, partitions=())
                    for t in request.topics))


async def handle_metadata(broker: ClusterApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.METADATA, ctx.version)
    refused = _topic_ids_refused(ctx, request, mod) if ctx.version >= 10 else None
    if refused is not None:
        return refused
    return await _metadata(broker, ctx, request, mod)


async def handle_describe_cluster(broker: ClusterApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.DESCRIBE_CLUSTER, ctx.version)
    if getattr(request, "endpoint_type", 1) != 1:
        return make(mod.DescribeClusterResponse, throttle_time=0,
                    error_code=ErrorCode.unsupported_endpoint_type,
                    error_message="only broker endpoints (type 1) are served",
                    endpoint_type=request.endpoint_type, cluster_id=broker.cluster_id,
                    controller_id=-1, brokers=())
    view = broker.metadata.view
    brokers = tuple(make(mod.DescribeClusterBroker, broker_id=b, host=info.host, port=info.port,
                         rack=getattr(info, "rack", None))
                    for b, info in sorted(view.brokers.items()))
    controller = view.controller_id if view.controller_id is not None else -1
    return make(mod.DescribeClusterResponse, throttle_time=0, error_code=0, error_message=None,
                endpoint_type=1, cluster_id=broker.cluster_id, controller_id=controller,
                brokers=brokers, cluster_authorized_operations=acl.cluster_operations(
                    broker, ctx, request.include_cluster_authorized_operations))


# DescribeTopicPartitions (KIP-966): Metadata's partitions, paged, with the eligible leader
# replicas. oncelog elects no leader from an ELR, so both ELR lists are empty (not null), as a
# Kafka broker answers with eligible leader replicas turned off; ``kafka-topics --describe``
# then prints "Elr: " and "LastKnownElr: " as against Kafka.
MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000  # Kafka's max.request.partition.size.limit default


async def handle_describe_topic_partitions(broker: ClusterApiPort, ctx: RequestContext, request: Any
                                              ) -> Any:
    mod = response_module(ApiKey.DESCRIBE_TOPIC_PARTITIONS, ctx.version)
    view = broker.metadata.view
    cursor = request.cursor
    cursor_name = cursor.topic_name if cursor is not None else ""
    fetch_all = not request.topics
    asked = view.topics if fetch_all else {t.name for t in request.topics}
    names = sorted(n for n in asked if n >= cursor_name)
    if not fetch_all and cursor is not None and cursor_name not in names:
        # Kafka: "the topic list should contain the cursor topic" (InvalidRequestException)
        return error_response(response_class(ApiKey.DESCRIBE_TOPIC_PARTITIONS, ctx.version),
                              request, ErrorCode.invalid_request)
    refused = []
    allowed = []
    for name in names:
        if acl.topic(broker, ctx, acl.Op.DESCRIBE, name):
            allowed.append(name)
        elif not fetch_all:  # named and refused: no topic id, not even whether it exists
            refused.append(make(mod.DescribeTopicPartitionsResponseTopic,
                                error_code=ErrorCode.topic_authorization_failed, name=name,
                                topic_id=_NULL_UUID, is_internal=False, partitions=()))
    first_partition = cursor.partition_index if cursor_name in allowed else 0
    budget = max(0, min(MAX_REQUEST_PARTITION_SIZE_LIMIT, request.response_partition_limit))
    topics_out = []
    next_cursor = None
    for i, name in enumerate(allowed):
        if i and i % _YIELD_EVERY == 0:
            await asyncio.sleep(0)
        assignment = view.topics.get(name)
        if assignment is None:
            if not fetch_all:
                topics_out.append(make(mod.DescribeTopicPartitionsResponseTopic,
                                       error_code=ErrorCode.unknown_topic_or_partition,
                                       name=name, topic_id=_NULL_UUID, is_internal=False,
                                       partitions=()))
            continue
        if budget <= 0:  # the page is full: the next one starts with this topic
            next_cursor = make(mod.Cursor, topic_name=name, partition_index=0)
            break
        indexes = sorted(p for p in assignment.partitions
                         if p >= (first_partition if i == 0 else 0))
        parts = []
        for index in indexes:
            if budget <= 0:
                next_cursor = make(mod.Cursor, topic_name=name, partition_index=index)
                break
            budget -= 1
            replicas = assignment.partitions[index]
            found = view.states.get((name, index))
            state = found[0] if found else None
            offline = tuple(r for r in replicas if r not in view.brokers)
            led = state is not None and state.leader >= 0 and state.leader in view.brokers
            parts.append(make(
                mod.DescribeTopicPartitionsResponsePartition,
                error_code=error_code(None if led else ErrorCode.leader_not_available),
                partition_index=index, leader_id=state.leader if led and state else -1,
                leader_epoch=state.leader_epoch if state else -1,
                replica_nodes=tuple(replicas), isr_nodes=tuple(state.isr) if state else (),
                eligible_leader_replicas=(), last_known_elr=(), offline_replicas=offline))
        topics_out.append(make(
            mod.DescribeTopicPartitionsResponseTopic, error_code=0, name=name,
            topic_id=assignment.topic_id, is_internal=name in SHOWN_INTERNAL,
            partitions=tuple(parts),
            topic_authorized_operations=acl.authorized_operations(broker, ctx, acl.R.TOPIC,
                                                                  name)))
        if next_cursor is not None:
            break
    return make(mod.DescribeTopicPartitionsResponse, throttle_time=0,
                topics=tuple(topics_out + refused), next_cursor=next_cursor)
