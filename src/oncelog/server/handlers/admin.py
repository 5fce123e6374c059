"""CreateTopics, DeleteTopics and DescribeConfigs."""

from __future__ import annotations

import uuid

from ...protocol import ApiKey, make, millis, response_module
from ..config import TOPIC_CONFIGS
from ..topics import TopicError
from . import acl
from .util import error_code

_NULL_UUID = uuid.UUID(int=0)

# DescribeConfigs config sources and types (Kafka's DescribeConfigsResponse enums).
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_LIST = 1, 2, 3, 5, 7
_CONFIG_TYPES = {
    "cleanup.policy": TYPE_LIST, "compression.type": TYPE_STRING,
    "message.timestamp.type": TYPE_STRING, "segment.bytes": TYPE_INT,
    "index.interval.bytes": TYPE_INT, "max.message.bytes": TYPE_INT,
    "min.insync.replicas": TYPE_INT,
    "min.cleanable.dirty.ratio": 6,  # DOUBLE
}
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4


async def handle_create_topics(broker, ctx, request):
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
                raise TopicError("topic_authorization_failed", "Create is not allowed")
            if seen[t.name] > 1:
                raise TopicError("invalid_request", f"topic {t.name!r} is listed more than once")
            topic = await broker.metadata.create_topic(
                t.name, num, rf, configs,
                {a.partition_index: list(a.broker_ids) for a in t.assignments} or None,
                validate_only=request.validate_only, timeout_ms=millis(request.timeout))
            num, rf = topic.partition_count, topic.replication_factor
        except TopicError as exc:
            err, msg = exc.error_name, str(exc)
        except OSError as exc:
            err, msg = "kafka_storage_error", f"cannot create topic: {exc}"
        result_configs = ()
        if err is None and hasattr(mod, "CreatableTopicConfigs"):  # v5+ echoes configs
            effective = broker.config.topic_defaults()
            overrides = topic.configs if topic else configs
            effective.update(overrides)
            result_configs = tuple(
                make(mod.CreatableTopicConfigs, name=k, value=v, read_only=False,
                     config_source=SOURCE_DYNAMIC_TOPIC if k in overrides else SOURCE_DEFAULT,
                     is_sensitive=False)
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


async def handle_delete_topics(broker, ctx, request):
    mod = response_module(ApiKey.DELETE_TOPICS, ctx.version)
    results = []
    for name in request.topic_names:
        err, msg = None, None
        try:
            if not acl.topic(broker, ctx, acl.Op.DELETE, name):
                raise TopicError("topic_authorization_failed", "Delete is not allowed")
            await broker.metadata.delete_topic(name, millis(request.timeout))
            broker.fetch_sessions.remove_topic(name)
        except TopicError as exc:
            err, msg = exc.error_name, str(exc)
        results.append(make(mod.DeletableTopicResult, name=name, error_code=error_code(err),
                            error_message=msg))
    return make(mod.DeleteTopicsResponse, throttle_time=0, responses=tuple(results))


def _config_type(name: str) -> int:
    if name in _CONFIG_TYPES:
        return _CONFIG_TYPES[name]
    return TYPE_LONG


async def handle_describe_configs(broker, ctx, request):
    mod = response_module(ApiKey.DESCRIBE_CONFIGS, ctx.version)
    results = []
    for res in request.resources:
        wanted = set(res.configuration_keys) if res.configuration_keys else None
        entries = []
        err, msg = None, None
        # Kafka: DescribeConfigs on the topic, or on the cluster for a broker's settings;
        # refused before anything is looked up, so that neither existence nor values leak.
        if res.resource_type == RESOURCE_TOPIC and not acl.topic(
                broker, ctx, acl.Op.DESCRIBE_CONFIGS, res.resource_name):
            err = "topic_authorization_failed"
        elif res.resource_type == RESOURCE_BROKER and not acl.cluster(
                broker, ctx, acl.Op.DESCRIBE_CONFIGS):
            err = "cluster_authorization_failed"
        elif res.resource_type == RESOURCE_TOPIC:
            topic = broker.topics.get(res.resource_name)
            if topic is None:
                err, msg = "unknown_topic_or_partition", f"topic {res.resource_name!r} not found"
            else:
                defaults = broker.config.topic_defaults()
                for name in sorted(TOPIC_CONFIGS):
                    if wanted is not None and name not in wanted:
                        continue
                    key = TOPIC_CONFIGS[name]
                    overridden = name in topic.configs
                    value = topic.configs[name] if overridden else defaults[name]
                    broker_set = broker.config.values[key.broker_name]
                    synonyms = []
                    if overridden:
                        synonyms.append(make(mod.DescribeConfigsSynonym, name=name, value=value,
                                             source=SOURCE_DYNAMIC_TOPIC))
                    synonyms.append(make(mod.DescribeConfigsSynonym, name=key.broker_name,
                                         value=broker_set, source=SOURCE_DEFAULT))
                    entries.append(make(
                        mod.DescribeConfigsResourceResult, name=name, value=value,
                        read_only=False,
                        config_source=SOURCE_DYNAMIC_TOPIC if overridden else SOURCE_DEFAULT,
                        is_sensitive=False,
                        synonyms=tuple(synonyms) if request.include_synonyms else (),
                        config_type=_config_type(name), documentation=None,
                    ))
        elif res.resource_type == RESOURCE_BROKER:
            if res.resource_name not in ("", str(broker.node_id)):
                err, msg = "invalid_request", f"this broker is node {broker.node_id}"
            else:
                for name, value in sorted(broker.config.values.items()):
                    if wanted is not None and name not in wanted:
                        continue
                    entries.append(make(
                        mod.DescribeConfigsResourceResult, name=name, value=value,
                        read_only=True, config_source=SOURCE_STATIC_BROKER, is_sensitive=False,
                        synonyms=(), config_type=_config_type(name), documentation=None,
                    ))
        else:
            err, msg = "invalid_request", f"unsupported resource type {res.resource_type}"
        results.append(make(mod.DescribeConfigsResult, error_code=error_code(err),
                            error_message=msg, resource_type=res.resource_type,
                            resource_name=res.resource_name, configs=tuple(entries)))
    return make(mod.DescribeConfigsResponse, throttle_time=0, results=tuple(results))
