"""The znodes of a cluster, laid out and encoded as Kafka's ZooKeeper mode did (Kafka's ZkData).

One class per znode path, each a namespace (never instantiated) of ``path(...)`` and, for the
znodes that hold data, ``encode(...)`` / ``decode(...)``. Paths are relative to the connect
string's chroot. The encodings are Kafka's, compact JSON, and must stay byte for byte what
they are: clusters already running keep their data in ZooKeeper across upgrades.

- ``/brokers/ids/<id>`` (ephemeral): ``{"version":5,"host":h,"port":p,"endpoints":[...],"rack":r}``
- ``/controller`` (ephemeral): ``{"version":1,"brokerid":id,"timestamp":"ms"}``;
  ``/controller_epoch``: ``<n>``
- ``/brokers/topics/<topic>``: ``{"version":2,"topic_id":"<uuid>","partitions":{"0":[1,2,3]}}``
- ``/config/topics/<topic>``, ``/config/brokers/<id or <default>>``:
  ``{"version":1,"config":{...}}``; ``/config/users/<user>``:
  ``{"version":1,"config":{"SCRAM-SHA-256":"salt=...",...}}``;
  ``/config/changes/config_change_<seq>``: ``{"version":2,"entity_path":"topics/<topic>"}``
- ``/brokers/topics/<topic>/partitions/<p>/state``:
  ``{"version":1,"leader":1,"leader_epoch":3,"isr":[1,2,3],"controller_epoch":2}``
- ``/admin/delete_topics/<topic>``: a deletion request, carried out by the controller
- ``/latest_producer_id_block``: ``{"version":1,"broker":id,"block_start":s,"block_end":e}``
- ``/cluster/id``: ``{"version": "1", "id": "<id>"}``

Nothing here talks to ZooKeeper (that is cluster/zk_client.py's parts), so the codec is tested
and read without a server.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from .model import NULL_TOPIC_ID, BrokerInfo, LeaderAndIsr

__all__ = [
    "PERSISTENT_ZK_PATHS",
    "BrokerIdZNode",
    "BrokerIdsZNode",
    "ClusterIdZNode",
    "ConfigChangesZNode",
    "ConfigEntityTypeZNode",
    "ConfigEntityZNode",
    "ConfigType",
    "ControllerEpochZNode",
    "ControllerZNode",
    "DeleteTopicsTopicZNode",
    "DeleteTopicsZNode",
    "ProducerIdBlockZNode",
    "TopicPartitionStateZNode",
    "TopicPartitionZNode",
    "TopicPartitionsZNode",
    "TopicZNode",
    "TopicsZNode",
    "parse_topic_id",
]


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _loads(data: bytes | None) -> Any:
    if not data:
        return None
    return json.loads(data)


# -- brokers -----------------------------------------------------------------------------------


class BrokerIdsZNode:
    """``/brokers/ids``: one ephemeral child per live broker."""

    @staticmethod
    def path() -> str:
        return "/brokers/ids"


class BrokerIdZNode:
    """``/brokers/ids/<id>``: a broker's registration (ephemeral, its session's)."""

    @staticmethod
    def path(node_id: int) -> str:
        return f"{BrokerIdsZNode.path()}/{node_id}"

    @staticmethod
    def encode(host: str, port: int, rack: str | None = None,
               security_protocol: str = "PLAINTEXT") -> bytes:
        # As Kafka: host and port name the PLAINTEXT listener (null and -1 without one); the
        # endpoints name every listener, the map gives each its security protocol.
        plain = security_protocol == "PLAINTEXT"
        return _dumps({"version": 5, "host": host if plain else None,
                       "port": port if plain else -1,
                       "endpoints": [f"{security_protocol}://{host}:{port}"],
                       "listener_security_protocol_map": {security_protocol: security_protocol},
                       "rack": rack})

    @staticmethod
    def decode(node_id: int, data: bytes, epoch: int = -1) -> BrokerInfo:
        """``epoch``: the znode's czxid (Kafka's broker epoch)."""
        d = _loads(data) or {}
        endpoints = tuple(d.get("endpoints") or ())
        host: Any = d.get("host")
        port: Any = d.get("port")
        if (host is None or port in (None, -1)) and endpoints:
            # Kafka leaves host/port -1 without a PLAINTEXT listener: take the first endpoint.
            address = endpoints[0].split("://", 1)[-1]
            host, _, port_s = address.rpartition(":")
            port = int(port_s)
        return BrokerInfo(node_id, str(host), int(port), d.get("rack"), epoch, endpoints)


# -- topics and their partitions ---------------------------------------------------------------


def parse_topic_id(text: str | None) -> uuid.UUID:
    """Ours (the canonical hex form) or Kafka's (URL-safe base64 of the 16 bytes)."""
    if not text:
        return NULL_TOPIC_ID
    try:
        return uuid.UUID(text)
    except ValueError:
        try:
            return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (ValueError, binascii.Error):
            return NULL_TOPIC_ID


class TopicsZNode:
    """``/brokers/topics``: one child per topic."""

    @staticmethod
    def path() -> str:
        return "/brokers/topics"


class TopicZNode:
    """``/brokers/topics/<topic>``: the topic's id and replica assignment."""

    @staticmethod
    def path(topic: str) -> str:
        return f"{TopicsZNode.path()}/{topic}"

    @staticmethod
    def encode(partitions: Mapping[int, Sequence[int]], topic_id: uuid.UUID) -> bytes:
        return _dumps({"version": 2, "topic_id": str(topic_id),
                       "partitions": {str(p): [int(r) for r in reps]
                                      for p, reps in sorted(partitions.items())}})

    @staticmethod
    def decode(data: bytes | None) -> tuple[uuid.UUID, dict[int, tuple[int, ...]]] | None:
        """(topic id, partition -> replicas), or None for an empty znode."""
        d = _loads(data)
        if d is None:
            return None
        parts = {int(p): tuple(int(r) for r in reps)
                 for p, reps in (d.get("partitions") or {}).items()}
        return parse_topic_id(d.get("topic_id")), parts


class TopicPartitionsZNode:
    """``/brokers/topics/<topic>/partitions`` (no data)."""

    @staticmethod
    def path(topic: str) -> str:
        return f"{TopicZNode.path(topic)}/partitions"


class TopicPartitionZNode:
    """``/brokers/topics/<topic>/partitions/<p>`` (no data)."""

    @staticmethod
    def path(topic: str, partition: int) -> str:
        return f"{TopicPartitionsZNode.path(topic)}/{partition}"


class TopicPartitionStateZNode:
    """``/brokers/topics/<topic>/partitions/<p>/state``: the partition's LeaderAndIsr, written
    by the controller and by the leader (ISR changes), each on the condition of its version."""

    @staticmethod
    def path(topic: str, partition: int) -> str:
        return f"{TopicPartitionZNode.path(topic, partition)}/state"

    @staticmethod
    def encode(state: LeaderAndIsr) -> bytes:
        return _dumps({"version": 1, "leader": state.leader, "leader_epoch": state.leader_epoch,
                       "isr": list(state.isr), "controller_epoch": state.controller_epoch})

    @staticmethod
    def decode(data: bytes | None) -> LeaderAndIsr | None:
        d = _loads(data)
        if d is None:
            return None
        return LeaderAndIsr(int(d["leader"]), int(d["leader_epoch"]),
                            tuple(int(r) for r in d["isr"]), int(d["controller_epoch"]))


# -- configs -----------------------------------------------------------------------------------


class ConfigType:
    """The entity types under ``/config`` (Kafka's ConfigType) that oncelog keeps: topics'
    overrides and dynamic broker configs (``/config/brokers/<id>``, and the cluster-wide
    default ``/config/brokers/<default>``)."""

    TOPIC = "topics"
    USER = "users"  # SCRAM credentials (KIP-554), cluster/zk_user_configs.py
    BROKER = "brokers"
    DEFAULT = "<default>"  # Kafka's ZooKeeperInternals.DEFAULT_STRING


class ConfigEntityTypeZNode:
    """``/config/<entity type>``: one child per entity with configs."""

    @staticmethod
    def path(entity_type: str) -> str:
        return f"/config/{entity_type}"


class ConfigEntityZNode:
    """``/config/<entity type>/<name>``: the entity's configs (name -> value, as strings)."""

    @staticmethod
    def path(entity_type: str, entity_name: str) -> str:
        return f"{ConfigEntityTypeZNode.path(entity_type)}/{entity_name}"

    @staticmethod
    def encode(configs: Mapping[str, str]) -> bytes:
        return _dumps({"version": 1, "config": {str(k): str(v) for k, v in configs.items()}})

    @staticmethod
    def decode(data: bytes | None) -> dict[str, str]:
        d = _loads(data)
        return {} if d is None else {str(k): str(v) for k, v in (d.get("config") or {}).items()}


class ConfigChangesZNode:
    """``/config/changes``: a sequential child per config change (Kafka's
    ConfigEntityChangeNotificationZNode); every broker watches it and reloads the entity
    named, so that a change made through any broker reaches all of them."""

    PREFIX = "config_change_"

    @staticmethod
    def path() -> str:
        return "/config/changes"

    @staticmethod
    def sequence_path() -> str:
        """The path to create sequentially (ZooKeeper appends the number)."""
        return f"{ConfigChangesZNode.path()}/{ConfigChangesZNode.PREFIX}"

    @staticmethod
    def encode(entity_type: str, entity_name: str) -> bytes:
        return _dumps({"version": 2, "entity_path": f"{entity_type}/{entity_name}"})

    @staticmethod
    def decode(data: bytes | None) -> tuple[str, str] | None:
        """(entity type, entity name), or None for a notification that names none."""
        try:
            d = _loads(data)
        except ValueError:
            return None
        if not isinstance(d, dict) or "/" not in str(d.get("entity_path", "")):
            return None
        entity_type, _, name = str(d["entity_path"]).partition("/")
        return entity_type, name


# -- topic deletion ----------------------------------------------------------------------------


class DeleteTopicsZNode:
    """``/admin/delete_topics``: the deletion requests the controller carries out."""

    @staticmethod
    def path() -> str:
        return "/admin/delete_topics"


class DeleteTopicsTopicZNode:
    """``/admin/delete_topics/<topic>``: one deletion request (no data)."""

    @staticmethod
    def path(topic: str) -> str:
        return f"{DeleteTopicsZNode.path()}/{topic}"


# -- the controller ----------------------------------------------------------------------------


class ControllerZNode:
    """``/controller`` (ephemeral): which broker is the controller."""

    @staticmethod
    def path() -> str:
        return "/controller"

    @staticmethod
    def encode(node_id: int) -> bytes:
        return _dumps({"version": 1, "brokerid": node_id,
                       "timestamp": str(int(time.time() * 1000))})

    @staticmethod
    def decode(data: bytes | None) -> int | None:
        """The controller's broker id; None for an empty znode."""
        d = _loads(data)
        return None if d is None else int(d["brokerid"])


class ControllerEpochZNode:
    """``/controller_epoch``: the number of elections so far, as plain digits. Its zk version
    fences the controller's writes (``ControllerLease``)."""

    @staticmethod
    def path() -> str:
        return "/controller_epoch"

    @staticmethod
    def encode(epoch: int) -> bytes:
        return str(epoch).encode()

    @staticmethod
    def decode(data: bytes | None) -> int:
        return int(data or b"0")


# -- producer ids ------------------------------------------------------------------------------


class ProducerIdBlockZNode:
    """``/latest_producer_id_block``: the last block of producer ids handed out (created
    empty: no block yet)."""

    @staticmethod
    def path() -> str:
        return "/latest_producer_id_block"

    @staticmethod
    def encode(node_id: int, start: int, end: int) -> bytes:
        return _dumps({"version": 1, "broker": node_id, "block_start": start, "block_end": end})

    @staticmethod
    def decode(data: bytes | None) -> tuple[int, int, int] | None:
        """(broker, start, end inclusive), or None while no block was handed out. Kafka wrote
        the numbers as strings: both are read."""
        d = _loads(data)
        if d is None:
            return None
        return int(d["broker"]), int(d["block_start"]), int(d["block_end"])


# -- the cluster id ----------------------------------------------------------------------------


class ClusterIdZNode:
    """``/cluster/id``: the cluster's id, proposed by the first broker."""

    @staticmethod
    def path() -> str:
        return "/cluster/id"

    @staticmethod
    def encode(cluster_id: str) -> bytes:
        # Not compact, unlike the others: the bytes clusters already hold.
        return json.dumps({"version": "1", "id": cluster_id}).encode()

    @staticmethod
    def decode(data: bytes) -> str:
        return str(json.loads(data)["id"])


# The persistent paths every broker makes sure of at connection (Kafka's
# ZkData.PersistentZkPaths): their children come and go, they stay.
PERSISTENT_ZK_PATHS = (BrokerIdsZNode.path(), TopicsZNode.path(),
                       ConfigEntityTypeZNode.path(ConfigType.TOPIC), DeleteTopicsZNode.path(),
                       ProducerIdBlockZNode.path(), ConfigEntityTypeZNode.path(ConfigType.BROKER),
                       ConfigChangesZNode.path())
