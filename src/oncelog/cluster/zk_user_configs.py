"""Users' SCRAM credentials in ZooKeeper, as Kafka's ZooKeeper mode keeps them (KIP-554).

Each user's config entity is ``/config/users/<sanitized name>`` (``ConfigEntityZNode``: mechanism
name -> Kafka's credential string); every change is followed by a persistent sequential
``/config/changes/config_change_<seq>`` naming ``users/<sanitized name>``, which every broker
watches to reload that user (Kafka's ConfigChangeListener / ZkNodeChangeNotificationListener).
Notifications older than 15 minutes are purged by whoever reads them, as Kafka does.

``ZkScramStore`` is the credential store of a broker of a cluster (the single node's is
security/credential_store.py's ``LocalScramStore``, with the same methods), given the broker's
ZooKeeper connection (cluster/zookeeper_client.py). Its methods block (ZooKeeper): call them
from worker threads. ``watch`` calls back on kazoo's threads.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from .zk_data import ConfigChangesZNode, ConfigEntityTypeZNode, ConfigType
from .zk_data import ConfigEntityZNode as Entity
from .zookeeper_client import ZooKeeperClient

log = logging.getLogger("oncelog.cluster.zk")

# Kafka's ZkNodeChangeNotificationListener default (changeExpirationMs).
NOTIFICATION_EXPIRY_S = 15 * 60


def sanitize(name: str) -> str:
    """Kafka's Sanitizer.sanitize: URL-encoding (Java's URLEncoder keeps ``*``, which Kafka
    writes %2A; it encodes ``~``), so that any user name is one znode name."""
    return urllib.parse.quote(name, safe="").replace("~", "%7E")


def desanitize(name: str) -> str:
    return urllib.parse.unquote(name)


def _entity_path(user: str) -> str:
    return Entity.path(ConfigType.USER, sanitize(user))


class ZkScramStore:
    """The users' config entities (SCRAM credentials only are read and written here)."""

    def __init__(self, zk: ZooKeeperClient) -> None:
        self.zk = zk
        self._closed = False
        self._seen = -1  # the last notification handled (its sequence number)
        self._lock = threading.Lock()
        for path in (ConfigEntityTypeZNode.path(ConfigType.USER), ConfigChangesZNode.path()):
            zk.ensure_path(path)

    # -- reads --------------------------------------------------------------------------------

    def fetch(self, user: str) -> tuple[dict[str, str], int]:
        """(the user's config, its zk version; -1 when it has none)."""
        try:
            data, stat = self.zk.get(_entity_path(user))
        except NoNodeError:
            return {}, -1
        return Entity.decode(data), int(stat.version)

    def load_all(self) -> dict[str, dict[str, str]]:
        names = sorted(self.zk.children(ConfigEntityTypeZNode.path(ConfigType.USER)))
        found = self.zk.get_many([Entity.path(ConfigType.USER, n) for n in names])
        return {desanitize(n): Entity.decode(got[0])
                for n, got in zip(names, found, strict=True) if got is not None}

    # -- writes -------------------------------------------------------------------------------

    def change(self, user: str, config: Mapping[str, str], version: int) -> bool:
        """Write the user's config on the condition of ``version`` (-1: that it has none),
        then the change notification. False on a conflict (another broker wrote first)."""
        path = _entity_path(user)
        data = Entity.encode(config)
        try:
            if version < 0:
                self.zk.create(path, data)
            else:
                self.zk.set(path, data, version)
        except (NodeExistsError, BadVersionError, NoNodeError):
            # Ours after all if the write went through and only its answer was lost with
            # the connection (the retry then met our own write).
            try:
                current, _stat = self.zk.get(path)
            except NoNodeError:
                return False
            if current != data:
                return False
        self._notify(user)
        return True

    def seed(self, users: Mapping[str, Mapping[str, str]]) -> None:
        """The users file's users: each written only if ZooKeeper has never held it (another
        broker seeding the same file at the same time writes each user once)."""
        for user, config in users.items():
            if self.change(user, config, -1):
                log.info("SCRAM credentials of user %r seeded from the users file", user)

    def _notify(self, user: str) -> None:
        self.zk.create(ConfigChangesZNode.sequence_path(),
                       ConfigChangesZNode.encode(ConfigType.USER, sanitize(user)), sequence=True)

    # -- following other brokers' changes -----------------------------------------------------

    def watch(self, on_change: Callable[[str, dict[str, str]], Any]) -> None:
        """``on_change(user, config)`` for every change notified from now on (on kazoo's
        threads; the store's current state is ``load_all``'s)."""
        existing = self.zk.children(ConfigChangesZNode.path())
        self._seen = max((_sequence(c) for c in existing), default=-1)

        def on_children(children: list[str]) -> Any:
            if self._closed:
                return False
            try:
                self._process(sorted(children, key=_sequence), on_change)
            except Exception:  # the next notification (or reconnection) tries again
                log.exception("reading the config change notifications failed")
            return None

        self.zk.watch_children(ConfigChangesZNode.path(), on_children)

    def _process(self, children: list[str],
                 on_change: Callable[[str, dict[str, str]], Any]) -> None:
        with self._lock:
            now = time.time()
            for child in children:
                seq = _sequence(child)
                path = f"{ConfigChangesZNode.path()}/{child}"
                if seq <= self._seen:
                    self._purge(path, now)
                    continue
                try:
                    data, stat = self.zk.get(path)
                except NoNodeError:
                    self._seen = seq
                    continue
                kind, name = ConfigChangesZNode.decode(data) or ("", "")
                if kind == ConfigType.USER and name:
                    user = desanitize(name)
                    on_change(user, self.fetch(user)[0])
                self._seen = seq
                if stat.ctime / 1000 < now - NOTIFICATION_EXPIRY_S:
                    self._purge(path, now)

    def _purge(self, path: str, now: float) -> None:
        try:
            stat = self.zk.exists(path)
            if stat is not None and stat.ctime / 1000 < now - NOTIFICATION_EXPIRY_S:
                self.zk.delete(path)
        except NoNodeError:
            pass

    def close(self) -> None:
        self._closed = True  # (the session's end stops the watch too)


def _sequence(child: str) -> int:
    try:
        return int(child.rsplit("_", 1)[-1])
    except ValueError:
        return -1
