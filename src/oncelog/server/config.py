"""Broker and topic configuration, under Kafka's own names.

Broker keys (``oncelog broker --set key=value``) use Kafka's broker names; topic keys (CreateTopics
configs, DescribeConfigs) use Kafka's topic names. Each topic key has a broker-level default, as in
Kafka (``retention.ms`` defaults to ``log.retention.ms``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping

from ..log import LogConfig
from ..security.ssl_principal import SslPrincipalMapper
from ..security.tls import SECURITY_PROTOCOLS
from . import kafka_only_configs
from .kafka_only_configs import KAFKA_ONLY_DEFAULTS
from .topic_configs import (
    BY_BROKER_NAME,
    MAX_LONG,
    TOPIC_CONFIGS,
    TOPIC_SYNONYM_DEFAULTS,
    TYPE_BOOLEAN,
    TYPE_INT,
    TYPE_LIST,
    TYPE_LONG,
    TYPE_STRING,
    ConfigError,
    TopicConfigKey,
    check_topic_values,
    parse_list,
)

log = logging.getLogger("oncelog.config")

TYPE_PASSWORD = 9  # DescribeConfigs' type of Kafka's PASSWORD settings

__all__ = ["BROKER_DEFAULTS", "TOPIC_CONFIGS", "BrokerConfig", "ConfigError", "TopicConfigKey",
           "validate_topic_configs"]


def _bool(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise ConfigError(f"not a boolean: {v!r}")


def _positive_int(v: str) -> int:
    n = int(v)
    if n < 1:
        raise ConfigError(f"must be >= 1: {v!r}")
    return n


def _positive_long(v: str) -> int:
    n = int(v)
    if n < 1:
        raise ConfigError(f"must be >= 1: {v!r}")
    return n


def _long(v: str) -> int:
    return int(v)


# Broker-level settings and their defaults (Kafka's defaults unless noted).
BROKER_DEFAULTS: dict[str, str] = {
    "node.id": "1",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "auto.create.topics.enable": "true",
    "socket.request.max.bytes": str(100 * 1024 * 1024),
    # The topic configs' defaults (topic_configs.py: log.retention.ms, log.segment.bytes ...).
    **TOPIC_SYNONYM_DEFAULTS,
    # Kafka's settings that change nothing here (kafka_only_configs.py).
    **{k: default for k, (default, _type) in KAFKA_ONLY_DEFAULTS.items()},
    "log.retention.check.interval.ms": "300000",
    "producer.id.expiration.ms": "86400000",
    "producer.id.expiration.check.interval.ms": "600000",
    # How often each partition snapshots its producer state (spec: "30 to 60 seconds").
    "producer.snapshot.interval.ms": "30000",
    "fetch.max.bytes": str(55 * 1024 * 1024),
    # oncelog's own: page cache to preallocate ahead of a busy segment (log/preallocator.py).
    # Off by default, as Kafka's log.preallocate: the zeros are a second write of every page,
    # and on two cores shared with clients that cost more throughput than it saved.
    "log.preallocate.ahead.bytes": "0",
    # oncelog's own: serve /metrics alone on this port (-1: off, 0: any free), by the console's
    # HTTP server (its users, TLS and limits); the console's port serves /metrics too.
    "metrics.port": "-1",
    # oncelog's own: per-topic and per-partition metrics of __consumer_offsets and
    # __transaction_state too (100 partitions by default: 800 series no dashboard reads).
    "metrics.internal.topics": "false",
    # oncelog's own: serve the read-only web console on this port (-1: off, 0: any free).
    "console.port": "-1",
    # oncelog's own: the console's Transactions page marks a two-phase-commit transaction
    # (KIP-939: it never times out) open longer than this.
    "console.two.phase.commit.warn.ms": "300000",
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
    # KIP-11's authorizer (Kafka's class names, AclAuthorizer or StandardAuthorizer): set, ACLs
    # apply on every listener (PLAINTEXT and SSL clients as User:ANONYMOUS, an SSL client
    # with a certificate as its subject mapped by ssl.principal.mapping.rules, KIP-371).
    # Empty: ACLs apply with SASL only, as before.
    "authorizer.class.name": "",
    "ssl.principal.mapping.rules": "DEFAULT",
    # Between SASL brokers of a cluster: the mechanism a broker logs in to the others with, and
    # its credentials in listener.name.<listener>.<mechanism>.sasl.jaas.config (Kafka's names;
    # JAAS_CONFIG_KEY). Kafka's default is GSSAPI (Kerberos), which oncelog does not offer.
    "sasl.mechanism.inter.broker.protocol": "PLAIN",
    # TLS (KIP-519's PEM stores, Kafka's names; docs/security.md): a listener with
    # security.protocol SSL or SASL_SSL needs the keystore. PEM is the only store type read
    # here (Kafka's default type is JKS). Empty inter-broker protocol: the listener's.
    "security.inter.broker.protocol": "",
    "ssl.keystore.type": "PEM",
    "ssl.keystore.location": "",
    "ssl.keystore.certificate.chain": "",
    "ssl.keystore.key": "",
    "ssl.key.password": "",
    "ssl.truststore.type": "PEM",
    "ssl.truststore.location": "",
    "ssl.truststore.certificates": "",
    "ssl.client.auth": "none",
    "ssl.enabled.protocols": "TLSv1.2,TLSv1.3",
    "ssl.endpoint.identification.algorithm": "https",
    # Connections (Kafka's names and defaults; the read timeout is oncelog's own: Kafka has
    # no bound on how long one request may take to arrive).
    "connections.max.idle.ms": "600000",
    "max.connections": str(2**31 - 1),
    "max.connections.per.ip": str(2**31 - 1),
    "socket.request.read.timeout.ms": "30000",
    # Kafka's name; its default is -1 (unbounded): ours bounds what requests read and not yet
    # answered may hold (docs/security.md), -1 for none
    "queued.max.request.bytes": str(256 * 1024 * 1024),
    "sasl.server.max.receive.size": "524288",
    # A failed authentication is answered this much later (Kafka's default): slows guessing.
    "connection.failed.authentication.delay.ms": "100",
    # Empty: false once an authorizer is on (SASL, or authorizer.class.name), true otherwise.
    "allow.everyone.if.no.acl.found": "",
    # The group coordinator (Kafka's defaults).
    "offsets.topic.num.partitions": "50",
    "offsets.topic.segment.bytes": str(100 * 1024 * 1024),
    "offsets.retention.minutes": "10080",
    "offsets.retention.check.interval.ms": "600000",
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
    if v.upper() not in SECURITY_PROTOCOLS:
        raise ConfigError(f"security.protocol must be {', '.join(SECURITY_PROTOCOLS)}, "
                          f"not {v!r}")
    return v.upper()


def _inter_broker_protocol(v: str) -> str:
    return _security_protocol(v) if v else ""


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v.strip().lower() not in [c.lower() for c in choices]:
            raise ConfigError(f"expected one of {', '.join(choices)}, not {v!r}")
        return v.strip()

    return parse


_inter_broker_mechanism = _one_of("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Kafka's PASSWORD settings: DescribeConfigs answers them with no value, marked sensitive.
SENSITIVE_BROKER_CONFIGS = frozenset({"ssl.key.password", "ssl.keystore.key",
                                      "ssl.keystore.certificate.chain",
                                      "ssl.truststore.certificates"})


def _mechanisms(v: str) -> str:
    known = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    names = [m.strip() for m in v.split(",") if m.strip()]
    bad = [m for m in names if m not in known]
    if bad or not names:
        raise ConfigError(f"sasl.enabled.mechanisms: {', '.join(bad) or 'none given'}; "
                          f"known: {', '.join(known)}")
    return ",".join(names)


# Kafka's per-listener JAAS configuration (listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config):
# what this broker logs in to the other brokers with (server/interbroker_sasl.py).
JAAS_CONFIG_KEY = re.compile(r"listener\.name\.[a-z0-9_]+\.[a-z0-9-]+\.sasl\.jaas\.config")


def is_sensitive_broker_config(key: str) -> bool:
    """A PASSWORD setting of Kafka's: described without its value."""
    return key in SENSITIVE_BROKER_CONFIGS or JAAS_CONFIG_KEY.fullmatch(key) is not None


# Kafka's authorizer classes (ZooKeeper's, its older name, and KRaft's): one ACL store here
AUTHORIZER_CLASSES = ("kafka.security.authorizer.AclAuthorizer",
                      "kafka.security.auth.SimpleAclAuthorizer",
                      "org.apache.kafka.metadata.authorizer.StandardAuthorizer")


def _authorizer_class(v: str) -> str:
    if v.strip() and v.strip() not in AUTHORIZER_CLASSES:
        raise ConfigError(f"authorizer.class.name: {v.strip()!r} is not one of "
                          f"{', '.join(AUTHORIZER_CLASSES)} (or empty: no authorizer)")
    return v.strip()


def _principal_mapping_rules(v: str) -> str:
    try:
        SslPrincipalMapper(v)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return v


def _optional_bool(v: str) -> object:
    return None if v == "" else _bool(v)


_BROKER_PARSERS: dict[str, Callable[[str], object]] = {
    "auto.create.topics.enable": _bool,
    "zookeeper.connect": str,
    "advertised.listeners": str,
    "security.protocol": _security_protocol,
    "security.inter.broker.protocol": _inter_broker_protocol,
    "ssl.keystore.type": _one_of("PEM", "JKS", "PKCS12"),
    "ssl.keystore.location": str,
    "ssl.keystore.certificate.chain": str,
    "ssl.keystore.key": str,
    "ssl.key.password": str,
    "ssl.truststore.type": _one_of("PEM", "JKS", "PKCS12"),
    "ssl.truststore.location": str,
    "ssl.truststore.certificates": str,
    "ssl.client.auth": _one_of("none", "requested", "required"),
    "ssl.enabled.protocols": str,
    "ssl.endpoint.identification.algorithm": str,
    "sasl.users.file": str,
    "sasl.enabled.mechanisms": _mechanisms,
    "super.users": str,
    "authorizer.class.name": _authorizer_class,
    "ssl.principal.mapping.rules": _principal_mapping_rules,
    "sasl.mechanism.inter.broker.protocol": _inter_broker_mechanism,
    "allow.everyone.if.no.acl.found": _optional_bool,
    "transaction.version": _transaction_version,
    "transaction.partition.verification.enable": _bool,
    "transaction.two.phase.commit.enable": _bool,
    "log.retention.check.interval.ms": _positive_int,
    "offsets.retention.minutes": _positive_int,
    "offsets.retention.check.interval.ms": _positive_int,
    "connections.max.idle.ms": _positive_int,
    "max.connections": _positive_int,
    "max.connections.per.ip": _positive_int,
    "socket.request.read.timeout.ms": _positive_int,
    "queued.max.request.bytes": _long,
    "sasl.server.max.receive.size": _positive_int,
    "log.cleaner.enable": _bool,
    "metrics.internal.topics": _bool,
    "log.cleaner.threads": _positive_int,
    "log.cleaner.dedupe.buffer.size": _positive_int,
    "log.cleaner.backoff.ms": _positive_int,
    "log.cleaner.io.max.bytes.per.second": _positive_long,
}
def broker_config_type(key: str) -> int:
    """DescribeConfigs' type of a broker setting."""
    topic_key = BY_BROKER_NAME.get(key)
    if topic_key is not None:
        return topic_key.config_type
    if key in KAFKA_ONLY_DEFAULTS:
        return KAFKA_ONLY_DEFAULTS[key][1]
    if JAAS_CONFIG_KEY.fullmatch(key):
        return TYPE_PASSWORD
    parser = _BROKER_PARSERS.get(key, _long)
    if parser in (_bool, _optional_bool):
        return TYPE_BOOLEAN
    if parser in (str, _security_protocol, _mechanisms, _inter_broker_protocol,
                  _inter_broker_mechanism) \
            or key.startswith("ssl."):
        return TYPE_PASSWORD if key in SENSITIVE_BROKER_CONFIGS else TYPE_STRING
    return TYPE_INT if parser in (_positive_int, _transaction_version) else TYPE_LONG


# Kafka's coarser aliases, normalised to their millisecond keys.
_ALIASES = {
    "log.retention.hours": ("log.retention.ms", 3600 * 1000),
    "log.retention.minutes": ("log.retention.ms", 60 * 1000),
    "log.roll.hours": ("log.roll.ms", 3600 * 1000),
    # The (and librdkafka's) word order for Kafka's transaction.max.timeout.ms.
    "max.transaction.timeout.ms": ("transaction.max.timeout.ms", 1),
}


class BrokerConfig:
    """Broker settings: Kafka's defaults, overridden by ``--set`` pairs (Kafka's static broker
    configs), overridden by the dynamic ones (Kafka's DynamicBrokerConfig: the cluster-wide
    default, then this broker's own; server/dynamic_config.py). ``values`` is the result.
    Unknown keys are refused."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.static: dict[str, str] = {}
        self.dynamic_default: dict[str, str] = {}
        self.dynamic_broker: dict[str, str] = {}
        self.values: dict[str, str] = dict(BROKER_DEFAULTS)
        # Parsed once, when set: the append path reads settings (min.insync.replicas) for
        # every partition of every produce request.
        self._parsed: dict[str, object] = {}
        for key, value in (overrides or {}).items():
            self.set(key, str(value))

    def set(self, key: str, value: str) -> None:
        if key in _ALIASES:
            target, factor = _ALIASES[key]
            key, value = target, str(int(value) * factor)
        if key not in BROKER_DEFAULTS and not JAAS_CONFIG_KEY.fullmatch(key):
            raise ConfigError(f"unknown broker setting {key!r}; known: "
                              + ", ".join(sorted(BROKER_DEFAULTS)))
        self.parse(key, value)
        self.static[key] = value
        self._merge()

    def set_dynamic(self, default: dict[str, str], broker: dict[str, str]) -> None:
        """The dynamic layers, checked by the caller (server/dynamic_config.py)."""
        self.dynamic_default = dict(default)
        self.dynamic_broker = dict(broker)
        self._merge()

    def _merge(self) -> None:
        self.values = {**BROKER_DEFAULTS, **self.static, **self.dynamic_default,
                       **self.dynamic_broker}
        self._parsed = {}

    def parse(self, key: str, value: str) -> object:
        topic_key = BY_BROKER_NAME.get(key)
        if topic_key is not None:
            return topic_key.check(key, value)
        if key in KAFKA_ONLY_DEFAULTS:
            return kafka_only_configs.parse(key, value)
        parser = _BROKER_PARSERS.get(key, str if JAAS_CONFIG_KEY.fullmatch(key) else _long)
        try:
            return parser(value)
        except ValueError as exc:
            raise ConfigError(f"bad value for {key}: {value!r} ({exc})") from None

    def get(self, key: str) -> object:
        try:
            return self._parsed[key]
        except KeyError:  # parsed on first use after a change
            value = self._parsed[key] = self.parse(key, self.values[key])
            return value

    def flag(self, key: str) -> bool:
        value = self.get(key)
        assert isinstance(value, bool)
        return value

    def int(self, key: str) -> int:
        value = self.get(key)
        assert isinstance(value, int)
        return value

    def topic_defaults(self) -> dict[str, str]:
        return {name: self.values[k.broker_name] if k.broker_name else str(k.default)
                for name, k in TOPIC_CONFIGS.items()}

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
            key = TOPIC_CONFIGS.get(name)
            if key is None or not key.log_field:
                continue
            try:
                setattr(cfg, key.log_field, key.parse(value))
            except ConfigError as exc:
                # Written by another tool into ZooKeeper, say: the default stands, as Kafka
                # ignores what it cannot parse there.
                log.warning("topic config %s=%r ignored: %s", name, value, exc)
                if key.broker_name is not None:
                    setattr(cfg, key.log_field, key.parse(self.values[key.broker_name]))
        # Kafka 3.x: the deprecated message.timestamp.difference.max.ms bounds both sides while
        # before / after keep their unbounded default.
        try:
            difference = int(merged["message.timestamp.difference.max.ms"])
        except ValueError:
            difference = MAX_LONG
        if cfg.message_timestamp_before_max_ms == MAX_LONG:
            cfg.message_timestamp_before_max_ms = difference
        if cfg.message_timestamp_after_max_ms == MAX_LONG:
            cfg.message_timestamp_after_max_ms = difference
        return cfg


def normalize_topic_value(key: TopicConfigKey, value: str) -> str:
    """The form a topic config is stored in: a list without brackets or blanks
    (``[compact, delete]`` -> ``compact,delete``), anything else as given."""
    if key.config_type == TYPE_LIST:
        return ",".join(parse_list(value))
    return value


def validate_topic_configs(configs: Mapping[str, str | None],
                           defaults: dict[str, str] | None = None) -> dict[str, str]:
    """Check a topic's configs (CreateTopics, AlterConfigs) as Kafka's LogConfig.validate does:
    names, then each value, then (with ``defaults``, the broker's topic defaults) the checks
    across configs; raise ConfigError naming the first bad one. Returns them as stored."""
    out: dict[str, str] = {}
    for key, value in configs.items():
        if key not in TOPIC_CONFIGS:
            raise ConfigError(f"Unknown topic config name: {key}")
        if value is None:
            raise ConfigError(f"Null value not supported for topic config {key}")
        TOPIC_CONFIGS[key].parse(value)
        out[key] = normalize_topic_value(TOPIC_CONFIGS[key], value)
    if defaults is not None:
        check_topic_values({**defaults, **out})
    return out
