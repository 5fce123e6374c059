"""Config entities in ZooKeeper, as Kafka's AdminZkClient.changeEntityConfig and
ZkNodeChangeNotificationListener keep them: ``/config/<type>/<name>`` holds an entity's configs
and every change adds a sequential ``/config/changes/config_change_<n>`` naming the entity, which
every broker watches. Notifications older than ``NOTIFICATION_EXPIRY_S`` are removed by the
brokers that see them (Kafka: 15 minutes).

``ConfigStore`` is given the broker's ZooKeeper connection (cluster/zookeeper_client.py); its
methods block (ZooKeeper): call them from worker threads. The users' SCRAM credentials, config
entities too, are cluster/zk_user_configs.py's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from .errors import UnknownTopicError
from .zk_data import ConfigChangesZNode, ConfigEntityZNode, ConfigType, TopicZNode
from .zookeeper_client import ZooKeeperClient

__all__ = ["NOTIFICATION_EXPIRY_S", "ConfigStore"]

log = logging.getLogger("oncelog.cluster.zk")

NOTIFICATION_EXPIRY_S = 15 * 60


class ConfigStore:
    """Entities' configs (topics, brokers) and the change notifications."""

    def __init__(self, zk: ZooKeeperClient) -> None:
        self.zk = zk

    def entity_configs(self, entity_type: str, name: str) -> dict[str, str]:
        """The configs of ``/config/<entity_type>/<name>`` ({} when there are none)."""
        try:
            data, _stat = self.zk.get(ConfigEntityZNode.path(entity_type, name))
        except NoNodeError:
            return {}
        return ConfigEntityZNode.decode(data)

    def change_entity_configs(self, entity_type: str, name: str,
                              configs: Mapping[str, str]) -> None:
        """Replace an entity's configs, then announce it under ``/config/changes``."""
        path = ConfigEntityZNode.path(entity_type, name)
        data = ConfigEntityZNode.encode(configs)
        try:
            self.zk.set(path, data)
        except NoNodeError:
            try:
                self.zk.create(path, data, makepath=True)
            except NodeExistsError:
                self.zk.set(path, data)
        self.zk.create(ConfigChangesZNode.sequence_path(),
                       ConfigChangesZNode.encode(entity_type, name), sequence=True,
                       makepath=True)

    def change_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """A topic's new overrides (UnknownTopicError if there is no such topic)."""
        if self.zk.exists(TopicZNode.path(name)) is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        self.change_entity_configs(ConfigType.TOPIC, name, configs)

    def watch_changes(self, callback: Callable[[list[tuple[str, str]]], Any]) -> None:
        """``callback([(entity type, name), ...])`` with the entities named by notifications
        not seen before (all of them at the first call, which comes now), on a kazoo thread;
        expired notifications are removed on the way."""
        seen: set[str] = set()
        lock = threading.Lock()

        def on_children(children: list[str]) -> Any:
            with lock:
                fresh = sorted(c for c in children if c not in seen)
                seen.intersection_update(children)
                seen.update(fresh)
            changed: list[tuple[str, str]] = []
            now = time.time()
            for child in fresh:
                path = f"{ConfigChangesZNode.path()}/{child}"
                try:
                    data, stat = self.zk.get(path)
                    if now - stat.ctime / 1000 > NOTIFICATION_EXPIRY_S:
                        self.zk.delete(path)
                except NoNodeError:
                    continue
                except KazooException as exc:
                    log.warning("reading config change %s failed: %r", child, exc)
                    continue
                entity = ConfigChangesZNode.decode(data)
                if entity is not None and entity not in changed:
                    changed.append(entity)
            if changed:
                try:
                    callback(changed)
                except Exception:
                    log.exception("config change callback failed")
            return None

        self.zk.watch_children(ConfigChangesZNode.path(), on_children)

    def watch_topic(self, name: str, callback: Callable[[dict[str, str] | None], Any]) -> None:
        """``callback(configs)`` now and on every change of ``/config/topics/<name>`` (None
        when it does not exist)."""
        def on_data(data: bytes | None, stat: ZnodeStat | None) -> Any:
            return callback(None if stat is None else ConfigEntityZNode.decode(data))
        self.zk.watch_data(ConfigEntityZNode.path(ConfigType.TOPIC, name), on_data)
