"""The controller's election in ZooKeeper (Kafka's KafkaZkClient
registerControllerAndIncrementControllerEpoch, getControllerId, getControllerEpoch):
the ephemeral ``/controller`` and ``/controller_epoch``.

The controller's writes are fenced as Kafka's were: a ``ControllerLease`` (from ``campaign``)
carries the zk version of ``/controller_epoch`` after the election; it is the ``Fence`` of the
controller's writes (each a ZooKeeper transaction that checks that version first:
``ControllerMovedError`` when another controller was elected since).

``ControllerElection`` is given the broker's ZooKeeper connection
(cluster/zookeeper_client.py); its methods block (ZooKeeper): call them from worker threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from .errors import ControllerMovedError
from .zk_data import ControllerEpochZNode, ControllerZNode
from .zookeeper_client import RETRYABLE, ZooKeeperClient, failures

__all__ = ["ControllerElection", "ControllerLease"]

log = logging.getLogger("oncelog.cluster.zk")


@dataclass(frozen=True)
class ControllerLease:
    """What ``campaign`` won: the controller epoch and the zk version of ``/controller_epoch``
    that fences this controller's writes (a ``Fence``)."""

    node_id: int
    epoch: int
    epoch_zk_version: int

    @property
    def fence_path(self) -> str:
        return ControllerEpochZNode.path()

    @property
    def fence_version(self) -> int:
        return self.epoch_zk_version

    def fenced_error(self) -> Exception:
        return ControllerMovedError(
            f"controller epoch {self.epoch} of broker {self.node_id} is over: another "
            "controller was elected")


class ControllerElection:
    """Campaigning for ``/controller``, and who holds it."""

    def __init__(self, zk: ZooKeeperClient) -> None:
        self.zk = zk

    def campaign(self, node_id: int) -> ControllerLease | None:
        """Try to become the controller: create the ephemeral ``/controller`` and bump
        ``/controller_epoch`` in one transaction, conditional on the epoch's version (Kafka's
        registerControllerAndIncrementControllerEpoch). None when another broker is the
        controller."""
        data = ControllerZNode.encode(node_id)
        epoch_path = ControllerEpochZNode.path()
        for _ in range(20):
            try:
                raw, stat = self.zk.get(epoch_path)
            except NoNodeError:
                try:
                    self.zk.create(epoch_path, ControllerEpochZNode.encode(0))
                except NodeExistsError:
                    pass
                continue
            epoch, version = ControllerEpochZNode.decode(raw), int(stat.version)
            if self.zk.exists(ControllerZNode.path()) is not None:
                return self._own_lease(node_id)
            tx = self.zk.transaction()
            tx.create(ControllerZNode.path(), data, ephemeral=True)
            tx.set_data(epoch_path, ControllerEpochZNode.encode(epoch + 1), version)
            try:
                results = self.zk.commit(tx)
            except RETRYABLE:
                if self.zk.closed:
                    raise
                lease = self._own_lease(node_id)
                if lease is not None:
                    return lease
                continue
            if not failures(results):
                log.info("broker %d is the controller, epoch %d", node_id, epoch + 1)
                return ControllerLease(node_id, epoch + 1, version + 1)
            if isinstance(results[0], NodeExistsError):
                return self._own_lease(node_id)
            # the epoch moved (another broker won and maybe went already): look again
        return None

    def _own_lease(self, node_id: int) -> ControllerLease | None:
        """The lease if ``/controller`` is ours (this session, this node id)."""
        try:
            data, stat = self.zk.get(ControllerZNode.path())
            raw, estat = self.zk.get(ControllerEpochZNode.path())
        except NoNodeError:
            return None
        if not self.zk.owns(stat) or ControllerZNode.decode(data) != node_id:
            return None
        return ControllerLease(node_id, ControllerEpochZNode.decode(raw), int(estat.version))

    def elect(self, node_id: int) -> int | None:
        """``campaign`` returning the controller epoch won, or None."""
        lease = self.campaign(node_id)
        return None if lease is None else lease.epoch

    def controller_id(self) -> int | None:
        try:
            data, _stat = self.zk.get(ControllerZNode.path())
        except NoNodeError:
            return None
        return ControllerZNode.decode(data)

    def controller_epoch(self) -> tuple[int, int] | None:
        """(controller epoch, zk version of ``/controller_epoch``), None before any election."""
        try:
            raw, stat = self.zk.get(ControllerEpochZNode.path())
        except NoNodeError:
            return None
        return ControllerEpochZNode.decode(raw), int(stat.version)

    def holds(self, lease: ControllerLease) -> bool:
        """Whether ``lease`` still holds: /controller is this session's and the epoch the
        same."""
        own = self._own_lease(lease.node_id)
        return own is not None and own.epoch_zk_version == lease.epoch_zk_version

    def resign(self, lease: ControllerLease) -> None:
        """Delete ``/controller`` if it is still ours (another broker takes over at once)."""
        self.zk.delete_if_owned(ControllerZNode.path())

    def watch(self, callback: Callable[[int | None], Any]) -> None:
        """``callback(controller id or None)`` now and on every change of ``/controller``."""
        def on_data(data: bytes | None, stat: ZnodeStat | None) -> Any:
            try:
                controller = ControllerZNode.decode(data)
            except (ValueError, KeyError):
                controller = None
            return callback(controller)
        self.zk.watch_data(ControllerZNode.path(), on_data)
