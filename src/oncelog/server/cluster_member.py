"""A broker's membership of a cluster (cluster mode, docs/cluster.md).

``ClusterMember`` connects the broker to ZooKeeper once its socket is bound: it registers the
broker (an ephemeral node with its address), runs the controller candidate (cluster/controller.py;
one broker of the cluster wins and elects partition leaders), and follows the cluster view
(cluster/zk.py's watches: live brokers, topics, partition states), which it hands to the
replica manager on the broker's event loop. Topic creation and deletion go through ZooKeeper as
in Kafka's ZooKeeper mode: the broker that takes the request writes the assignment, the
controller elects leaders, every broker sees it in its view.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from ..cluster.controller import Controller, assign_replicas
from ..cluster.zk import ClusterStore, MetadataView, TopicExistsError
from .clock import now_ms
from .config import ConfigError, validate_topic_configs
from .replication import ReplicaManager
from .topics import CONSUMER_OFFSETS, INTERNAL_TOPICS, TRANSACTION_STATE, TopicError

log = logging.getLogger("oncelog.cluster")

VIEW_POLL_S = 0.05


@dataclass
class CreatedTopic:
    topic_id: uuid.UUID
    configs: dict[str, str]
    partition_count: int
    replication_factor: int


class ClusterMember:
    def __init__(self, broker) -> None:
        self.broker = broker
        cfg = broker.config
        self.connect = str(cfg.get("zookeeper.connect"))
        self.session_timeout_ms = cfg.int("zookeeper.session.timeout.ms")
        self.node_id: int = broker.node_id
        self.store: Any = None  # ClusterStore, once started
        self.controller: Controller | None = None
        self.metadata: MetadataView | None = None
        self.view: Any = None  # cluster/zk.py ClusterView, once the first one arrived
        self.loop: asyncio.AbstractEventLoop | None = None
        self._view_changed = asyncio.Event()
        self._requested_internal: set[str] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, timeout_s: float = 30.0) -> None:
        """Join: register, campaign for controller, and wait for the first view."""
        self.loop = asyncio.get_running_loop()
        replication = ReplicaManager(self.broker, None)
        # The coordinators follow the partitions of their internal topics.
        replication.listeners.append(self.broker.txn_coordinator.on_leadership)
        replication.listeners.append(self.broker.group_coordinator.on_leadership)
        self.broker.replication = replication
        await asyncio.to_thread(self._start_blocking)
        replication.store = self.store
        replication.start()
        deadline = self.loop.time() + timeout_s
        while self.view is None:
            if self.loop.time() > deadline:
                raise RuntimeError(f"no cluster view from ZooKeeper at {self.connect} within "
                                   f"{timeout_s:.0f} s")
            self._view_changed.clear()
            try:
                await asyncio.wait_for(self._view_changed.wait(), 1.0)
            except TimeoutError:
                pass

    def _start_blocking(self) -> None:
        self.store = ClusterStore(self.connect, session_timeout_s=self.session_timeout_ms / 1000)
        self.broker.cluster_id = self.store.cluster_id(self.broker.cluster_id)
        # Restarted right after a crash, the old session still holds our registration until
        # ZooKeeper expires it (up to its timeout): wait it out instead of failing.
        host, port = self.advertised()
        self.store.register_broker(self.node_id, host, port,
                                   timeout_s=2 * self.session_timeout_ms / 1000 + 1)
        self.metadata = MetadataView(self.store, self._on_view)
        self.controller = Controller(self.store, self.node_id, view=self.metadata)
        self.controller.start()

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

    def _on_view(self, view) -> None:
        """On a kazoo thread: hand the view to the event loop."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._apply, view)

    def _apply(self, view) -> None:
        self.view = view
        self.broker.replication.apply(view)
        self._view_changed.set()

    def close(self) -> None:
        if self.metadata is not None:
            self.metadata.close()
        if self.controller is not None:
            self.controller.stop()
        if self.broker.replication is not None:
            self.broker.replication.close()
        if self.store is not None:
            self.store.close()

    # -- waiting for the view -----------------------------------------------------------------

    async def wait_for(self, condition, timeout_ms: int) -> bool:
        assert self.loop is not None
        deadline = self.loop.time() + max(timeout_ms, 0) / 1000
        while not condition(self.view):
            left = deadline - self.loop.time()
            if left <= 0:
                return False
            self._view_changed.clear()
            try:
                await asyncio.wait_for(self._view_changed.wait(), min(left, VIEW_POLL_S * 20))
            except TimeoutError:
                pass
        return True

    # -- topics -------------------------------------------------------------------------------

    def _plan(self, name: str, num: int, rf: int, assignment: dict[int, list[int]] | None
              ) -> dict[int, list[int]]:
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
                             "brokers")
        try:
            return assign_replicas(num, rf, live)
        except ValueError as exc:
            raise TopicError("invalid_replication_factor", str(exc)) from None

    async def create_topic(self, name: str, num: int, rf: int, configs: dict,
                           assignment: dict[int, list[int]] | None, *, validate_only: bool,
                           timeout_ms: int) -> CreatedTopic:
        """CreateTopics in cluster mode: write the assignment to ZooKeeper and wait (up to
        the request's timeout) until every partition has a leader."""
        topics = self.broker.topics
        if name in self.view.topics:
            raise TopicError("topic_already_exists", f"topic {name!r} already exists")
        clean = topics.validate_new(name, max(num, 1), configs) if assignment is None else \
            topics.validate_new(name, len(assignment), configs)
        plan = self._plan(name, num, rf, assignment)
        rf_used = len(next(iter(plan.values())))
        topic_id = uuid.uuid4()
        if validate_only:
            return CreatedTopic(uuid.UUID(int=0), clean, len(plan), rf_used)
        try:
            await asyncio.to_thread(self.store.create_topic, name, plan, topic_id, clean)
        except TopicExistsError:
            raise TopicError("topic_already_exists", f"topic {name!r} already exists") from None
        await self.wait_for(lambda v: all((name, p) in v.states for p in plan), timeout_ms)
        return CreatedTopic(topic_id, clean, len(plan), rf_used)

    def request_topic(self, name: str, num: int, rf: int, configs: dict) -> str:
        """Auto-creation from a Metadata request: write the assignment, answer at once (the
        client asks again: LEADER_NOT_AVAILABLE meanwhile, as Kafka)."""
        try:
            clean = validate_topic_configs(configs)
            plan = self._plan(name, num, min(rf, max(len(self.view.brokers), 1)), None)
        except (TopicError, ConfigError) as exc:
            return getattr(exc, "error_name", "invalid_config")
        self._spawn_blocking(self.store.create_topic, name, plan, uuid.uuid4(), clean)
        return "leader_not_available"

    def request_internal_topic(self, name: str) -> str:
        """The coordinators' topics, created on first use with their replication factor
        (COORDINATOR_NOT_AVAILABLE until enough brokers are up, as Kafka)."""
        prefix = {CONSUMER_OFFSETS: "offsets.topic",
                  TRANSACTION_STATE: "transaction.state.log"}[name]
        cfg = self.broker.config
        rf = cfg.int(f"{prefix}.replication.factor")
        live = len(self.view.brokers)
        if live < rf:
            log.warning("%s needs %d brokers (%s.replication.factor), %d are up", name, rf,
                        prefix, live)
            return "coordinator_not_available"
        if name in self._requested_internal:
            return "leader_not_available"
        self._requested_internal.add(name)
        configs = {"segment.bytes": str(cfg.int(f"{prefix}.segment.bytes")),
                   "cleanup.policy": "delete"}
        if name == TRANSACTION_STATE:
            configs["min.insync.replicas"] = str(cfg.int("transaction.state.log.min.isr"))
        plan = assign_replicas(cfg.int(f"{prefix}.num.partitions"), rf, sorted(self.view.brokers))
        self._spawn_blocking(self.store.create_topic, name, plan, uuid.uuid4(), configs)
        return "leader_not_available"

    def _spawn_blocking(self, fn, *args) -> None:
        async def run() -> None:
            try:
                await asyncio.to_thread(fn, *args)
            except TopicExistsError:
                pass
            except Exception:
                log.exception("cluster operation %s failed", getattr(fn, "__name__", fn))

        assert self.loop is not None
        self.loop.create_task(run())

    async def delete_topic(self, name: str, timeout_ms: int) -> None:
        if name not in self.view.topics:
            raise TopicError("unknown_topic_or_partition", f"topic {name!r} does not exist")
        if name in INTERNAL_TOPICS:
            raise TopicError("invalid_topic_exception", f"internal topic {name!r} cannot be "
                             "deleted")
        await asyncio.to_thread(self.store.request_topic_deletion, name)
        await self.wait_for(lambda v: name not in v.topics, timeout_ms)
        self.broker.fetch_sessions.remove_topic(name)

    # -- coordinators -------------------------------------------------------------------------

    def internal_partition_count(self, name: str) -> int | None:
        """The partition count of ``__consumer_offsets`` / ``__transaction_state`` (None until
        the topic exists)."""
        t = self.view.topics.get(name) if self.view is not None else None
        return None if t is None else len(t.partitions)

    def coordinator_of(self, name: str, key: str) -> tuple[str | None, int]:
        """(error, node id) of the coordinator for a group id / transactional id: the leader
        of its partition of the internal topic, which is created on first use."""
        from .topics import coordinator_partition

        n = self.internal_partition_count(name)
        if n is None:
            err = self.request_internal_topic(name)
            return ("coordinator_not_available" if err else None), -1
        found = self.view.states.get((name, coordinator_partition(key, n)))
        if found is None or found[0].leader < 0 or found[0].leader not in self.view.brokers:
            return "coordinator_not_available", -1
        return None, found[0].leader

    def leader_of(self, topic: str, index: int) -> int | None:
        found = self.view.states.get((topic, index)) if self.view is not None else None
        if found is None or found[0].leader < 0 or found[0].leader not in self.view.brokers:
            return None
        return found[0].leader

    # -- status -------------------------------------------------------------------------------

    def describe(self) -> dict:
        v = self.view
        return {"node_id": self.node_id, "controller": v.controller_id if v else None,
                "brokers": sorted(v.brokers) if v else [], "time_ms": now_ms()}
