"""Broker and topic configuration, under Kafka's own names.

Broker keys (``oncelog broker --set key=value``) use Kafka's broker names; topic keys (CreateTopics
configs, DescribeConfigs) use Kafka's topic names. Each topic key has a broker-level default, as in
Kafka (``retention.ms`` defaults to ``log.retention.ms``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..log import LogConfig

MAX_LONG = 2**63 - 1


class ConfigError(ValueError):
    pass


def _bool(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise ConfigError(f"not a boolean: {v!r}")


def _timestamp_type(v: str) -> str:
    if v not in ("CreateTime", "LogAppendTime"):
        raise ConfigError(f"message.timestamp.type must be CreateTime or LogAppendTime, not {v!r}")
    return v


def _compression(v: str) -> str:
    if v != "producer":
        raise ConfigError(f"compression.type {v!r} is not supported: batches are stored as "
                          "the producer compressed them ('producer')")
    return v


def _positive_int(v: str) -> int:
    n = int(v)
    if n < 1:
        raise ConfigError(f"must be >= 1: {v!r}")
    return n


def _long(v: str) -> int:
    return int(v)


def _non_negative_long(v: str) -> int:
    n = int(v)
    if n < 0:
        raise ConfigError(f"must be >= 0: {v!r}")
    return n


@dataclass(frozen=True)
class TopicConfigKey:
    name: str  # topic-level name
    broker_name: str  # broker-level default's name
    parse: Callable[[str], object]
    log_field: str | None  # LogConfig attribute it sets, if any


TOPIC_CONFIGS: dict[str, TopicConfigKey] = {
    k.name: k
    for k in [
        TopicConfigKey("compression.type", "compression.type", _compression, None),
        TopicConfigKey("retention.ms", "log.retention.ms", _long, "retention_ms"),
        TopicConfigKey("retention.bytes", "log.retention.bytes", _long, "retention_bytes"),
        TopicConfigKey("segment.bytes", "log.segment.bytes", _positive_int, "segment_bytes"),
        TopicConfigKey("segment.ms", "log.roll.ms", _positive_int, "segment_ms"),
        TopicConfigKey("index.interval.bytes", "log.index.interval.bytes", _positive_int,
                       "index_interval_bytes"),
        TopicConfigKey("flush.messages", "log.flush.interval.messages", _positive_int,
                       "flush_messages"),
        TopicConfigKey("message.timestamp.type", "log.message.timestamp.type", _timestamp_type,
                       "message_timestamp_type"),
        TopicConfigKey("max.message.bytes", "message.max.bytes", _positive_int,
                       "max_message_bytes"),
        TopicConfigKey("message.timestamp.before.max.ms", "log.message.timestamp.before.max.ms",
                       _non_negative_long, "message_timestamp_before_max_ms"),
        TopicConfigKey("message.timestamp.after.max.ms", "log.message.timestamp.after.max.ms",
                       _non_negative_long, "message_timestamp_after_max_ms"),
        TopicConfigKey("min.insync.replicas", "min.insync.replicas", _positive_int, None),
    ]
}

# -- log compaction (KIP-58, KIP-354, KIP-534; log/cleaner*.py) ---------------------------------
# Kept in one block: the topic keys that decide when and how the log cleaner compacts a log,
# with Kafka's defaults and validation, and the broker settings of the cleaner itself.

CLEANUP_POLICIES = frozenset({"compact", "delete"})


def _cleanup_policy(v: str) -> frozenset[str]:
    """Kafka's cleanup.policy: a list of ``compact`` and ``delete`` ("compact,delete": both)."""
    names = [p.strip() for p in str(v).split(",") if p.strip()]
    bad = [p for p in names if p not in CLEANUP_POLICIES]
    if bad or not names:
        raise ConfigError(f"cleanup.policy must be a list of compact and delete, not {v!r}")
    return frozenset(names)


def _ratio(v: str) -> float:
    x = float(v)
    if not 0.0 <= x <= 1.0:
        raise ConfigError(f"must be in [0, 1]: {v!r}")
    return x


def _positive_long(v: str) -> int:
    n = int(v)
    if n < 1:
        raise ConfigError(f"must be >= 1: {v!r}")
    return n


TOPIC_CONFIGS.update({k.name: k for k in [
    TopicConfigKey("cleanup.policy", "log.cleanup.policy", _cleanup_policy, "cleanup_policy"),
    TopicConfigKey("delete.retention.ms", "log.cleaner.delete.retention.ms",
                   _non_negative_long, "delete_retention_ms"),
    TopicConfigKey("min.cleanable.dirty.ratio", "log.cleaner.min.cleanable.ratio", _ratio,
                   "min_cleanable_dirty_ratio"),
    TopicConfigKey("min.compaction.lag.ms", "log.cleaner.min.compaction.lag.ms",
                   _non_negative_long, "min_compaction_lag_ms"),
    TopicConfigKey("max.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms",
                   _positive_long, "max_compaction_lag_ms"),
]})

# Broker-level settings and their defaults (Kafka's defaults unless noted).
BROKER_DEFAULTS: dict[str, str] = {
    "node.id": "1",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "auto.create.topics.enable": "true",
    "socket.request.max.bytes": str(100 * 1024 * 1024),
    "log.cleanup.policy": "delete",
    "compression.type": "producer",
    "log.retention.ms": str(7 * 24 * 3600 * 1000),
    "log.retention.bytes": "-1",
    "log.segment.bytes": str(1 << 30),
    "log.roll.ms": str(7 * 24 * 3600 * 1000),
    "log.index.interval.bytes": "4096",
    "log.flush.interval.messages": str(MAX_LONG),
    "log.message.timestamp.type": "CreateTime",
    "message.max.bytes": "1048588",
    # KIP-937 (Kafka 3.6): how far a CreateTime record's timestamp may lie before / after the
    # broker's clock (INVALID_TIMESTAMP otherwise); Kafka 4.0's defaults: unbounded, one hour.
    "log.message.timestamp.before.max.ms": str(MAX_LONG),
    "log.message.timestamp.after.max.ms": "3600000",
    "min.insync.replicas": "1",
    "log.retention.check.interval.ms": "300000",
    "producer.id.expiration.ms": "86400000",
    "producer.id.expiration.check.interval.ms": "600000",
    # How often each partition snapshots its producer state (spec: "30 to 60 seconds").
    "producer.snapshot.interval.ms": "30000",
    "fetch.max.bytes": str(55 * 1024 * 1024),
    # oncelog's own: page cache to preallocate ahead of a busy segment (log/preallocator.py).
    "log.preallocate.ahead.bytes": str(64 << 20),
    # oncelog's own: serve the metrics as Prometheus text on this port (-1: off, 0: any free).
    "metrics.port": "-1",
    # The transaction coordinator (spec 000, "Transaction Coordinator"; Kafka's defaults).
    "transaction.state.log.num.partitions": "50",
    "transaction.state.log.segment.bytes": str(100 * 1024 * 1024),
    "transaction.max.timeout.ms": "900000",
    "transactional.id.expiration.ms": "604800000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "10000",
    "transaction.remove.expired.transaction.cleanup.interval.ms": "3600000",
    # KIP-890: the transaction.version feature level this broker finalizes (2: an epoch bump
    # on every transaction and partitions added by the leaders, for clients that use it;
    # 1: flexible transaction log records; 0: Kafka's original protocol and records).
    "transaction.version": "2",
    # KIP-890 part 1: ask the coordinator before writing an older client's transactional batch.
    "transaction.partition.verification.enable": "true",
    # KIP-939: let clients take part in two-phase commit (InitProducerId with enable2Pc).
    "transaction.two.phase.commit.enable": "false",
    # Security (KIP-43/84 SASL, KIP-11 ACLs). PLAINTEXT: no authentication, everything allowed.
    # SASL_PLAINTEXT needs sasl.users.file (one name:password per line).
    "security.protocol": "PLAINTEXT",
    "sasl.users.file": "",
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
    "super.users": "",
    # Connections (Kafka's names and defaults; the read timeout is oncelog's own: Kafka has
    # no bound on how long one request may take to arrive).
    "connections.max.idle.ms": "600000",
    "max.connections": str(2**31 - 1),
    "max.connections.per.ip": str(2**31 - 1),
    "socket.request.read.timeout.ms": "30000",
    "sasl.server.max.receive.size": "524288",
    # A failed authentication is answered this much later (Kafka's default): slows guessing.
    "connection.failed.authentication.delay.ms": "100",
    # Empty: false once SASL is on (as the issue asks), true otherwise.
    "allow.everyone.if.no.acl.found": "",
    # The group coordinator (Kafka's defaults).
    "offsets.topic.num.partitions": "50",
    "offsets.topic.segment.bytes": str(100 * 1024 * 1024),
    "offsets.retention.minutes": "10080",
    "group.min.session.timeout.ms": "6000",
    "group.max.session.timeout.ms": "1800000",
    "group.initial.rebalance.delay.ms": "3000",
    "group.max.size": str(2**31 - 1),
    # Cluster mode (docs/cluster.md); empty zookeeper.connect: a single node.
    "zookeeper.connect": "",
    # Cluster mode: the address other brokers and clients are told (registered in ZooKeeper),
    # PLAINTEXT://host:port; empty: the address the broker listens on.
    "advertised.listeners": "",
    "zookeeper.session.timeout.ms": "6000",  # Kafka's is 18000; failover waits for it
    "replica.lag.time.max.ms": "10000",  # Kafka's is 30000
    "replica.fetch.wait.max.ms": "500",
    "replica.fetch.max.bytes": str(1 << 20),
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
}

# The log cleaner's broker settings (Kafka's names and defaults; see the compaction block).
BROKER_DEFAULTS.update({
    "log.cleaner.delete.retention.ms": str(24 * 3600 * 1000),
    "log.cleaner.min.cleanable.ratio": "0.5",
    "log.cleaner.min.compaction.lag.ms": "0",
    "log.cleaner.max.compaction.lag.ms": str(MAX_LONG),
    "log.cleaner.enable": "true",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(128 << 20),
    "log.cleaner.backoff.ms": "15000",
    "log.cleaner.io.max.bytes.per.second": str(MAX_LONG),
})

def _transaction_version(v: str) -> int:
    n = int(v)
    if n not in (0, 1, 2):
        raise ConfigError(f"transaction.version must be 0, 1 or 2, not {v!r}")
    return n


def _security_protocol(v: str) -> str:
    if v not in ("PLAINTEXT", "SASL_PLAINTEXT"):
        raise ConfigError(f"security.protocol must be PLAINTEXT or SASL_PLAINTEXT, not {v!r} "
                          "(TLS is not supported)")
    return v


def _mechanisms(v: str) -> str:
    known = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    names = [m.strip() for m in v.split(",") if m.strip()]
    bad = [m for m in names if m not in known]
    if bad or not names:
        raise ConfigError(f"sasl.enabled.mechanisms: {', '.join(bad) or 'none given'}; "
                          f"known: {', '.join(known)}")
    return ",".join(names)


def _optional_bool(v: str) -> object:
    return None if v == "" else _bool(v)


_BROKER_PARSERS: dict[str, Callable[[str], object]] = {
    "auto.create.topics.enable": _bool,
    "zookeeper.connect": str,
    "advertised.listeners": str,
    "security.protocol": _security_protocol,
    "sasl.users.file": str,
    "sasl.enabled.mechanisms": _mechanisms,
    "super.users": str,
    "allow.everyone.if.no.acl.found": _optional_bool,
    "transaction.version": _transaction_version,
    "transaction.partition.verification.enable": _bool,
    "transaction.two.phase.commit.enable": _bool,
    "log.retention.check.interval.ms": _positive_int,
    "connections.max.idle.ms": _positive_int,
    "max.connections": _positive_int,
    "max.connections.per.ip": _positive_int,
    "socket.request.read.timeout.ms": _positive_int,
    "sasl.server.max.receive.size": _positive_int,
    "log.cleaner.enable": _bool,
    "log.cleaner.threads": _positive_int,
    "log.cleaner.dedupe.buffer.size": _positive_int,
    "log.cleaner.backoff.ms": _positive_int,
    "log.cleaner.io.max.bytes.per.second": _positive_long,
}
# Kafka's coarser aliases, normalised to their millisecond keys.
_ALIASES = {
    "log.retention.hours": ("log.retention.ms", 3600 * 1000),
    "log.retention.minutes": ("log.retention.ms", 60 * 1000),
    "log.roll.hours": ("log.roll.ms", 3600 * 1000),
    # The (and librdkafka's) word order for Kafka's transaction.max.timeout.ms.
    "max.transaction.timeout.ms": ("transaction.max.timeout.ms", 1),
}


class BrokerConfig:
    """Broker settings: defaults overridden by ``--set`` pairs. Unknown keys are refused."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.values: dict[str, str] = dict(BROKER_DEFAULTS)
        for key, value in (overrides or {}).items():
            self.set(key, str(value))

    def set(self, key: str, value: str) -> None:
        if key in _ALIASES:
            target, factor = _ALIASES[key]
            key, value = target, str(int(value) * factor)
        if key not in BROKER_DEFAULTS:
            raise ConfigError(f"unknown broker setting {key!r}; known: "
                              + ", ".join(sorted(BROKER_DEFAULTS)))
        self._parse(key, value)
        self.values[key] = value

    def _parse(self, key: str, value: str) -> object:
        for t in TOPIC_CONFIGS.values():
            if t.broker_name == key:
                return t.parse(value)
        parser = _BROKER_PARSERS.get(key, _long)
        try:
            return parser(value)
        except ValueError as exc:
            raise ConfigError(f"bad value for {key}: {value!r} ({exc})") from None

    def get(self, key: str) -> object:
        return self._parse(key, self.values[key])

    def flag(self, key: str) -> bool:
        value = self.get(key)
        assert isinstance(value, bool)
        return value

    def int(self, key: str) -> int:
        value = self.get(key)
        assert isinstance(value, int)
        return value

    def topic_defaults(self) -> dict[str, str]:
        return {name: self.values[k.broker_name] for name, k in TOPIC_CONFIGS.items()}

    def log_config(self, topic_overrides: dict[str, str]) -> LogConfig:
        """The LogConfig of a topic: broker defaults, then the topic's own settings."""
        merged = self.topic_defaults()
        merged.update(topic_overrides)
        cfg = LogConfig(
            producer_id_expiration_ms=self.int("producer.id.expiration.ms"),
            producer_snapshot_interval_ms=self.int("producer.snapshot.interval.ms"),
            preallocate_ahead_bytes=self.int("log.preallocate.ahead.bytes"),
        )
        for name, value in merged.items():
            key = TOPIC_CONFIGS[name]
            if key.log_field:
                setattr(cfg, key.log_field, key.parse(value))
        return cfg


def validate_topic_configs(configs: dict[str, str | None]) -> dict[str, str]:
    """Check CreateTopics configs; raise ConfigError naming the first bad one."""
    out: dict[str, str] = {}
    for key, value in configs.items():
        if key not in TOPIC_CONFIGS:
            raise ConfigError(f"unknown topic config {key!r}")
        if value is None:
            raise ConfigError(f"topic config {key!r} needs a value")
        try:
            TOPIC_CONFIGS[key].parse(value)
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"invalid value {value!r} for {key}: {exc}") from None
        out[key] = value
    return out
