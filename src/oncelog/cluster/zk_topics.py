"""Topics in ZooKeeper (Kafka's KafkaZkClient topic znodes and AdminZkClient.createTopic /
addPartitions, and the deletion requests the controller carries out):
``/brokers/topics/<topic>`` (id and replica assignment), its ``/config/topics/<topic>`` written
with it, and ``/admin/delete_topics/<topic>``.

``TopicStore`` is given the broker's ZooKeeper connection (cluster/zookeeper_client.py); its
methods block (ZooKeeper): call them from worker threads.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from .errors import ClusterError, TopicExistsError, UnknownTopicError
from .model import TopicAssignment
from .zk_data import (
    ConfigEntityZNode,
    ConfigType,
    DeleteTopicsTopicZNode,
    DeleteTopicsZNode,
    TopicPartitionsZNode,
    TopicsZNode,
    TopicZNode,
)
from .zookeeper_client import RETRYABLE, Fence, ZooKeeperClient, failures

__all__ = ["TopicStore"]

log = logging.getLogger("oncelog.cluster.zk")


def _check_topic_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or len(name) > 249:
        raise ValueError(f"illegal topic name {name!r}")


class TopicStore:
    """The topics' assignments (with their configs), their creation, partition additions and
    deletion."""

    def __init__(self, zk: ZooKeeperClient) -> None:
        self.zk = zk

    def create(self, name: str, assignment: Mapping[int, Sequence[int]],
               topic_id: uuid.UUID | None = None,
               configs: Mapping[str, str] | None = None) -> TopicAssignment:
        """Create ``/config/topics/<name>`` and ``/brokers/topics/<name>`` at once (the
        controller then elects the leaders). TopicExistsError if the topic exists or is being
        deleted."""
        _check_topic_name(name)
        if not assignment or sorted(assignment) != list(range(len(assignment))):
            raise ValueError(f"partitions must be numbered 0..n-1, not {sorted(assignment)}")
        for p, reps in assignment.items():
            if not reps or len(set(reps)) != len(reps):
                raise ValueError(f"partition {p}: bad replica list {list(reps)}")
        topic_id = topic_id or uuid.uuid4()
        configs = dict(configs or {})
        if self.zk.exists(DeleteTopicsTopicZNode.path(name)) is not None:
            raise TopicExistsError(f"topic {name!r} is marked for deletion")
        data = TopicZNode.encode(assignment, topic_id)
        config_path = ConfigEntityZNode.path(ConfigType.TOPIC, name)
        for _ in range(10):
            config_stat = self.zk.exists(config_path)
            tx = self.zk.transaction()
            if config_stat is None:
                tx.create(config_path, ConfigEntityZNode.encode(configs))
            else:  # left over (Kafka writes configs first): ours now
                tx.set_data(config_path, ConfigEntityZNode.encode(configs), config_stat.version)
            tx.create(TopicZNode.path(name), data)
            tx.create(TopicPartitionsZNode.path(name), b"")
            try:
                results = self.zk.commit(tx)
            except RETRYABLE:
                if self.zk.closed:
                    raise
                found = self.zk.get_many([TopicZNode.path(name)])[0]
                if found is not None and found[0] == data:
                    break  # ours, its answer lost
                if found is not None:
                    raise TopicExistsError(f"topic {name!r} already exists") from None
                continue
            if not failures(results):
                break
            if isinstance(results[1], NodeExistsError):
                raise TopicExistsError(f"topic {name!r} already exists")
            # the config znode changed under us: again
        else:
            raise ClusterError(f"could not create topic {name!r}: too much contention")
        return TopicAssignment(name, topic_id, {p: tuple(r) for p, r in assignment.items()},
                               configs)

    def add_partitions(self, name: str, added: Mapping[int, Sequence[int]]) -> None:
        """Add partitions to a topic's assignment (``/brokers/topics/<name>``, Kafka's
        setTopicAssignment after AdminZkClient.addPartitions); the controller then elects
        their leaders. The write is conditional on the znode's version, and ``added`` must
        continue the partitions there (ClusterError when they changed meanwhile).
        UnknownTopicError."""
        path = TopicZNode.path(name)
        found = self.zk.get_many([path])[0]
        decoded = TopicZNode.decode(found[0]) if found is not None else None
        if found is None or decoded is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        topic_id, partitions = decoded
        if sorted(added) != list(range(len(partitions), len(partitions) + len(added))):
            raise ClusterError(f"topic {name!r} has {len(partitions)} partitions now, not the "
                               f"{min(added)} the new ones were planned after")
        assignment = {**partitions, **{p: tuple(r) for p, r in added.items()}}
        if self.zk.set_conditional(path, TopicZNode.encode(assignment, topic_id),
                                   int(found[1].version)) is None:
            raise ClusterError(f"topic {name!r} changed while partitions were added")

    def get(self, name: str) -> TopicAssignment | None:
        topic, config = self.zk.get_many([TopicZNode.path(name),
                                          ConfigEntityZNode.path(ConfigType.TOPIC, name)])
        decoded = TopicZNode.decode(topic[0]) if topic is not None else None
        if decoded is None:
            return None
        return TopicAssignment(name, decoded[0], decoded[1],
                               ConfigEntityZNode.decode(config[0]) if config is not None else {})

    def names(self) -> list[str]:
        return sorted(self.zk.children(TopicsZNode.path()))

    def assignments(self) -> dict[str, TopicAssignment]:
        names = self.names()
        paths = []
        for n in names:
            paths += [TopicZNode.path(n), ConfigEntityZNode.path(ConfigType.TOPIC, n)]
        found = self.zk.get_many(paths)
        out = {}
        for i, n in enumerate(names):
            topic, config = found[2 * i], found[2 * i + 1]
            decoded = TopicZNode.decode(topic[0]) if topic is not None else None
            if decoded is not None:
                configs = ConfigEntityZNode.decode(config[0]) if config is not None else {}
                out[n] = TopicAssignment(n, decoded[0], decoded[1], configs)
        return out

    # -- deletion -----------------------------------------------------------------------------

    def request_deletion(self, name: str) -> None:
        """Ask the controller to delete a topic (``/admin/delete_topics/<name>``).
        UnknownTopicError if there is no such topic; asking twice is fine."""
        _check_topic_name(name)
        if self.zk.exists(TopicZNode.path(name)) is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        try:
            self.zk.create(DeleteTopicsTopicZNode.path(name), b"")
        except NodeExistsError:
            pass

    def pending_deletions(self) -> list[str]:
        return sorted(self.zk.children(DeleteTopicsZNode.path()))

    def delete_znodes(self, name: str, *, fence: Fence | None = None) -> bool:
        """The controller's part of a deletion: remove the topic's znodes (partition states,
        assignment, configs) and its deletion request in one transaction (the brokers see the
        topic vanish at once and delete their logs). False if there was nothing left."""
        for _ in range(20):
            tree = self._subtree(TopicZNode.path(name))
            doomed = list(reversed(tree))  # children before parents
            for extra in (ConfigEntityZNode.path(ConfigType.TOPIC, name),
                          DeleteTopicsTopicZNode.path(name)):
                if self.zk.exists(extra) is not None:
                    doomed.append(extra)
            if not doomed:
                return False
            tx = self.zk.transaction(fence)
            for path in doomed:
                tx.delete(path)
            try:
                results = self.zk.commit(tx)
            except RETRYABLE:
                if self.zk.closed:
                    raise
                continue  # look again: whatever is left goes
            if not failures(results):
                log.info("topic %s deleted", name)
                return True
            # NotEmpty / NoNode: the tree changed meanwhile; again
        raise ClusterError(f"could not delete the znodes of topic {name!r}")

    def _subtree(self, path: str) -> list[str]:
        """``path`` and everything under it, parents first ([] if it does not exist)."""
        try:
            children = self.zk.get_children(path)
        except NoNodeError:
            return []
        out = [path]
        for child in sorted(children):
            out += self._subtree(f"{path}/{child}")
        return out

    # -- watches ------------------------------------------------------------------------------

    def watch_names(self, callback: Callable[[list[str]], Any]) -> None:
        """``callback(sorted topic names)`` now, whenever topics come or go, and after each
        reconnection (``ZooKeeperClient.watch_children``: each read after the watch is armed)."""
        self.zk.watch_children(TopicsZNode.path(), callback)

    def watch_deletions(self, callback: Callable[[list[str]], Any]) -> None:
        """``callback(sorted topics to delete)`` now, on every change of
        ``/admin/delete_topics`` and after each reconnection."""
        self.zk.watch_children(DeleteTopicsZNode.path(), callback)

    def watch(self, name: str,
              callback: Callable[[uuid.UUID | None, dict[int, tuple[int, ...]] | None], Any]
              ) -> None:
        """``callback(topic_id, partitions)`` now and on every change of
        ``/brokers/topics/<name>``; ``(None, None)`` when it does not exist."""
        def on_data(data: bytes | None, stat: ZnodeStat | None) -> Any:
            decoded = TopicZNode.decode(data)
            if decoded is None:
                return callback(None, None)
            return callback(decoded[0], decoded[1])
        self.zk.watch_data(TopicZNode.path(name), on_data)
