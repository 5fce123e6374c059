"""Dynamic broker configs (Kafka's DynamicBrokerConfig, KIP-226): broker settings changed with
AlterConfigs / IncrementalAlterConfigs while the brokers run, for one broker (the resource
named by its node id) or as the cluster-wide default (the resource with the empty name).

Which settings may change is Kafka's list, as far as this broker has them: the broker defaults
of the topic configs (``log.retention.ms``, ``log.segment.bytes``, ``log.cleanup.policy``,
``message.max.bytes``, ``min.insync.replicas``, ``compression.type`` ...; all but
``log.message.format.version``), ``producer.id.expiration.ms``,
``transaction.partition.verification.enable``, ``max.connections`` and
``max.connections.per.ip``. Anything else is refused as Kafka refuses it
("Cannot update these configs dynamically").

They are kept in the data directory on a single node (``dynamic-broker-configs.json``) and in
ZooKeeper in a cluster (``/config/brokers/<id>`` and ``/config/brokers/<default>``, with a
``/config/changes`` notification for every change, as Kafka's ZooKeeper mode); a broker layers
them over its static settings in ``BrokerConfig`` (server/config.py) and gives every log its
new LogConfig at once.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .config import BrokerConfig, ConfigError
from .kafka_only_configs import (
    KAFKA_ONLY_DEFAULTS,
    PER_BROKER_ONLY,
    THREAD_POOLS,
    check_thread_count,
)
from .topic_configs import BY_BROKER_NAME, TYPE_LIST, parse_list

log = logging.getLogger("oncelog.config")

DEFAULT_ENTITY = "<default>"  # Kafka's ZooKeeperInternals.DEFAULT_STRING
LOCAL_FILE = "dynamic-broker-configs.json"

DYNAMIC_CONFIGS = frozenset(
    (set(BY_BROKER_NAME) - {"log.message.format.version"})
    | {"producer.id.expiration.ms", "transaction.partition.verification.enable",
       "max.connections", "max.connections.per.ip"}
    | set(KAFKA_ONLY_DEFAULTS))


def _names(keys) -> str:
    """A set of names as Kafka 4's (Java) messages print it: ``[a, b]``."""
    return f"[{', '.join(sorted(keys))}]"


def check_dynamic(config: BrokerConfig, configs: dict[str, str], *, per_broker: bool = True
                  ) -> dict[str, str]:
    """Kafka's DynamicBrokerConfig.validateConfigs on the dynamic configs a resource would have
    (``per_broker``: one broker's, else the cluster-wide default); ConfigError with Kafka's
    message. Returns them as stored (lists without brackets)."""
    unknown = [k for k in configs if k not in config.values]
    if unknown:
        raise ConfigError(f"Unknown broker configs: {_names(unknown)}")
    fixed = [k for k in configs if k not in DYNAMIC_CONFIGS]
    if fixed:
        raise ConfigError(f"Cannot update these configs dynamically: {_names(fixed)}")
    if not per_broker and PER_BROKER_ONLY & set(configs):
        raise ConfigError("Cannot update these configs at default cluster level, broker id "
                          f"must be specified: {_names(PER_BROKER_ONLY & set(configs))}")
    out = {}
    for key, value in configs.items():
        config.parse(key, value)
        if key in THREAD_POOLS:
            check_thread_count(key, value, config.values[key])
        topic_key = BY_BROKER_NAME.get(key)
        out[key] = ",".join(parse_list(value)) if topic_key is not None and \
            topic_key.config_type == TYPE_LIST else value
    return out


def usable(config: BrokerConfig, configs: dict[str, str], where: str, *, per_broker: bool
           ) -> dict[str, str]:
    """What of stored dynamic configs this broker can apply: those it cannot are left out with a
    warning (Kafka: "Non-dynamic configs configured in ZooKeeper will be ignored")."""
    out = {}
    for key, value in configs.items():
        try:
            config.parse(key, value)
            if key not in DYNAMIC_CONFIGS or (not per_broker and key in PER_BROKER_ONLY):
                raise ConfigError("not a dynamic config here")
            out.update(check_dynamic(config, {key: value}, per_broker=per_broker)
                       if key not in THREAD_POOLS else {key: value})
        except ConfigError as exc:
            log.warning("dynamic broker config %s=%r (%s) ignored: %s", key, value, where, exc)
    return out


def load_local(data_dir: Path) -> dict[str, dict[str, str]]:
    """entity (``<default>`` or a node id) -> its dynamic configs, from the data directory."""
    try:
        data = json.loads((Path(data_dir) / LOCAL_FILE).read_text())
    except FileNotFoundError:
        return {}
    return {str(entity): {str(k): str(v) for k, v in configs.items()}
            for entity, configs in data.get("entities", {}).items()}


def save_local(data_dir: Path, entities: dict[str, dict[str, str]]) -> None:
    path = Path(data_dir) / LOCAL_FILE
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"version": 1, "entities": {e: c for e, c in entities.items() if c}}, f,
                  sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
