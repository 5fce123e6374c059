"""Broker registration in ZooKeeper (Kafka's KafkaZkClient.registerBroker and
getAllBrokersInCluster): ``/brokers/ids/<id>``, ephemeral, one per live broker.

``BrokerRegistry`` is given the broker's ZooKeeper connection (cluster/zookeeper_client.py).
Its methods block (ZooKeeper): call them from worker threads. The registration is made again by
itself after a session expiry (the ephemeral znode went with the old session).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from .errors import BrokerIdInUseError
from .model import BrokerInfo
from .zk_data import BrokerIdsZNode, BrokerIdZNode
from .zookeeper_client import ZooKeeperClient

__all__ = ["BrokerRegistry"]

log = logging.getLogger("oncelog.cluster.zk")


class BrokerRegistry:
    """This broker's registration, and the live brokers."""

    def __init__(self, zk: ZooKeeperClient) -> None:
        self.zk = zk
        self._registration: tuple[int, bytes] | None = None
        self._lock = threading.Lock()
        zk.add_new_session_handler(self._register_again)

    def register(self, node_id: int, host: str, port: int, rack: str | None = None, *,
                 timeout_s: float = 0.0, security_protocol: str = "PLAINTEXT") -> BrokerInfo:
        """Register this broker (ephemeral ``/brokers/ids/<id>``); it is registered again by
        itself after a session expiry. BrokerIdInUseError if another live session holds the id
        (after waiting up to ``timeout_s`` seconds for it to go: a broker restarted right after a
        crash waits out its old session)."""
        data = BrokerIdZNode.encode(host, port, rack, security_protocol)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                info = self._create(node_id, data)
                break
            except BrokerIdInUseError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
        self._registration = (node_id, data)
        return info

    def _create(self, node_id: int, data: bytes) -> BrokerInfo:
        path = BrokerIdZNode.path(node_id)
        with self._lock:
            while True:
                try:
                    self.zk.create(path, data, ephemeral=True)
                except NodeExistsError:
                    pass
                try:
                    current, stat = self.zk.get(path)
                except NoNodeError:
                    continue  # went away meanwhile: create again
                if not self.zk.owns(stat):
                    raise BrokerIdInUseError(
                        f"broker id {node_id} is registered by another live ZooKeeper session "
                        f"(0x{stat.ephemeralOwner:x}): another broker with this node.id runs, "
                        "or one stopped without closing its session and it has not expired "
                        "yet (up to its session timeout)")
                if current != data:
                    self.zk.set(path, data)
                return BrokerIdZNode.decode(node_id, data, int(stat.czxid))

    def _register_again(self) -> None:
        # A new session replaced an expired one: the registration went with the old one.
        registration = self._registration
        if registration is None:
            return
        node_id, data = registration
        deadline = time.monotonic() + max(10.0, 2 * self.zk.session_timeout_s)
        while not self.zk.closed and self._registration is registration:
            try:
                self._create(node_id, data)
                log.info("broker %d registered again after its session expired", node_id)
                return
            except BrokerIdInUseError as exc:
                if time.monotonic() >= deadline:
                    log.error("cannot register broker %d again: %s", node_id, exc)
                    return
            except KazooException as exc:
                if self.zk.closed:
                    return
                log.warning("registering broker %d again failed (%r); retrying", node_id, exc)
            time.sleep(0.2)

    def unregister(self) -> None:
        """Remove this broker's registration (a clean shutdown; closing does it too)."""
        registration, self._registration = self._registration, None
        if registration is None:
            return
        self.zk.delete_if_owned(BrokerIdZNode.path(registration[0]))

    def live(self) -> dict[int, BrokerInfo]:
        """The registered brokers by id."""
        return self._read(self.zk.children(BrokerIdsZNode.path()))

    def _read(self, children: list[str]) -> dict[int, BrokerInfo]:
        ids = sorted(int(c) for c in children)
        found = self.zk.get_many([BrokerIdZNode.path(i) for i in ids])
        return {i: BrokerIdZNode.decode(i, got[0], int(got[1].czxid))
                for i, got in zip(ids, found, strict=True) if got is not None}

    def watch(self, callback: Callable[[dict[int, BrokerInfo]], Any]) -> None:
        """``callback(live brokers)`` now, on every registration change, and after each
        reconnection (a broker may have registered again with the same id meanwhile); each
        read after the watch on ``/brokers/ids`` is armed (``ZooKeeperClient.watch_children``).
        Calls are serialized, each with data read after the previous call."""
        self.zk.watch_children(BrokerIdsZNode.path(), callback, read=self._read)
