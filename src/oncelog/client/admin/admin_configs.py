"""The Admin client's config calls (Kafka's Admin.describeConfigs, alterConfigs and
incrementalAlterConfigs): topic overrides and dynamic broker configs.

A broker resource named by a node id goes to that broker (only it can change or show its own
settings); the cluster-wide default (a broker resource with the empty name) and topics go to
any broker. Each call raises the ``oncelog.errors`` class of the first resource's error
(InvalidConfigError, InvalidRequestError, UnknownTopicOrPartitionError,
TopicAuthorizationFailedError ...) after every resource was answered.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import error_for_code
from ...protocol import ApiKey
from ..network import NetworkClient


class ConfigResourceType(enum.IntEnum):
    """Kafka's ConfigResource.Type ids."""

    TOPIC = 2
    BROKER = 4


class ConfigSource(enum.IntEnum):
    """Where a config's value comes from (Kafka's ConfigEntry.ConfigSource ids)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6


class OpType(enum.IntEnum):
    """IncrementalAlterConfigs' operations (Kafka's AlterConfigOp.OpType)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True)
class ConfigResource:
    """A topic (``ConfigResource.topic("orders")``), a broker (``ConfigResource.broker(1)``)
    or the brokers' cluster-wide default (``ConfigResource.broker_default()``)."""

    type: ConfigResourceType
    name: str

    @classmethod
    def topic(cls, name: str) -> ConfigResource:
        """A topic's configs."""
        return cls(ConfigResourceType.TOPIC, name)

    @classmethod
    def broker(cls, node_id: int | str) -> ConfigResource:
        """One broker's configs (its dynamic overrides when altered)."""
        return cls(ConfigResourceType.BROKER, str(node_id))

    @classmethod
    def broker_default(cls) -> ConfigResource:
        """The cluster-wide dynamic broker defaults (Kafka's --entity-default)."""
        return cls(ConfigResourceType.BROKER, "")


@dataclass(frozen=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True)
class ConfigEntry:
    name: str
    value: str | None
    source: ConfigSource
    read_only: bool
    is_sensitive: bool = False
    synonyms: tuple[ConfigSynonym, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class AlterConfigOp:
    """One change of IncrementalAlterConfigs: set a value, delete an override (back to the
    default), or add to / remove from a list config (``cleanup.policy``)."""

    name: str
    value: str | None
    op: OpType = OpType.SET


def _node_for(resource: ConfigResource) -> int | None:
    if resource.type == ConfigResourceType.BROKER and resource.name:
        return int(resource.name)
    return None


@dataclass(frozen=True)
class AdminCall:
    """What a config call needs of the Admin client: its network client, the call's deadline
    (monotonic seconds) and a way to refresh the cluster's metadata."""

    net: NetworkClient
    deadline: float
    refresh_metadata: Callable[[], Any]


def _by_node(call: AdminCall, resources: Iterable[ConfigResource]
             ) -> dict[int | None, list[ConfigResource]]:
    out: dict[int | None, list[ConfigResource]] = {}
    for r in resources:
        out.setdefault(_node_for(r), []).append(r)
    if any(n is not None and n not in call.net.cluster.brokers for n in out):
        call.refresh_metadata()  # where the brokers named are
    # A node the cluster does not have: any broker answers (INVALID_REQUEST, naming itself).
    unknown = [n for n in out if n is not None and n not in call.net.cluster.brokers]
    for n in unknown:
        out.setdefault(None, []).extend(out.pop(n))
    return out


def _raise_first(results: Iterable[Any], verb: str) -> None:
    for result in results:
        code = int(result.error_code)
        if code:
            raise error_for_code(code)(
                f"cannot {verb} configs of {ConfigResourceType(result.resource_type).name.lower()}"
                f" {result.resource_name!r}"
                + (f": {result.error_message}" if result.error_message else ""))


def describe_configs(call: AdminCall, resources: Iterable[ConfigResource],
                     include_synonyms: bool = False
                     ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
    out: dict[ConfigResource, dict[str, ConfigEntry]] = {}
    for node, group in _by_node(call, resources).items():
        response = call.net.request_any(ApiKey.DESCRIBE_CONFIGS, {
            "resources": [{"resource_type": int(r.type), "resource_name": r.name,
                           "configuration_keys": None} for r in group],
            "include_synonyms": include_synonyms, "include_documentation": False},
            call.deadline, node_id=node)
        _raise_first(response.results, "describe")
        for result in response.results:
            resource = ConfigResource(ConfigResourceType(result.resource_type),
                                      result.resource_name)
            out[resource] = {c.name: ConfigEntry(
                c.name, c.value, ConfigSource(int(c.config_source)), bool(c.read_only),
                bool(c.is_sensitive), tuple(ConfigSynonym(s.name, s.value, ConfigSource(s.source))
                                            for s in c.synonyms))
                for c in result.configs}
    return out


def alter_configs(call: AdminCall, configs: Mapping[ConfigResource, Mapping[str, str]],
                  validate_only: bool = False) -> None:
    """AlterConfigs: each resource's overrides become exactly ``configs[resource]``."""
    for node, group in _by_node(call, configs).items():
        response = call.net.request_any(ApiKey.ALTER_CONFIGS, {
            "resources": [{"resource_type": int(r.type), "resource_name": r.name,
                           "configs": [{"name": k, "value": str(v)}
                                       for k, v in configs[r].items()]} for r in group],
            "validate_only": validate_only}, call.deadline, node_id=node)
        _raise_first(response.responses, "alter")


def incremental_alter_configs(call: AdminCall,
                              changes: Mapping[ConfigResource, Iterable[AlterConfigOp]],
                              validate_only: bool = False) -> None:
    """IncrementalAlterConfigs: the operations applied to each resource's stored configs."""
    for node, group in _by_node(call, changes).items():
        response = call.net.request_any(ApiKey.INCREMENTAL_ALTER_CONFIGS, {
            "resources": [{"resource_type": int(r.type), "resource_name": r.name,
                           "configs": [{"name": op.name, "config_operation": int(op.op),
                                        "value": None if op.value is None else str(op.value)}
                                       for op in changes[r]]} for r in group],
            "validate_only": validate_only}, call.deadline, node_id=node)
        _raise_first(response.responses, "alter")
