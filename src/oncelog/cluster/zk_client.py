"""The cluster's state in ZooKeeper: Kafka's KafkaZkClient, the operations on the znodes.

``KafkaZkClient`` is one broker's ZooKeeper session (``zk``, a ``ZooKeeperClient``:
cluster/zookeeper_client.py) and the parts that give the znodes their meaning, each a class of
its own module given that session:

- ``brokers``: ``BrokerRegistry`` (zk_brokers.py): this broker's registration, the live brokers;
- ``election``: ``ControllerElection`` (zk_election.py): ``/controller``, ``/controller_epoch``,
  the ``ControllerLease`` that fences the controller's writes;
- ``topics``: ``TopicStore`` (zk_topics.py): assignments, creation, added partitions, deletion;
- ``partition_states``: ``PartitionStateStore`` (zk_partition_states.py): every partition's
  LeaderAndIsr, written on the condition of its zk version;
- ``configs``: ``ConfigStore`` (zk_configs.py): entities' configs and the change notifications
  (the users' SCRAM credentials: ``ZkScramStore``, zk_user_configs.py, on the same session);
- ``producer_ids``: ``ProducerIdBlocks`` (zk_producer_ids.py).

The znodes and their encodings are cluster/zk_data.py's (docs/cluster.md has the layout).

Every method blocks: call them from worker threads (``asyncio.to_thread``), never from the
broker's event loop. ZooKeeper being away makes them retry until ``op_timeout_s`` and then raise
a ``kazoo.exceptions.KazooException`` (``RetryFailedError``). Writes that may race are
conditional on the znode version and say so in their result (None: somebody else wrote first;
re-read and decide again).

Watches (``watch*``, cluster/metadata_view.py's ``MetadataView``) call their callbacks on
kazoo's threads (its callback worker, or a short-lived thread after a reconnection; the very
first call happens in the thread that sets the watch up). Callbacks must be quick and must not
block on the event loop; to hand something to asyncio use ``loop.call_soon_threadsafe``. A
callback returning False stops its watch. Watches survive disconnections and session expiry
(they are set again, and called with the current value, on reconnection).
"""

from __future__ import annotations

from typing import Self

from kazoo.exceptions import NodeExistsError

from .zk_brokers import BrokerRegistry
from .zk_configs import ConfigStore
from .zk_data import PERSISTENT_ZK_PATHS, ClusterIdZNode
from .zk_election import ControllerElection, ControllerLease
from .zk_partition_states import PartitionStateStore
from .zk_producer_ids import ProducerIdBlocks
from .zk_topics import TopicStore
from .zookeeper_client import ZooKeeperClient

__all__ = ["ControllerLease", "KafkaZkClient"]


class KafkaZkClient:
    """One broker's ZooKeeper session and the cluster's data model on it.

    ``session_timeout_s`` (seconds) is how long ZooKeeper keeps this broker's ephemeral znodes
    (registration, controllership) after it stops hearing from it. ``op_timeout_s`` bounds each
    method's retries while ZooKeeper is unreachable.
    """

    def __init__(self, connect: str, *, session_timeout_s: float = 6.0,
                 connect_timeout_s: float = 15.0, op_timeout_s: float = 30.0) -> None:
        self.zk = ZooKeeperClient(connect, session_timeout_s=session_timeout_s,
                                  connect_timeout_s=connect_timeout_s,
                                  op_timeout_s=op_timeout_s)
        try:
            for path in PERSISTENT_ZK_PATHS:
                self.zk.ensure_path(path)
        except BaseException:
            self.zk.close()
            raise
        self.brokers = BrokerRegistry(self.zk)
        self.election = ControllerElection(self.zk)
        self.topics = TopicStore(self.zk)
        self.partition_states = PartitionStateStore(self.zk)
        self.configs = ConfigStore(self.zk)
        self.producer_ids = ProducerIdBlocks(self.zk)

    def cluster_id(self, proposed: str) -> str:
        """The cluster's id (``/cluster/id``, as Kafka): the first broker's proposal wins."""
        path = ClusterIdZNode.path()
        try:
            self.zk.create(path, ClusterIdZNode.encode(proposed), makepath=True)
        except NodeExistsError:
            pass
        data, _stat = self.zk.get(path)
        return ClusterIdZNode.decode(data)

    @property
    def closed(self) -> bool:
        return self.zk.closed

    def close(self) -> None:
        """End the session: this broker's ephemeral znodes go at once, watches stop."""
        self.zk.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
