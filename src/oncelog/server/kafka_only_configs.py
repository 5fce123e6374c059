"""Broker settings that Kafka lets AlterConfigs change but that have nothing to act on in
oncelog: its thread pools (one event loop here) and the per-listener SASL/Kerberos settings
(no Kerberos here). They are accepted, checked as Kafka checks them, stored and described, so
that Kafka's tools and clients' test suites that set them (librdkafka's admin tests set
``sasl.kerberos.min.time.before.relogin`` and ``background.threads``) work unchanged; they
change nothing.
"""

from __future__ import annotations

from .topic_configs import TYPE_DOUBLE, TYPE_INT, TYPE_LONG, TYPE_STRING, ConfigError

# name -> (Kafka's default, DescribeConfigs type)
KAFKA_ONLY_DEFAULTS: dict[str, tuple[str, int]] = {
    # DynamicThreadPool (cluster-wide or per broker)
    "background.threads": ("10", TYPE_INT),
    "num.io.threads": ("8", TYPE_INT),
    "num.network.threads": ("3", TYPE_INT),
    "num.replica.fetchers": ("1", TYPE_INT),
    "num.recovery.threads.per.data.dir": ("1", TYPE_INT),
    # DynamicListenerConfig's SASL mechanism settings (per broker only)
    "sasl.kerberos.kinit.cmd": ("/usr/bin/kinit", TYPE_STRING),
    "sasl.kerberos.min.time.before.relogin": ("60000", TYPE_LONG),
    "sasl.kerberos.ticket.renew.jitter": ("0.05", TYPE_DOUBLE),
    "sasl.kerberos.ticket.renew.window.factor": ("0.8", TYPE_DOUBLE),
}
THREAD_POOLS = frozenset(k for k in KAFKA_ONLY_DEFAULTS if k.startswith(("num.", "background")))
# Kafka's PerBrokerConfigs among them: never at the cluster-wide default.
PER_BROKER_ONLY = frozenset(k for k in KAFKA_ONLY_DEFAULTS if k.startswith("sasl."))


def parse(key: str, value: str) -> object:
    kind = KAFKA_ONLY_DEFAULTS[key][1]
    text = value.strip()
    try:
        if kind in (TYPE_INT, TYPE_LONG):
            return int(text)
        if kind == TYPE_DOUBLE:
            return float(text)
    except ValueError:
        name = {TYPE_INT: "INT", TYPE_LONG: "LONG", TYPE_DOUBLE: "DOUBLE"}[kind]
        raise ConfigError(f"Invalid value {value} for configuration {key}: Not a number of "
                          f"type {name}") from None
    return value


def check_thread_count(key: str, value: str, current: str) -> None:
    """Kafka's DynamicThreadPool.validateReconfiguration: at least 1, and within half and
    double the current count."""
    new, old = int(value), int(current)
    if new == old:
        return
    what = f"Dynamic thread count update validation failed for {key}={value}"
    if new <= 0:
        raise ConfigError(f"{what}, value should be at least 1")
    if new < old // 2:
        raise ConfigError(f"{what}, value should be at least half the current value {old}")
    if new > old * 2:
        raise ConfigError(f"{what}, value should not be greater than double the current "
                          f"value {old}")
