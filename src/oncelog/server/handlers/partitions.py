"""CreatePartitions (a topic grows) and DeleteRecords (a partition's log start moves, KIP-107)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, millis, response_module
from ..context import RequestContext
from ..ports import AdminApiPort
from ..replication import ReplicationError
from ..topics import INTERNAL_TOPICS, TopicError
from . import acl
from .util import error_code, requester

log = logging.getLogger("oncelog.broker.admin")


async def handle_create_partitions(broker: AdminApiPort, ctx: RequestContext, request: Any) -> Any:
    """Kafka's handleCreatePartitionsRequest: a topic named twice is INVALID_REQUEST, Alter on
    the topic is needed (TOPIC_AUTHORIZATION_FAILED); the metadata checks and places the new
    partitions (server/metadata.py ``plan_new_partitions``)."""
    mod = response_module(ApiKey.CREATE_PARTITIONS, ctx.version)
    seen = Counter(t.name for t in request.topics)
    results = []
    for t in request.topics:
        err, msg = None, None
        try:
            if seen[t.name] > 1:
                raise TopicError(ErrorCode.invalid_request, "Duplicate topic in request.")
            if not acl.topic(broker, ctx, acl.Op.ALTER, t.name):
                raise TopicError(ErrorCode.topic_authorization_failed, "Authorization failed.")
            assignment = None if t.assignments is None else \
                [list(a.broker_ids) for a in t.assignments]
            await broker.metadata.create_partitions(
                t.name, t.count, assignment, validate_only=request.validate_only,
                timeout_ms=millis(request.timeout))
            if not request.validate_only:
                log.info("topic %s: partitions increased to %d by %s", t.name, t.count,
                         requester(ctx))
        except TopicError as exc:
            err, msg = exc.error_name, str(exc)
        results.append(make(mod.CreatePartitionsTopicResult, name=t.name,
                            error_code=error_code(err), error_message=msg))
    return make(mod.CreatePartitionsResponse, throttle_time=0, results=tuple(results))


async def handle_delete_records(broker: AdminApiPort, ctx: RequestContext, request: Any) -> Any:
    """Kafka's handleDeleteRecordsRequest: Delete on the topic (TOPIC_AUTHORIZATION_FAILED),
    UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist, INVALID_TOPIC_EXCEPTION for
    the internal topics (the coordinators' logs); the leader moves its log
    start offset and answers once every live replica has moved past it too (the low
    watermark), or REQUEST_TIMED_OUT at the request's timeout."""
    mod = response_module(ApiKey.DELETE_RECORDS, ctx.version)
    timeout_ms = millis(request.timeout)
    allowed = acl.topics_checker(broker, ctx, acl.Op.DELETE)

    async def one(topic: str, index: int, offset: int) -> tuple[int, ErrorCode | None]:
        if not allowed(topic):
            return -1, ErrorCode.topic_authorization_failed
        view = broker.metadata.view
        t = view.topics.get(topic) if view is not None else None
        if t is None or index not in t.partitions:
            return -1, ErrorCode.unknown_topic_or_partition
        if topic in INTERNAL_TOPICS:  # Kafka: "Cannot delete records of internal topic"
            return -1, ErrorCode.invalid_topic_exception
        try:
            return await broker.replication.delete_records(topic, index, offset, timeout_ms), \
                None
        except ReplicationError as exc:
            return -1, exc.error_name

    asked = [(t.name, p.partition_index, p.offset) for t in request.topics
             for p in t.partitions]
    answers = await asyncio.gather(*(one(*a) for a in asked))
    by_topic: dict[str, list] = {}
    for (topic, index, _offset), (low, err) in zip(asked, answers, strict=True):
        by_topic.setdefault(topic, []).append(make(
            mod.DeleteRecordsPartitionResult, partition_index=index, low_watermark=low,
            error_code=error_code(err)))
    return make(mod.DeleteRecordsResponse, throttle_time=0, topics=tuple(
        make(mod.DeleteRecordsTopicResult, name=name, partitions=tuple(parts))
        for name, parts in by_topic.items()))
