"""The cluster's values: what a broker knows about brokers, topics and partition leadership.

Both kinds of metadata speak them: a single node's (server/metadata_local.py, a cluster of one
whose state is the data directory) and ZooKeeper's (cluster/metadata_view.py, decoded from the
znodes by cluster/zk_data.py). That is why they live apart from the ZooKeeper code: a single
node imports this module and never kazoo's.

All of them are immutable, so a ``ClusterView`` can be handed between threads (kazoo's watch
threads and the broker's event loop) without copying.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

__all__ = [
    "EMPTY_VIEW",
    "NO_LEADER",
    "NULL_TOPIC_ID",
    "TP",
    "BrokerInfo",
    "ClusterView",
    "LeaderAndIsr",
    "TopicAssignment",
]

NO_LEADER = -1
NULL_TOPIC_ID = uuid.UUID(int=0)

TP = tuple[str, int]


@dataclass(frozen=True)
class BrokerInfo:
    """A live broker (``/brokers/ids/<id>``). ``epoch`` is the registration znode's czxid:
    Kafka's broker epoch, new with every registration (a broker that restarted quickly has a
    new one)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None
    epoch: int = -1
    endpoints: tuple[str, ...] = ()


@dataclass(frozen=True)
class LeaderAndIsr:
    """A partition's state znode. ``leader`` is NO_LEADER (-1) while the partition is offline."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def __post_init__(self) -> None:
        if not isinstance(self.isr, tuple):
            object.__setattr__(self, "isr", tuple(self.isr))

    @property
    def has_leader(self) -> bool:
        return self.leader >= 0


@dataclass(frozen=True, eq=True)
class TopicAssignment:
    """A topic: its replica assignment (partition -> replicas, the first one preferred), its id
    and its configs (``/config/topics/<topic>``). Immutable (read-only mappings)."""

    name: str
    topic_id: uuid.UUID
    partitions: Mapping[int, tuple[int, ...]]
    configs: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", MappingProxyType(
            {int(p): tuple(int(r) for r in reps) for p, reps in sorted(self.partitions.items())}))
        object.__setattr__(self, "configs", MappingProxyType(
            {str(k): str(v) for k, v in self.configs.items()}))

    def __hash__(self) -> int:
        return hash((self.name, self.topic_id))

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0]) if self.partitions else 0


@dataclass(frozen=True)
class ClusterView:
    """An immutable snapshot of the cluster, safe to read from any thread.

    ``brokers``: the live brokers; ``topics``: every topic (assignment, id, configs);
    ``states``: (topic, partition) -> (LeaderAndIsr, zk version) for the partitions that have a
    state znode; ``controller_id``: the controller (None during an election); ``seq`` grows with
    every change.
    """

    seq: int
    brokers: Mapping[int, BrokerInfo]
    topics: Mapping[str, TopicAssignment]
    states: Mapping[TP, tuple[LeaderAndIsr, int]]
    controller_id: int | None

    @cached_property
    def topic_names(self) -> Mapping[uuid.UUID, str]:
        """Topic id -> name, for the requests that name topics by id (KIP-516: Fetch v13+,
        Metadata v12, DeleteTopics v6); built once per view."""
        return MappingProxyType({a.topic_id: name for name, a in self.topics.items()})

    def state(self, topic: str, partition: int) -> LeaderAndIsr | None:
        found = self.states.get((topic, partition))
        return None if found is None else found[0]

    def leader(self, topic: str, partition: int) -> int | None:
        """The partition's leader if it has one that is alive, else None."""
        state = self.state(topic, partition)
        if state is None or state.leader < 0 or state.leader not in self.brokers:
            return None
        return state.leader

    def partitions_led_by(self, node_id: int) -> list[TP]:
        return sorted(tp for tp, (s, _v) in self.states.items() if s.leader == node_id)


EMPTY_VIEW = ClusterView(0, MappingProxyType({}), MappingProxyType({}), MappingProxyType({}),
                         None)
