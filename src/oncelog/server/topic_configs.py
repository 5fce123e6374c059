"""Every topic config Kafka knows (its TopicConfig / LogConfig list, Kafka 3.9), with Kafka's
types, ranges and enums, and the broker setting each one defaults to
(ServerTopicConfigSynonyms).

A value is checked as Kafka's ConfigDef checks it: parsed as its type (INT within 32 bits,
LONG within 64, BOOLEAN ``true``/``false`` in any case, LIST comma-separated), then against its
validator; a ConfigError carries Kafka's message ("Invalid value X for configuration Y: ...").
``log_field`` names the ``LogConfig`` attribute the parsed value goes into (log/log.py); configs
without one are stored and described only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..log.log_config import MAX_LONG

MIN_LONG = -(2**63)
MAX_INT = 2**31 - 1
MIN_INT = -(2**31)

# DescribeConfigs' config types (Kafka's DescribeConfigsResponse.ConfigType).
TYPE_BOOLEAN, TYPE_STRING, TYPE_INT, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST = 1, 2, 3, 5, 6, 7


class ConfigError(ValueError):
    pass


_NUMBER = re.compile(r"^[+-]?\d+$")


def _invalid(name: str, value: str, why: str) -> ConfigError:
    return ConfigError(f"Invalid value {value} for configuration {name}: {why}")


def _parse_int(name: str, value: str, lo: int, hi: int, type_name: str) -> int:
    text = value.strip()
    if not _NUMBER.match(text) or not lo <= int(text) <= hi:
        raise _invalid(name, value, f"Not a number of type {type_name.upper()}")
    return int(text)


def parse_list(value: str) -> list[str]:
    """Kafka's LIST: comma-separated, each item trimmed; empty text is the empty list. The
    bracketed form kafka-configs takes on its command line ([compact,delete]) is read too."""
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if not text.strip():
        return []
    return [item.strip() for item in text.split(",")]


@dataclass(frozen=True)
class TopicConfigKey:
    name: str  # the topic-level name
    broker_name: str | None  # the broker setting it defaults to (None: Kafka has none)
    config_type: int  # DescribeConfigs' type
    check: Callable[[str, str], object]  # (name, value) -> the parsed value, or ConfigError
    log_field: str | None = None  # the LogConfig attribute it sets, if any
    default: str | None = None  # the default of a config without a broker setting

    def parse(self, value: str) -> object:
        return self.check(self.name, value)


def _ranged(kind: str, type_lo: int, type_hi: int, lo: int, hi: int
            ) -> Callable[[str, str], int]:
    """A Java ``kind`` (int or long) config within [lo, hi], with Kafka's messages."""
    def check(name: str, value: str) -> int:
        n = _parse_int(name, value, type_lo, type_hi, kind)
        if n < lo:
            raise _invalid(name, value, f"Value must be at least {lo}")
        if n > hi:
            raise _invalid(name, value, f"Value must be no more than {hi}")
        return n
    return check


def _int(lo: int = MIN_INT, hi: int = MAX_INT) -> Callable[[str, str], int]:
    return _ranged("int", MIN_INT, MAX_INT, lo, hi)


def _long(lo: int = MIN_LONG, hi: int = MAX_LONG) -> Callable[[str, str], int]:
    return _ranged("long", MIN_LONG, MAX_LONG, lo, hi)


def _double(lo: float, hi: float) -> Callable[[str, str], float]:
    def check(name: str, value: str) -> float:
        try:
            x = float(value.strip())
        except ValueError:
            raise _invalid(name, value, "Not a number of type DOUBLE") from None
        if math.isnan(x) or not lo <= x <= hi:
            raise _invalid(name, value, f"Value must be between {lo} and {hi}")
        return x
    return check


def _boolean(name: str, value: str) -> bool:
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise _invalid(name, value, "Expected value to be either true or false")
    return text == "true"


def _one_of(*allowed: str) -> Callable[[str, str], str]:
    def check(name: str, value: str) -> str:
        text = value.strip()
        if text not in allowed:
            raise _invalid(name, value, f"String must be one of: {', '.join(allowed)}")
        return text
    return check


def _list_of(*allowed: str) -> Callable[[str, str], frozenset[str]]:
    def check(name: str, value: str) -> frozenset[str]:
        items = parse_list(value)
        for item in items:
            if item not in allowed:
                raise _invalid(name, value, f"String must be one of: {', '.join(allowed)}")
        return frozenset(items)
    return check


def _disabled_feature(why: str) -> Callable[[str, str], bool]:
    """A boolean this broker accepts only as false (Kafka refuses true without the feature)."""
    def check(name: str, value: str) -> bool:
        if _boolean(name, value):
            raise ConfigError(why)
        return False
    return check


_THROTTLED = re.compile(r"^\d+:\d+$")


def _throttled_replicas(name: str, value: str) -> str:
    """Kafka's ThrottledReplicaListValidator: ``*`` or partition:broker pairs."""
    items = parse_list(value)
    if items == ["*"] or all(_THROTTLED.match(i) for i in items):
        return ",".join(items)
    raise _invalid(name, value, "must be the literal '*' or a list of replicas in the following "
                   "format: [partitionId]:[brokerId],[partitionId]:[brokerId],...")


# Kafka's MetadataVersion.fromVersionString: "3.9", "3.9-IV0", "0.10.0" and the four-part
# "0.10.0.0" (old versions, a leading 0) are versions; message.format.version is ignored since
# 3.0 (KIP-724) but still checked.
_VERSION = re.compile(r"^(\d+\.\d+(\.\d+)?|0\.\d+\.\d+\.\d+)(-IV\d+)?$")


def _message_format_version(name: str, value: str) -> str:
    if not _VERSION.match(value.strip()):
        raise _invalid(name, value, f"Version `{value}` is not a valid version")
    return value.strip()


def _gzip_level(name: str, value: str) -> int:
    n = _parse_int(name, value, MIN_INT, MAX_INT, "int")
    if n != -1 and not 1 <= n <= 9:
        raise _invalid(name, value, "Value must be between 1 and 9, or -1 for the default")
    return n


COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")

_K = TopicConfigKey
_L = TYPE_LONG

TOPIC_CONFIGS: dict[str, TopicConfigKey] = {k.name: k for k in [
    _K("segment.bytes", "log.segment.bytes", TYPE_INT, _int(14), "segment_bytes"),
    _K("segment.ms", "log.roll.ms", _L, _long(1), "segment_ms"),
    _K("segment.jitter.ms", "log.roll.jitter.ms", _L, _long(0), "segment_jitter_ms"),
    _K("segment.index.bytes", "log.index.size.max.bytes", TYPE_INT, _int(4)),
    _K("flush.messages", "log.flush.interval.messages", _L, _long(1), "flush_messages"),
    _K("flush.ms", "log.flush.interval.ms", _L, _long(0), "flush_ms"),
    _K("retention.bytes", "log.retention.bytes", _L, _long(), "retention_bytes"),
    _K("retention.ms", "log.retention.ms", _L, _long(-1), "retention_ms"),
    _K("max.message.bytes", "message.max.bytes", TYPE_INT, _int(0), "max_message_bytes"),
    _K("index.interval.bytes", "log.index.interval.bytes", TYPE_INT, _int(0),
       "index_interval_bytes"),
    _K("file.delete.delay.ms", "log.segment.delete.delay.ms", _L, _long(0)),
    _K("unclean.leader.election.enable", "unclean.leader.election.enable", TYPE_BOOLEAN,
       _boolean),
    _K("min.insync.replicas", "min.insync.replicas", TYPE_INT, _int(1), "min_insync_replicas"),
    _K("compression.type", "compression.type", TYPE_STRING, _one_of(*COMPRESSION_TYPES),
       "compression_type"),
    _K("compression.gzip.level", "compression.gzip.level", TYPE_INT, _gzip_level,
       "compression_gzip_level"),
    _K("compression.lz4.level", "compression.lz4.level", TYPE_INT, _int(1, 17),
       "compression_lz4_level"),
    _K("compression.zstd.level", "compression.zstd.level", TYPE_INT, _int(-131072, 22),
       "compression_zstd_level"),
    _K("preallocate", "log.preallocate", TYPE_BOOLEAN, _boolean),
    _K("message.format.version", "log.message.format.version", TYPE_STRING,
       _message_format_version),
    _K("message.timestamp.type", "log.message.timestamp.type", TYPE_STRING,
       _one_of("CreateTime", "LogAppendTime"), "message_timestamp_type"),
    _K("message.timestamp.difference.max.ms", "log.message.timestamp.difference.max.ms", _L,
       _long(0), "message_timestamp_difference_max_ms"),
    _K("message.timestamp.before.max.ms", "log.message.timestamp.before.max.ms", _L, _long(0),
       "message_timestamp_before_max_ms"),
    _K("message.timestamp.after.max.ms", "log.message.timestamp.after.max.ms", _L, _long(0),
       "message_timestamp_after_max_ms"),
    _K("message.downconversion.enable", "log.message.downconversion.enable", TYPE_BOOLEAN,
       _boolean),
    _K("leader.replication.throttled.replicas", None, TYPE_LIST, _throttled_replicas,
       default=""),
    _K("follower.replication.throttled.replicas", None, TYPE_LIST, _throttled_replicas,
       default=""),
    # Tiered storage (KIP-405): this broker has no remote storage, so, as a Kafka broker with
    # remote.log.storage.system.enable=false, it refuses to turn it on for a topic.
    _K("remote.storage.enable", None, TYPE_BOOLEAN, _disabled_feature(
        "Tiered Storage functionality is disabled in the broker. Topic cannot be configured "
        "with remote log storage."), default="false"),
    _K("local.retention.ms", "log.local.retention.ms", _L, _long(-2)),
    _K("local.retention.bytes", "log.local.retention.bytes", _L, _long(-2)),
    _K("remote.log.copy.disable", None, TYPE_BOOLEAN, _disabled_feature(
        "It is invalid to set `remote.log.delete.on.disable` or `remote.log.copy.disable` under "
        "Zookeeper's mode."), default="false"),
    _K("remote.log.delete.on.disable", None, TYPE_BOOLEAN, _disabled_feature(
        "It is invalid to set `remote.log.delete.on.disable` or `remote.log.copy.disable` under "
        "Zookeeper's mode."), default="false"),
]}

# -- compaction (the log cleaner, log/cleaner: reads these LogConfig fields) -------------------
# cleanup.policy, delete.retention.ms, min.cleanable.dirty.ratio, min.compaction.lag.ms and
# max.compaction.lag.ms: accepted, validated, stored, described and passed into LogConfig.
COMPACTION_CONFIGS: dict[str, TopicConfigKey] = {k.name: k for k in [
    _K("cleanup.policy", "log.cleanup.policy", TYPE_LIST, _list_of("compact", "delete"),
       "cleanup_policy"),
    _K("delete.retention.ms", "log.cleaner.delete.retention.ms", _L, _long(0),
       "delete_retention_ms"),
    _K("min.cleanable.dirty.ratio", "log.cleaner.min.cleanable.ratio", TYPE_DOUBLE,
       _double(0, 1), "min_cleanable_dirty_ratio"),
    _K("min.compaction.lag.ms", "log.cleaner.min.compaction.lag.ms", _L, _long(0),
       "min_compaction_lag_ms"),
    _K("max.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms", _L, _long(1),
       "max_compaction_lag_ms"),
]}
TOPIC_CONFIGS.update(COMPACTION_CONFIGS)
# -- end of compaction ---------------------------------------------------------------------------

# The broker settings behind the topic configs, with Kafka's defaults (KafkaConfig's).
TOPIC_SYNONYM_DEFAULTS: dict[str, str] = {
    "log.cleanup.policy": "delete",
    "compression.type": "producer",
    "compression.gzip.level": "-1",
    "compression.lz4.level": "9",
    "compression.zstd.level": "3",
    "log.retention.ms": str(7 * 24 * 3600 * 1000),
    "log.retention.bytes": "-1",
    "log.segment.bytes": str(1 << 30),
    "log.roll.ms": str(7 * 24 * 3600 * 1000),
    "log.roll.jitter.ms": "0",
    "log.index.size.max.bytes": str(10 * 1024 * 1024),
    "log.index.interval.bytes": "4096",
    "log.flush.interval.messages": str(MAX_LONG),
    "log.flush.interval.ms": str(MAX_LONG),
    "log.segment.delete.delay.ms": "60000",
    "unclean.leader.election.enable": "false",
    "log.preallocate": "false",
    "log.message.format.version": "3.0-IV1",
    "log.message.timestamp.type": "CreateTime",
    "log.message.timestamp.difference.max.ms": str(MAX_LONG),
    # KIP-937 (Kafka 3.6): how far a CreateTime record's timestamp may lie before / after the
    # broker's clock (INVALID_TIMESTAMP otherwise); Kafka 4.0's defaults: unbounded, one hour.
    "log.message.timestamp.before.max.ms": str(MAX_LONG),
    "log.message.timestamp.after.max.ms": "3600000",
    "log.message.downconversion.enable": "true",
    "log.local.retention.ms": "-2",
    "log.local.retention.bytes": "-2",
    "message.max.bytes": "1048588",
    "min.insync.replicas": "1",
    "log.cleaner.delete.retention.ms": "86400000",
    "log.cleaner.min.cleanable.ratio": "0.5",
    "log.cleaner.min.compaction.lag.ms": "0",
    "log.cleaner.max.compaction.lag.ms": str(MAX_LONG),
}

# The topic config each broker setting is the default of.
BY_BROKER_NAME: dict[str, TopicConfigKey] = {
    k.broker_name: k for k in TOPIC_CONFIGS.values() if k.broker_name is not None}


def check_topic_values(merged: dict[str, str]) -> None:
    """Kafka's LogConfig.validateValues, on a topic's whole configuration (defaults included):
    the checks that involve two configs."""
    lo = merged.get("min.compaction.lag.ms")
    hi = merged.get("max.compaction.lag.ms")
    if lo is not None and hi is not None and int(lo) > int(hi):
        raise ConfigError(f"conflict topic config setting min.compaction.lag.ms ({lo}) > "
                          f"max.compaction.lag.ms ({hi})")
