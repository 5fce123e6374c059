"""Partition states in ZooKeeper (Kafka's KafkaZkClient createTopicPartitionStatesRaw,
getTopicPartitionStates, updateLeaderAndIsr): ``/brokers/topics/<topic>/partitions/<p>/state``,
the partition's LeaderAndIsr, written by the controller (elections, fenced by its lease) and by
the leader (ISR changes), each on the condition of the znode's zk version.

``PartitionStateStore`` is given the broker's ZooKeeper connection
(cluster/zookeeper_client.py); its methods block (ZooKeeper): call them from worker threads.
Writes that may race say so in their result (None: somebody else wrote first; re-read and
decide again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from .model import LeaderAndIsr
from .zk_data import TopicPartitionStateZNode, TopicPartitionsZNode, TopicPartitionZNode, TopicZNode
from .zookeeper_client import RETRYABLE, Fence, ZooKeeperClient, failures

__all__ = ["PartitionStateStore"]


class PartitionStateStore:
    """Every partition's LeaderAndIsr and its zk version."""

    def __init__(self, zk: ZooKeeperClient) -> None:
        self.zk = zk

    def get(self, topic: str, partition: int) -> tuple[LeaderAndIsr, int] | None:
        """(state, zk version), or None while the partition has no state znode."""
        try:
            data, stat = self.zk.get(TopicPartitionStateZNode.path(topic, partition))
        except NoNodeError:
            return None
        state = TopicPartitionStateZNode.decode(data)
        return None if state is None else (state, int(stat.version))

    def get_many(self, partitions: Iterable[tuple[str, int]]
                 ) -> dict[tuple[str, int], tuple[LeaderAndIsr, int]]:
        """``get`` of many partitions in one round trip (those with a state)."""
        tps = list(partitions)
        found = self.zk.get_many([TopicPartitionStateZNode.path(t, p) for t, p in tps])
        out = {}
        for tp, got in zip(tps, found, strict=True):
            state = TopicPartitionStateZNode.decode(got[0]) if got is not None else None
            if state is not None and got is not None:
                out[tp] = (state, int(got[1].version))
        return out

    def create(self, topic: str, partition: int, state: LeaderAndIsr, *,
               fence: Fence | None = None) -> int | None:
        """Create the state znode (version 0); None if it exists already (or the topic is
        gone). ``fence``: the controller's writes (ControllerMovedError when deposed)."""
        if self.zk.exists(TopicZNode.path(topic)) is None:
            return None
        for parent in (TopicPartitionsZNode.path(topic),
                       TopicPartitionZNode.path(topic, partition)):
            try:
                self.zk.create(parent, b"")
            except NodeExistsError:
                pass
            except NoNodeError:
                return None  # the topic went meanwhile
        path = TopicPartitionStateZNode.path(topic, partition)
        data = TopicPartitionStateZNode.encode(state)
        while True:
            try:
                if fence is None:
                    self.zk.create(path, data, retry=False)
                else:
                    tx = self.zk.transaction(fence)
                    tx.create(path, data)
                    if failures(self.zk.commit(tx)):
                        return None
                return 0
            except (NodeExistsError, NoNodeError):
                return None
            except RETRYABLE:
                if self.zk.closed:
                    raise
                try:
                    current, stat = self.zk.get(path)
                except NoNodeError:
                    continue  # not created: again
                return 0 if stat.version == 0 and current == data else None

    def update(self, topic: str, partition: int, state: LeaderAndIsr, expected_version: int, *,
               fence: Fence | None = None) -> int | None:
        """Write the state on the condition that the znode is still at ``expected_version``:
        the new version, or None on a conflict (re-read: the controller or the leader wrote
        meanwhile). ``fence``: the controller's writes (ControllerMovedError when deposed)."""
        return self.zk.set_conditional(TopicPartitionStateZNode.path(topic, partition),
                                       TopicPartitionStateZNode.encode(state), expected_version,
                                       fence)

    def watch(self, topic: str, partition: int,
              callback: Callable[[LeaderAndIsr | None, int | None], Any]) -> None:
        """``callback(state, zk_version)`` now and on every change of the partition's state
        znode (``(None, None)`` while it does not exist)."""
        def on_data(data: bytes | None, stat: ZnodeStat | None) -> Any:
            state = TopicPartitionStateZNode.decode(data) if stat is not None else None
            return callback(state, None if state is None or stat is None else int(stat.version))
        self.zk.watch_data(TopicPartitionStateZNode.path(topic, partition), on_data)
