"""The one metadata interface the broker asks, and its two implementations' common half.

A broker never asks "am I in a cluster?": it asks its metadata (``broker.metadata``) which
brokers are alive, which partitions exist and who leads them (``view``, a
``cluster.model.ClusterView``), to create and delete topics, for blocks of producer ids,
and where a coordinator lives. The replica manager follows the same view and tells the
coordinators when this broker gains or loses a partition's leadership.

Two implementations:

- ``LocalMetadata`` (server/metadata_local.py): a cluster of one. Its state is the data
  directory; it runs the controller's decisions (cluster/election.py) in process, with this
  broker as the only live broker, so every partition has replicas and ISR {this broker}.
- ``ZkMetadata`` (server/metadata_zk.py): Kafka's ZooKeeper mode; the controller is whichever
  broker won the election, the view comes from ZooKeeper's watches.

What is common (waiting for the view, replica placement, the coordinators' internal topics,
coordinator lookup) lives here in ``Metadata``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from ..cluster.election import assign_replicas
from ..security.credential_store import LocalScramStore, ScramStore
from .clock import now_ms
from .topics import (
    CONSUMER_OFFSETS,
    INTERNAL_TOPICS,
    TRANSACTION_STATE,
    TopicError,
    coordinator_partition,
)

if TYPE_CHECKING:
    from .config import BrokerConfig
    from .topics import TopicManager

log = logging.getLogger("oncelog.metadata")

MAX_PARTITIONS = 10000  # as TopicManager.validate_new

VIEW_POLL_S = 0.05
# The coordinators' topics: the prefix of their broker settings.
INTERNAL_PREFIX = {CONSUMER_OFFSETS: "offsets.topic", TRANSACTION_STATE: "transaction.state.log"}


@dataclass
class CreatedTopic:
    topic_id: uuid.UUID
    configs: dict[str, str]
    partition_count: int
    replication_factor: int


class CredentialsPort(Protocol):
    """Where the SCRAM users are loaded once their store is known (server/security_service.py)."""

    def open_credentials(self, store: ScramStore) -> None: ...


ViewListener = Callable[[Any], None]  # a new ClusterView, on the event loop
DynamicConfigsListener = Callable[[dict[str, str], dict[str, str]], None]  # (default, own)


class Metadata(ABC):
    """What both implementations share. Subclasses provide ``start``, ``close``,
    ``create_topic``, ``create_partitions``, ``request_topic``, ``request_internal_topic``,
    ``delete_topic`` and ``allocate_producer_id_block``, and call ``_publish`` with every new
    view.

    Built by the broker (server/broker.py) from what it uses: this node's id, the broker
    settings, the data directory and the logs hosted here, the cluster id of the data
    directory (a cluster's ZooKeeper may replace it), where the SCRAM users are loaded, and
    whom it tells of new dynamic broker configs and of a topic deleted. ``listener`` is where
    this broker listens (set once its socket is bound); ``view_listeners`` hear every new view
    (the replica manager, wired after both are built: each needs the other)."""

    def __init__(self, node_id: int, config: BrokerConfig, data_dir: Path,
                 topics: TopicManager, *, cluster_id: str, credentials: CredentialsPort,
                 on_dynamic_configs: DynamicConfigsListener,
                 on_topic_deleted: Callable[[str], None],
                 listener: tuple[str, int] = ("127.0.0.1", 9092)) -> None:
        self.node_id = node_id
        self.config = config
        self.data_dir = Path(data_dir)
        self.topics = topics
        self.cluster_id = cluster_id
        self.credentials = credentials
        self.on_dynamic_configs = on_dynamic_configs
        self.on_topic_deleted = on_topic_deleted
        self.listener = listener
        self.view_listeners: list[ViewListener] = []
        self.view: Any = None  # the latest ClusterView, once there is one
        self.loop: asyncio.AbstractEventLoop | None = None
        self._view_changed = asyncio.Event()
        self._setup()

    def _setup(self) -> None:
        """What a kind keeps of its own, once the common fields are set."""

    # -- the SCRAM users (KIP-554) -------------------------------------------------------------

    def scram_store(self) -> ScramStore:
        """Where the users' SCRAM credentials live: a single node's data directory (a
        cluster's ZooKeeper overrides it). Opened by ``start`` before the first view, so no
        login is answered before the users are known."""
        return LocalScramStore(self.data_dir)

    # -- the view -----------------------------------------------------------------------------

    def _publish(self, view) -> None:
        """On the event loop: the new view goes to the view listeners (the replica manager,
        which takes up the roles it says, and tells the coordinators)."""
        self.view = view
        for listener in self.view_listeners:
            listener(view)
        self._view_changed.set()

    async def wait_for(self, condition, timeout_ms: int) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000
        while not condition(self.view):
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._view_changed.clear()
            try:
                await asyncio.wait_for(self._view_changed.wait(), min(left, VIEW_POLL_S * 20))
            except TimeoutError:
                pass
        return True

    def advertised(self) -> tuple[str, int]:
        """Where other brokers and clients reach this broker: ``advertised.listeners``
        (``PLAINTEXT://host:port``, e.g. a relay in front of it), else where it listens."""
        value = str(self.config.get("advertised.listeners") or "")
        if not value:
            return self.listener
        first = value.split(",")[0].strip()
        _scheme, sep, address = first.partition("://")
        host, _, port = (address if sep else first).rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"advertised.listeners: expected PLAINTEXT://host:port, not "
                             f"{value!r}")
        return host, int(port)

    # -- topics -------------------------------------------------------------------------------

    def plan(self, num: int, rf: int, assignment: dict[int, list[int]] | None
             ) -> dict[int, list[int]]:
        """Kafka's CreateTopics checks and replica placement over the live brokers."""
        live = sorted(self.view.brokers)
        if assignment:
            if num != -1 or rf != -1:
                raise TopicError(ErrorCode.invalid_request, "replica assignments given together with a "
                                 "partition count or replication factor")
            if sorted(assignment) != list(range(len(assignment))):
                raise TopicError(ErrorCode.invalid_replica_assignment, "partition indexes must be 0..n-1")
            sizes = {len(r) for r in assignment.values()}
            for p, reps in assignment.items():
                if len(set(reps)) != len(reps) or not reps:
                    raise TopicError(ErrorCode.invalid_replica_assignment,
                                     f"partition {p}: replicas {reps} repeat or are empty")
                unknown = [b for b in reps if b not in self.view.brokers]
                if unknown:
                    raise TopicError(ErrorCode.invalid_replica_assignment,
                                     f"partition {p}: brokers {unknown} are not registered")
            if len(sizes) != 1:
                raise TopicError(ErrorCode.invalid_replica_assignment,
                                 "every partition needs the same number of replicas")
            return {p: list(r) for p, r in assignment.items()}
        if num == -1:
            num = self.config.int("num.partitions")
        if rf == -1:
            rf = self.config.int("default.replication.factor")
        if num < 1:
            raise TopicError(ErrorCode.invalid_partitions, f"number of partitions must be >= 1, got {num}")
        if rf < 1:
            raise TopicError(ErrorCode.invalid_replication_factor,
                             f"replication factor must be >= 1, got {rf}")
        if rf > len(live):
            raise TopicError(ErrorCode.invalid_replication_factor,
                             f"Unable to replicate the partition {rf} time(s): The target "
                             f"replication factor of {rf} cannot be reached because only "
                             f"{len(live)} broker(s) are registered.")  # Kafka's (KRaft) words
        try:
            return assign_replicas(num, rf, live)
        except ValueError as exc:
            raise TopicError(ErrorCode.invalid_replication_factor, str(exc)) from None

    def internal_topic_plan(self, name: str) -> tuple[dict[int, list[int]], dict[str, str]] \
            | None:
        """The replicas and configs of a coordinator topic, from the broker settings
        ``<prefix>.num.partitions`` / ``.replication.factor`` / ``.segment.bytes`` (and
        ``transaction.state.log.min.isr``); None while fewer brokers are alive than its
        replication factor needs (Kafka answers COORDINATOR_NOT_AVAILABLE meanwhile)."""
        prefix = INTERNAL_PREFIX[name]
        cfg = self.config
        rf = self.internal_replication_factor(cfg.int(f"{prefix}.replication.factor"))
        live = sorted(self.view.brokers)
        if len(live) < rf:
            log.warning("%s needs %d brokers (%s.replication.factor), %d are up", name, rf,
                        prefix, len(live))
            return None
        configs = {"segment.bytes": str(cfg.int(f"{prefix}.segment.bytes")),
                   "cleanup.policy": "compact"}  # as Kafka: they would grow for ever
        if name == TRANSACTION_STATE:
            configs["min.insync.replicas"] = str(min(cfg.int("transaction.state.log.min.isr"),
                                                     rf))
        return assign_replicas(cfg.int(f"{prefix}.num.partitions"), rf, live), configs

    def internal_replication_factor(self, configured: int) -> int:
        return configured

    # -- coordinators -------------------------------------------------------------------------

    def internal_partition_count(self, name: str) -> int | None:
        """The partition count of ``__consumer_offsets`` / ``__transaction_state`` (None until
        the topic exists)."""
        t = self.view.topics.get(name) if self.view is not None else None
        return None if t is None else len(t.partitions)

    def coordinator_of(self, name: str, key: str) -> tuple[ErrorCode | None, int]:
        """(error, node id) of the coordinator for a group id / transactional id: the leader
        of its partition of the internal topic, which is created on first use (TopicError when
        it cannot be)."""
        n = self.internal_partition_count(name)
        if n is None:
            self.request_internal_topic(name)
            n = self.internal_partition_count(name)
            if n is None:
                return ErrorCode.coordinator_not_available, -1
        leader = self.leader_of(name, coordinator_partition(key, n))
        if leader is None:
            return ErrorCode.coordinator_not_available, -1
        return None, leader

    def leader_of(self, topic: str, index: int) -> int | None:
        return self.view.leader(topic, index) if self.view is not None else None

    def describe(self) -> dict:
        v = self.view
        return {"node_id": self.node_id, "controller": v.controller_id if v else None,
                "brokers": sorted(v.brokers) if v else [], "time_ms": now_ms()}

    # -- implemented by the two kinds ---------------------------------------------------------

    @abstractmethod
    async def start(self) -> None:
        """Join: the first view is published before this returns."""

    @abstractmethod
    def close(self) -> None:
        ...

    @abstractmethod
    async def create_topic(self, name: str, num: int, rf: int, configs: dict,
                           assignment: dict[int, list[int]] | None, *, validate_only: bool,
                           timeout_ms: int) -> CreatedTopic:
        """CreateTopics: raises TopicError; returns once every partition has a leader (or the
        request's timeout passed)."""

    @abstractmethod
    def request_topic(self, name: str, num: int, rf: int, configs: dict
                      ) -> ErrorCode | None:
        """Auto-creation from a Metadata request: None once the topic is in the view, else
        the error to answer with meanwhile (the client asks again)."""

    @abstractmethod
    def request_internal_topic(self, name: str) -> ErrorCode | None:
        """A coordinator topic, created on first use: None once it is in the view, else
        the error to answer with meanwhile. Raises TopicError when it cannot be created
        (e.g. kafka_storage_error: the disk is full)."""

    def check_collision(self, name: str) -> None:
        """Kafka's createTopics: a name equal to an existing topic's once '.' and '_' are
        unified (the two collide in metric names) is INVALID_TOPIC_EXCEPTION."""
        unified = name.replace(".", "_")
        if "." not in name and "_" not in name:
            return
        for other in self.view.topics:
            if other != name and other.replace(".", "_") == unified:
                raise TopicError(ErrorCode.invalid_topic_exception,
                                 f"topic {name!r} collides with existing topic {other!r}")

    def check_deletable(self, name: str) -> None:
        """DeleteTopics' refusals, the same in both implementations (TopicError)."""
        if name not in self.view.topics:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        if name in INTERNAL_TOPICS:
            raise TopicError(ErrorCode.invalid_topic_exception, f"internal topic {name!r} cannot be "
                             "deleted")

    def plan_new_partitions(self, name: str, count: int, assignment: list[list[int]] | None
                            ) -> dict[int, list[int]]:
        """CreatePartitions' checks (Kafka's createPartitions) and the new partitions'
        replicas: the ones given, else placed over the live brokers as at topic creation
        (``assign_replicas`` continuing at the topic's partition count, starting from the
        broker of partition 0's first replica, as AdminZkClient.addPartitions). TopicError."""
        topic = self.view.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        if name in INTERNAL_TOPICS:
            # The coordinators map a group or transactional id to a partition by the count:
            # more partitions would move every coordinator and lose its state.
            raise TopicError(ErrorCode.invalid_topic_exception, f"internal topic {name!r} cannot "
                             "have partitions added")
        existing = len(topic.partitions)
        if count == existing:
            raise TopicError(ErrorCode.invalid_partitions, f"Topic already has {existing} partition(s).")
        if count < existing:
            raise TopicError(ErrorCode.invalid_partitions, f"The topic {name} currently has {existing} "
                             f"partition(s); {count} would not be an increase.")
        if count > MAX_PARTITIONS:
            raise TopicError(ErrorCode.invalid_partitions, f"more than {MAX_PARTITIONS} partitions")
        added = count - existing
        rf = len(topic.partitions[0]) if 0 in topic.partitions else 1
        if assignment is not None:
            if len(assignment) != added:
                raise TopicError(ErrorCode.invalid_replica_assignment, f"Attempted to add {added} "
                                 f"additional partition(s), but only {len(assignment)} "
                                 "assignment(s) were specified.")
            out = {}
            for i, reps in enumerate(assignment):
                if not reps:
                    raise TopicError(ErrorCode.invalid_replica_assignment, "The manual partition "
                                     "assignment includes an empty replica list.")
                if len(set(reps)) != len(reps):
                    raise TopicError(ErrorCode.invalid_replica_assignment, "The manual partition "
                                     "assignment includes duplicate replicas.")
                for b in reps:
                    if b not in self.view.brokers:
                        raise TopicError(ErrorCode.invalid_replica_assignment, "The manual partition "
                                         f"assignment includes broker {b}, but no such broker "
                                         "is registered.")
                if len(reps) != rf:
                    raise TopicError(ErrorCode.invalid_replica_assignment, "The manual partition "
                                     f"assignment includes a partition with {len(reps)} "
                                     "replica(s), but this is not consistent with previous "
                                     f"partitions, which have {rf} replica(s).")
                out[existing + i] = list(reps)
            return out
        live = sorted(self.view.brokers)
        if rf > len(live):
            raise TopicError(ErrorCode.invalid_replication_factor, f"replication factor {rf} is larger "
                             f"than the {len(live)} available broker(s)")
        first = topic.partitions[0][0] if topic.partitions.get(0) else live[0]
        start = next((i for i, b in enumerate(live) if b >= first), 0)
        # Kafka passes the start index as the first shift too (assignReplicasToBrokers'
        # fixedStartIndex).
        return assign_replicas(added, rf, live, start_index=start, start_shift=start,
                               start_partition=existing)

    @abstractmethod
    async def create_partitions(self, name: str, count: int,
                                assignment: list[list[int]] | None, *, validate_only: bool,
                                timeout_ms: int) -> None:
        """CreatePartitions: grow the topic to ``count`` partitions (``plan_new_partitions``
        checks and places them); returns once the new partitions have leaders (or the
        request's timeout passed). TopicError."""

    @abstractmethod
    async def delete_topic(self, name: str, timeout_ms: int) -> None:
        """DeleteTopics: raises TopicError."""

    @abstractmethod
    async def alter_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """AlterConfigs on a topic: its new overrides (the whole set), stored, and taken up by
        every broker that hosts it; returns once this broker has them. TopicError."""

    @abstractmethod
    async def alter_broker_configs(self, entity: str, configs: dict[str, str]) -> None:
        """The dynamic broker configs of ``entity`` (a node id, or ``<default>`` for the
        cluster-wide default; the whole set), stored and applied; returns once this broker
        applied them (server/dynamic_config.py)."""

    @abstractmethod
    async def alter_partition(self, topic: str, index: int, state, expected_version: int
                              ) -> int | None:
        """A leader's ISR change (Kafka's AlterPartition), on the condition that the
        partition's state is still at ``expected_version``: the new version, or None when it
        was not (the controller or a newer leader changed it; the next view says how)."""

    @abstractmethod
    def allocate_producer_id_block(self, size: int) -> tuple[int, int]:
        """A block of producer ids no broker of the cluster will ever hand out again:
        (first, last), both included."""


class ProducerIds:
    """Producer ids from blocks the metadata reserves (Kafka's ProducerIdManager): a block is
    taken when the last one is used up; ids left in a block when the broker stops are never
    used."""

    BLOCK_SIZE = 1000

    def __init__(self, metadata: Metadata, block_size: int = BLOCK_SIZE) -> None:
        self.metadata = metadata
        self.block_size = block_size
        self.next_id = 0
        self.block_end = 0  # exclusive

    def next_producer_id(self) -> int:
        if self.next_id >= self.block_end:
            start, end = self.metadata.allocate_producer_id_block(self.block_size)
            self.next_id, self.block_end = start, end + 1
        pid = self.next_id
        self.next_id += 1
        return pid
