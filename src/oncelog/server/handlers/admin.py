"""CreateTopics and DeleteTopics (DescribeConfigs: handlers/configs.py)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, millis, response_module
from ..context import RequestContext
from ..ports import AdminApiPort
from ..topics import TopicError
from . import acl
from .configs import SOURCE_DEFAULT, topic_synonyms
from .util import error_code, requester

log = logging.getLogger("oncelog.broker.admin")

_NULL_UUID = uuid.UUID(int=0)


def _source(broker: AdminApiPort, overrides: dict, name: str) -> int:
    """Where a created topic's config comes from, as DescribeConfigs says it."""
    synonyms = topic_synonyms(broker.config, overrides, name)
    return synonyms[0][2] if synonyms else SOURCE_DEFAULT


async def handle_create_topics(broker: AdminApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.CREATE_TOPICS, ctx.version)
    results = []
    seen: dict[str, int] = {}
    for t in request.topics:
        seen[t.name] = seen.get(t.name, 0) + 1
    for t in request.topics:
        num = t.num_partitions
        rf = t.replication_factor
        configs = {c.name: c.value for c in t.configs}
        err, msg, topic = None, None, None
        try:
            if not (acl.cluster(broker, ctx, acl.Op.CREATE)
                    or acl.topic(broker, ctx, acl.Op.CREATE, t.name)):
                raise TopicError(ErrorCode.topic_authorization_failed, "Create is not allowed")
            if seen[t.name] > 1:
                raise TopicError(ErrorCode.invalid_request, f"topic {t.name!r} is listed more than once")
            topic = await broker.metadata.create_topic(
                t.name, num, rf, configs,
                {a.partition_index: list(a.broker_ids) for a in t.assignments} or None,
                validate_only=request.validate_only, timeout_ms=millis(request.timeout))
            num, rf = topic.partition_count, topic.replication_factor
            if not request.validate_only:
                log.info("topic %s created (%d partition%s, replication factor %d%s) by %s",
                         t.name, num, "" if num == 1 else "s", rf,
                         "".join(f", {k}={v}" for k, v in sorted(topic.configs.items())),
                         requester(ctx))
        except TopicError as exc:
            err, msg = exc.error_name, str(exc)
        except OSError as exc:
            err, msg = ErrorCode.kafka_storage_error, f"cannot create topic: {exc}"
        result_configs = ()
        if err is None and hasattr(mod, "CreatableTopicConfigs"):  # v5+ echoes configs
            effective = broker.config.topic_defaults()
            overrides = topic.configs if topic else configs
            effective.update(overrides)
            result_configs = tuple(
                make(mod.CreatableTopicConfigs, name=k, value=v, read_only=False,
                     config_source=_source(broker, overrides, k), is_sensitive=False)
                for k, v in sorted(effective.items())
            )
        results.append(make(
            mod.CreatableTopicResult, name=t.name,
            topic_id=topic.topic_id if topic else _NULL_UUID, error_code=error_code(err),
            error_message=msg, topic_config_error_code=0,
            num_partitions=num if err is None else -1,
            replication_factor=rf if err is None else -1, configs=result_configs,
        ))
    return make(mod.CreateTopicsResponse, throttle_time=0, topics=tuple(results))


def _delete_targets(broker: AdminApiPort, request: Any):
    """(name or None, requested topic id or None) per topic: v6 names a topic by name or by
    id (KIP-516), an id resolved through the metadata's view (None: no such topic)."""
    if not hasattr(request, "topics"):
        return [(name, None) for name in request.topic_names]
    names = broker.metadata.view.topic_names
    out = []
    for t in request.topics:
        topic_id = t.topic_id if t.topic_id is not None and t.topic_id.int else None
        out.append((t.name, None) if topic_id is None else (names.get(topic_id), topic_id))
    return out


async def handle_delete_topics(broker: AdminApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.DELETE_TOPICS, ctx.version)
    if hasattr(request, "topics") and any(
            t.name is not None and t.topic_id is not None and t.topic_id.int
            for t in request.topics):
        # Kafka's InvalidRequestException, answered for every topic of the request.
        return make(mod.DeleteTopicsResponse, throttle_time=0, responses=tuple(
            make(mod.DeletableTopicResult, name=t.name, topic_id=t.topic_id or _NULL_UUID,
                 error_code=ErrorCode.invalid_request,
                 error_message="Topic name and topic ID can not both be specified.")
            for t in request.topics))
    results = []
    for name, topic_id in _delete_targets(broker, request):
        err, msg = None, None
        try:
            if topic_id is not None and name is None:
                raise TopicError(ErrorCode.unknown_topic_id, f"no topic has id {topic_id}")
            if topic_id is not None and not acl.topic(broker, ctx, acl.Op.DESCRIBE, name):
                # Kafka: the id is not secret, the name of a topic one may not describe is.
                name = None
                raise TopicError(ErrorCode.topic_authorization_failed, "Describe is not allowed")
            if not acl.topic(broker, ctx, acl.Op.DELETE, name):
                raise TopicError(ErrorCode.topic_authorization_failed, "Delete is not allowed")
            deleted = broker.metadata.view.topics.get(name)
            await broker.metadata.delete_topic(name, millis(request.timeout))
            if topic_id is None and deleted is not None:
                topic_id = deleted.topic_id  # as Kafka: a topic deleted by name, with its id
            broker.fetch_sessions.remove_topic(name)
            log.info("topic %s deleted by %s", name, requester(ctx))
        except TopicError as exc:
            err, msg = exc.error_name, str(exc)
        results.append(make(mod.DeletableTopicResult, name=name,
                            topic_id=topic_id or _NULL_UUID, error_code=error_code(err),
                            error_message=msg))
    return make(mod.DeleteTopicsResponse, throttle_time=0, responses=tuple(results))
