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
from dataclasses import dataclass
from typing import Any

from ..cluster.election import assign_replicas
from .clock import now_ms
from .topics import (
    CONSUMER_OFFSETS,
    INTERNAL_TOPICS,
    TRANSACTION_STATE,
    TopicError,
    coordinator_partition,
)

log = logging.getLogger("oncelog.metadata")

VIEW_POLL_S = 0.05
# The coordinators' topics: the prefix of their broker settings.
INTERNAL_PREFIX = {CONSUMER_OFFSETS: "offsets.topic", TRANSACTION_STATE: "transaction.state.log"}


@dataclass
class CreatedTopic:
    topic_id: uuid.UUID
    configs: dict[str, str]
    partition_count: int
    replication_factor: int


class Metadata(ABC):
    """What both implementations share. Subclasses provide ``start``, ``close``,
    ``create_topic``, ``request_topic``, ``request_internal_topic``, ``delete_topic`` and
    ``allocate_producer_id_block``, and call ``_publish`` with every new view."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.node_id: int = broker.node_id
        self.view: Any = None  # the latest ClusterView, once there is one
        self.loop: asyncio.AbstractEventLoop | None = None
        self._view_changed = asyncio.Event()

    # -- the view -----------------------------------------------------------------------------

    def _publish(self, view) -> None:
        """On the event loop: the new view goes to the replica manager (which takes up the
        roles it says, and tells the coordinators)."""
        self.view = view
        self.broker.replication.apply(view)
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
        value = str(self.broker.config.get("advertised.listeners") or "")
        if not value:
            return self.broker.host, self.broker.port
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
                raise TopicError("invalid_request", "replica assignments given together with a "
                                 "partition count or replication factor")
            if sorted(assignment) != list(range(len(assignment))):
                raise TopicError("invalid_replica_assignment", "partition indexes must be 0..n-1")
            sizes = {len(r) for r in assignment.values()}
            for p, reps in assignment.items():
                if len(set(reps)) != len(reps) or not reps:
                    raise TopicError("invalid_replica_assignment",
                                     f"partition {p}: replicas {reps} repeat or are empty")
                unknown = [b for b in reps if b not in self.view.brokers]
                if unknown:
                    raise TopicError("invalid_replica_assignment",
                                     f"partition {p}: brokers {unknown} are not registered")
            if len(sizes) != 1:
                raise TopicError("invalid_replica_assignment",
                                 "every partition needs the same number of replicas")
            return {p: list(r) for p, r in assignment.items()}
        if num == -1:
            num = self.broker.config.int("num.partitions")
        if rf == -1:
            rf = self.broker.config.int("default.replication.factor")
        if num < 1:
            raise TopicError("invalid_partitions", f"number of partitions must be >= 1, got {num}")
        if rf < 1:
            raise TopicError("invalid_replication_factor",
                             f"replication factor must be >= 1, got {rf}")
        if rf > len(live):
            raise TopicError("invalid_replication_factor",
                             f"replication factor {rf} is larger than the {len(live)} available "
                             f"broker{'s' if len(live) != 1 else ''}")
        try:
            return assign_replicas(num, rf, live)
        except ValueError as exc:
            raise TopicError("invalid_replication_factor", str(exc)) from None

    def internal_topic_plan(self, name: str) -> tuple[dict[int, list[int]], dict[str, str]] \
            | None:
        """The replicas and configs of a coordinator topic, from the broker settings
        ``<prefix>.num.partitions`` / ``.replication.factor`` / ``.segment.bytes`` (and
        ``transaction.state.log.min.isr``); None while fewer brokers are alive than its
        replication factor needs (Kafka answers COORDINATOR_NOT_AVAILABLE meanwhile)."""
        prefix = INTERNAL_PREFIX[name]
        cfg = self.broker.config
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

    def coordinator_of(self, name: str, key: str) -> tuple[str | None, int]:
        """(error, node id) of the coordinator for a group id / transactional id: the leader
        of its partition of the internal topic, which is created on first use (TopicError when
        it cannot be)."""
        n = self.internal_partition_count(name)
        if n is None:
            self.request_internal_topic(name)
            n = self.internal_partition_count(name)
            if n is None:
                return "coordinator_not_available", -1
        leader = self.leader_of(name, coordinator_partition(key, n))
        if leader is None:
            return "coordinator_not_available", -1
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
    def request_topic(self, name: str, num: int, rf: int, configs: dict) -> str | None:
        """Auto-creation from a Metadata request: None once the topic is in the view, else
        the error to answer with meanwhile (the client asks again)."""

    @abstractmethod
    def request_internal_topic(self, name: str) -> str | None:
        """A coordinator topic, created on first use: None once it is in the view, else
        the error to answer with meanwhile. Raises TopicError when it cannot be created
        (e.g. kafka_storage_error: the disk is full)."""

    def check_deletable(self, name: str) -> None:
        """DeleteTopics' refusals, the same in both implementations (TopicError)."""
        if name not in self.view.topics:
            raise TopicError("unknown_topic_or_partition", f"topic {name!r} does not exist")
        if name in INTERNAL_TOPICS:
            raise TopicError("invalid_topic_exception", f"internal topic {name!r} cannot be "
                             "deleted")

    @abstractmethod
    async def delete_topic(self, name: str, timeout_ms: int) -> None:
        """DeleteTopics: raises TopicError."""

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
