"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs (KIP-133, KIP-339): topic config
overrides and dynamic broker configs (KIP-226), as Kafka's ConfigAdminManager, ZkAdminManager
and ConfigHelper answer them.

Topics need AlterConfigs / DescribeConfigs on the topic, brokers on the cluster; refused before
anything is looked up, so that neither existence nor values leak. A broker resource is this
broker (named by its node id) or the cluster-wide default (the empty name). Errors as Kafka's:
a repeated resource or config name, a null value, another broker's id, or a broker config that
cannot change (or whose value is bad) is INVALID_REQUEST; an unknown or bad topic config
INVALID_CONFIG, with Kafka's messages.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ...security.acls import Operation
from ..config import (
    BROKER_DEFAULTS,
    TOPIC_CONFIGS,
    ConfigError,
    broker_config_type,
    is_sensitive_broker_config,
    validate_topic_configs,
)
from ..context import RequestContext
from ..dynamic_config import DEFAULT_ENTITY, DYNAMIC_CONFIGS, check_dynamic
from ..ports import AdminApiPort
from ..topic_configs import BY_BROKER_NAME, TYPE_LIST, parse_list
from ..topics import TopicError
from . import acl
from .util import error_code, requester

log = logging.getLogger("oncelog.broker.admin")

RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
# DescribeConfigs' config sources (Kafka's ConfigSource ids).
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


class Refused(Exception):
    def __init__(self, error_name: ErrorCode, message: str | None) -> None:
        super().__init__(message)
        self.error_name = error_name
        self.message = message


def _authorized(broker: AdminApiPort, ctx: RequestContext, kind: int, name: str, op: Operation
                ) -> ErrorCode | None:
    if kind == RESOURCE_TOPIC:
        return None if acl.topic(broker, ctx, op, name) else ErrorCode.topic_authorization_failed
    if kind == RESOURCE_BROKER:
        return None if acl.cluster(broker, ctx, op) else ErrorCode.cluster_authorization_failed
    return None


def _broker_entity(broker: AdminApiPort, name: str) -> str:
    """``<default>`` for the empty name, else this broker's id (INVALID_REQUEST otherwise)."""
    if not name:
        return DEFAULT_ENTITY
    try:
        node = int(name)
    except ValueError:
        raise Refused(ErrorCode.invalid_request, f"Node id must be an integer, but it is: {name}"
                      ) from None
    if node != broker.node_id:
        raise Refused(ErrorCode.invalid_request, f"Unexpected broker id, expected {broker.node_id}, "
                      f"but received {name}")
    return str(node)


def _check_names(resource) -> None:
    names = Counter(c.name for c in resource.configs)
    if any(n > 1 for n in names.values()):
        raise Refused(ErrorCode.invalid_request, "Error due to duplicate config keys")


def _current(broker: AdminApiPort, kind: int, name: str) -> dict[str, str]:
    """A resource's stored configs: a topic's overrides, a broker entity's dynamic ones."""
    if kind == RESOURCE_TOPIC:
        topic = broker.metadata.view.topics.get(name)
        return dict(topic.configs) if topic is not None else {}
    if _broker_entity(broker, name) == DEFAULT_ENTITY:
        return dict(broker.config.dynamic_default)
    return dict(broker.config.dynamic_broker)


async def _alter(broker: AdminApiPort, kind: int, name: str, configs: dict[str, str],
                 validate_only: bool) -> None:
    """Give the resource exactly ``configs`` (checked first; not stored when
    ``validate_only``)."""
    if kind == RESOURCE_TOPIC:
        if not name:
            raise Refused(ErrorCode.invalid_request, "Default topic resources are not allowed.")
        if name not in broker.metadata.view.topics:
            raise Refused(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        unknown = [k for k in configs if k not in TOPIC_CONFIGS]
        if unknown:
            raise Refused(ErrorCode.invalid_config, f"Unknown topic config name: {unknown[0]}")
        try:
            clean = validate_topic_configs(configs, broker.config.topic_defaults())
        except ConfigError as exc:
            raise Refused(ErrorCode.invalid_config, str(exc)) from None  # Kafka 4's (KRaft) words
        if not validate_only:
            try:
                await broker.metadata.alter_topic_configs(name, clean)
            except TopicError as exc:
                raise Refused(exc.error_name, str(exc)) from None
    elif kind == RESOURCE_BROKER:
        entity = _broker_entity(broker, name)
        try:
            clean = check_dynamic(broker.config, configs,
                                  per_broker=entity != DEFAULT_ENTITY)
        except ConfigError as exc:  # KAFKA-13609: INVALID_REQUEST for broker configs
            raise Refused(ErrorCode.invalid_request, str(exc)) from None
        if not validate_only:
            await broker.metadata.alter_broker_configs(entity, clean)
    else:
        raise Refused(ErrorCode.invalid_request, f"Unknown resource type {kind}")


def _logged_resource(kind: int, name: str) -> str:
    if kind == RESOURCE_TOPIC:
        return f"topic {name}"
    return f"broker {name}" if name else "the cluster's brokers (default)"


def _change_text(kind: int, c) -> str:
    """One config of an alter request as the log shows it: ``retention.ms=1000`` (a
    password setting's value hidden), ``-retention.ms`` (deleted), ``+=``/``-=`` (a list
    value appended or subtracted)."""
    op = getattr(c, "config_operation", OP_SET)
    if op == OP_DELETE:
        return f"-{c.name}"
    value = "[hidden]" if kind == RESOURCE_BROKER and is_sensitive_broker_config(c.name) \
        else c.value
    sign = {OP_APPEND: "+=", OP_SUBTRACT: "-="}.get(op, "=")
    return f"{c.name}{sign}{value}"


async def _each(broker: AdminApiPort, ctx: RequestContext, request: Any,
                change: Callable[[Any], Awaitable[None]]
                ) -> list[tuple[Any, ErrorCode | None, str | None]]:
    """(resource, error, message) for every resource: duplicates refused, each authorized,
    then ``change(resource)``."""
    counts = Counter((r.resource_type, r.resource_name) for r in request.resources)
    out = []
    for res in request.resources:
        err, msg = None, None
        try:
            if counts[(res.resource_type, res.resource_name)] > 1:
                raise Refused(ErrorCode.invalid_request, "Each resource must appear at most once.")
            refused = _authorized(broker, ctx, res.resource_type, res.resource_name,
                                  acl.Op.ALTER_CONFIGS)
            if refused:
                raise Refused(refused, None)
            _check_names(res)
            await change(res)
            if not request.validate_only:
                log.info("configs of %s changed (%s) by %s",
                         _logged_resource(res.resource_type, res.resource_name),
                         ", ".join(_change_text(res.resource_type, c) for c in res.configs),
                         requester(ctx))
        except Refused as exc:
            err, msg = exc.error_name, exc.message
        out.append((res, err, msg))
    return out


async def handle_alter_configs(broker: AdminApiPort, ctx: RequestContext, request: Any) -> Any:
    """AlterConfigs: each resource's configs become exactly the ones given."""
    mod = response_module(ApiKey.ALTER_CONFIGS, ctx.version)

    async def change(res) -> None:
        nulls = [c.name for c in res.configs if c.value is None]
        if nulls:
            raise Refused(ErrorCode.invalid_request, f"Null value not supported for : {', '.join(nulls)}")
        await _alter(broker, res.resource_type, res.resource_name,
                     {c.name: c.value for c in res.configs}, request.validate_only)

    results = await _each(broker, ctx, request, change)
    return make(mod.AlterConfigsResponse, throttle_time=0, responses=tuple(
        make(mod.AlterConfigsResourceResponse, error_code=error_code(err), error_message=msg,
             resource_type=res.resource_type, resource_name=res.resource_name)
        for res, err, msg in results))


def _list_default(kind: int, key: str) -> str:
    if kind == RESOURCE_TOPIC:
        spec = TOPIC_CONFIGS[key]
        return BROKER_DEFAULTS[spec.broker_name] if spec.broker_name else str(spec.default)
    return BROKER_DEFAULTS[key]


def _is_list(kind: int, key: str) -> bool:
    if kind == RESOURCE_TOPIC:
        if key not in TOPIC_CONFIGS:
            raise Refused(ErrorCode.invalid_config, f"Unknown topic config name: {key}")
        return TOPIC_CONFIGS[key].config_type == TYPE_LIST
    spec = BY_BROKER_NAME.get(key)
    return spec is not None and spec.config_type == TYPE_LIST


def apply_ops(kind: int, current: dict[str, str], ops) -> dict[str, str]:
    """Kafka's prepareIncrementalConfigs: SET, DELETE, and APPEND / SUBTRACT on list configs
    (from the stored value, else the config's default)."""
    out = dict(current)
    for op in ops:
        key, value = op.name, op.value
        if op.config_operation == OP_SET:
            out[key] = value
        elif op.config_operation == OP_DELETE:
            out.pop(key, None)
        elif op.config_operation in (OP_APPEND, OP_SUBTRACT):
            verb = "append" if op.config_operation == OP_APPEND else "subtract"
            if not _is_list(kind, key):
                raise Refused(ErrorCode.invalid_config,
                              f"Config value {verb} is not allowed for config key: {key}")
            old = parse_list(out[key] if key in out else _list_default(kind, key))
            given = parse_list(value)
            if op.config_operation == OP_APPEND:
                new = old + [v for v in given if v not in old]
            else:
                new = [v for v in old if v not in given]
            out[key] = ",".join(new)
        else:
            raise Refused(ErrorCode.invalid_request,
                          f"Unknown operations type {op.config_operation}")
    return out


async def handle_incremental_alter_configs(broker: AdminApiPort, ctx: RequestContext, request: Any
                                              ) -> Any:
    """IncrementalAlterConfigs: each resource's stored configs changed by the operations."""
    mod = response_module(ApiKey.INCREMENTAL_ALTER_CONFIGS, ctx.version)

    async def change(res) -> None:
        nulls = [c.name for c in res.configs
                 if c.value is None and c.config_operation != OP_DELETE]
        if nulls:
            raise Refused(ErrorCode.invalid_request, f"Null value not supported for : {', '.join(nulls)}")
        if res.resource_type == RESOURCE_TOPIC and res.resource_name and \
                res.resource_name not in broker.metadata.view.topics:
            raise Refused(ErrorCode.unknown_topic_or_partition,
                          f"The topic '{res.resource_name}' does not exist.")
        if res.resource_type not in (RESOURCE_TOPIC, RESOURCE_BROKER):
            raise Refused(ErrorCode.invalid_request, f"Unknown resource type {res.resource_type}")
        current = _current(broker, res.resource_type, res.resource_name)
        configs = apply_ops(res.resource_type, current, res.configs)
        await _alter(broker, res.resource_type, res.resource_name, configs,
                     request.validate_only)

    results = await _each(broker, ctx, request, change)
    return make(mod.IncrementalAlterConfigsResponse, throttle_time=0, responses=tuple(
        make(mod.AlterConfigsResourceResponse, error_code=error_code(err), error_message=msg,
             resource_type=res.resource_type, resource_name=res.resource_name)
        for res, err, msg in results))


# -- DescribeConfigs ------------------------------------------------------------------------------


def _broker_synonyms(config, name: str) -> list[tuple[str, str, int]]:
    """(name, value, source) of a broker setting, highest precedence first (Kafka's
    ConfigHelper.configSynonyms)."""
    out = []
    for layer, source in ((config.dynamic_broker, SOURCE_DYNAMIC_BROKER),
                          (config.dynamic_default, SOURCE_DYNAMIC_DEFAULT_BROKER),
                          (config.static, SOURCE_STATIC_BROKER),
                          (BROKER_DEFAULTS, SOURCE_DEFAULT)):
        if name in layer:
            out.append((name, layer[name], source))
    return out


def _entry(mod: ModuleType, request: Any, name: str, value: str | None, synonyms, *,
           read_only: bool,
           config_type: int):
    source = synonyms[0][2] if synonyms else SOURCE_DEFAULT
    sensitive = is_sensitive_broker_config(name)
    if sensitive:  # Kafka's PASSWORD settings: neither the value nor its synonyms' values
        value = None
        synonyms = [(n, None, s) for n, _v, s in synonyms]
    return make(mod.DescribeConfigsResourceResult, name=name, value=value, read_only=read_only,
                config_source=source, is_sensitive=sensitive,
                synonyms=tuple(make(mod.DescribeConfigsSynonym, name=n, value=v, source=s)
                               for n, v, s in synonyms) if request.include_synonyms else (),
                config_type=config_type, documentation=None)


# Broker settings Kafka leaves unset (null) by default, their value coming from another
# (log.retention.hours, log.roll.hours, ...): a topic's synonyms name no default for them there.
_KAFKA_UNSET_BY_DEFAULT = frozenset({"log.retention.ms", "log.roll.ms", "log.roll.jitter.ms",
                                     "log.flush.interval.ms"})


def topic_synonyms(config, overrides: dict[str, str], name: str) -> list[tuple[str, str, int]]:
    """A topic config's (name, value, source), highest precedence first: the topic's
    override, then its broker setting's layers (Kafka's createTopicConfigEntry). The first is
    the value in force; none: the config's own default (DEFAULT_CONFIG)."""
    key = TOPIC_CONFIGS[name]
    synonyms = _broker_synonyms(config, key.broker_name) if key.broker_name else []
    if name in overrides:
        synonyms.insert(0, (name, overrides[name], SOURCE_DYNAMIC_TOPIC))
    return synonyms


def _describe_topic(broker: AdminApiPort, mod: ModuleType, request: Any, name: str, wanted) -> list:
    topic = broker.metadata.view.topics.get(name)
    if topic is None:
        raise Refused(ErrorCode.unknown_topic_or_partition, f"topic {name!r} not found")
    overrides = dict(topic.configs)
    entries = []
    for key_name in sorted(TOPIC_CONFIGS):
        if wanted is not None and key_name not in wanted:
            continue
        synonyms = topic_synonyms(broker.config, overrides, key_name)
        value = synonyms[0][1] if synonyms else str(TOPIC_CONFIGS[key_name].default)
        if TOPIC_CONFIGS[key_name].broker_name in _KAFKA_UNSET_BY_DEFAULT:
            synonyms = [s for s in synonyms if s[2] != SOURCE_DEFAULT]
        entries.append(_entry(mod, request, key_name, value, synonyms, read_only=False,
                              config_type=TOPIC_CONFIGS[key_name].config_type))
    return entries


def _describe_broker(broker: AdminApiPort, mod: ModuleType, request: Any, name: str, wanted) -> list:
    config = broker.config
    per_broker = _broker_entity(broker, name) != DEFAULT_ENTITY
    names = config.values if per_broker else config.dynamic_default
    entries = []
    for key in sorted(names):
        if wanted is not None and key not in wanted:
            continue
        synonyms = _broker_synonyms(config, key)
        if not per_broker:  # the default resource shows the cluster-wide dynamic layer only
            synonyms = [s for s in synonyms if s[2] == SOURCE_DYNAMIC_DEFAULT_BROKER]
        entries.append(_entry(mod, request, key, names[key], synonyms,
                              read_only=key not in DYNAMIC_CONFIGS,
                              config_type=broker_config_type(key)))
    return entries


async def handle_describe_configs(broker: AdminApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.DESCRIBE_CONFIGS, ctx.version)
    results = []
    for res in request.resources:
        wanted = set(res.configuration_keys) if res.configuration_keys else None
        entries: list = []
        err, msg = None, None
        try:
            refused = _authorized(broker, ctx, res.resource_type, res.resource_name,
                                  acl.Op.DESCRIBE_CONFIGS)
            if refused:
                raise Refused(refused, None)
            if res.resource_type == RESOURCE_TOPIC:
                entries = _describe_topic(broker, mod, request, res.resource_name, wanted)
            elif res.resource_type == RESOURCE_BROKER:
                entries = _describe_broker(broker, mod, request, res.resource_name, wanted)
            else:
                raise Refused(ErrorCode.invalid_request,
                              f"unsupported resource type {res.resource_type}")
        except Refused as exc:
            err, msg = exc.error_name, exc.message
        results.append(make(mod.DescribeConfigsResult, error_code=error_code(err),
                            error_message=msg, resource_type=res.resource_type,
                            resource_name=res.resource_name, configs=tuple(entries)))
    return make(mod.DescribeConfigsResponse, throttle_time=0, results=tuple(results))


# -- DescribeClientQuotas (KIP-546) --------------------------------------------------------------
# oncelog enforces no client quotas and stores none (AlterClientQuotas is not offered), so every
# filter matches nothing: an empty answer, as Kafka's with no quota set. kafka-configs asks it
# whenever it describes users (beside their SCRAM credentials).
_QUOTA_ENTITY_TYPES = ("user", "client-id", "ip")


async def handle_describe_client_quotas(broker: AdminApiPort, ctx: RequestContext, request: Any
                                           ) -> Any:
    mod = response_module(ApiKey.DESCRIBE_CLIENT_QUOTAS, ctx.version)

    def refused(name: ErrorCode, message: str) -> Any:
        return make(mod.DescribeClientQuotasResponse, throttle_time=0,
                    error_code=error_code(name), error_message=message, entries=None)

    if not acl.cluster(broker, ctx, acl.Op.DESCRIBE_CONFIGS):
        return refused(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    for component in request.components:
        if component.entity_type not in _QUOTA_ENTITY_TYPES:
            return refused(ErrorCode.invalid_request,
                           f"Custom entity type '{component.entity_type}' not supported")
    return make(mod.DescribeClientQuotasResponse, throttle_time=0, error_code=0,
                error_message=None, entries=())
