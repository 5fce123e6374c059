"""The metadata of a ZooKeeper-coordinated cluster (Kafka's ZooKeeper mode, docs/cluster.md).

``ZkMetadata`` connects the broker to ZooKeeper once its socket is bound: it registers the
broker (an ephemeral node with its address), runs the controller candidate (cluster/controller.py;
one broker of the cluster wins and elects partition leaders), and follows the cluster view
(cluster/metadata_view.py on cluster/zk_client.py's watches: live brokers, topics, partition
states), which it hands to the replica manager on the broker's event loop. Topic creation and
deletion go through ZooKeeper as in Kafka's ZooKeeper mode: the broker that takes the request
writes the assignment, the controller elects leaders, every broker sees it in its view.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from ..cluster.controller import Controller
from ..cluster.errors import ClusterError, TopicExistsError, UnknownTopicError
from ..cluster.metadata_view import MetadataView
from ..cluster.zk_client import KafkaZkClient
from ..cluster.zk_data import ConfigType
from .config import ConfigError, validate_topic_configs
from .metadata import CreatedTopic, Metadata
from .topics import TopicError

log = logging.getLogger("oncelog.cluster")

CONFIG_WAIT_MS = 10_000  # how long AlterConfigs waits for this broker's view to show a change


class ZkMetadata(Metadata):
    def _setup(self) -> None:
        cfg = self.config
        self.connect = str(cfg.get("zookeeper.connect"))
        self.session_timeout_ms = cfg.int("zookeeper.session.timeout.ms")
        self.store: Any = None  # KafkaZkClient, once started
        self.controller: Controller | None = None
        self.metadata: MetadataView | None = None
        self._requested_internal: set[str] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, timeout_s: float = 30.0) -> None:
        """Join: register, campaign for controller, and wait for the first view."""
        self.loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._start_blocking)
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
        self.store = KafkaZkClient(self.connect, session_timeout_s=self.session_timeout_ms / 1000)
        self.cluster_id = self.store.cluster_id(self.cluster_id)
        self.credentials.open_credentials(self.scram_store())
        # Restarted right after a crash, the old session still holds our registration until
        # ZooKeeper expires it (up to its timeout): wait it out instead of failing.
        host, port = self.advertised()
        self.store.brokers.register(self.node_id, host, port,
                                    timeout_s=2 * self.session_timeout_ms / 1000 + 1,
                                    security_protocol=str(
                                        self.config.get("security.protocol")))
        # The dynamic broker configs before the first view: the logs open with them.
        default, own = self._read_broker_configs()
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self.on_dynamic_configs, default, own)
        self.store.configs.watch_changes(self._on_config_changes)
        self.metadata = MetadataView(self.store, self._on_view)
        self.controller = Controller(self.store, self.node_id, view=self.metadata)
        self.controller.start()

    def _on_view(self, view) -> None:
        """On a kazoo thread: hand the view to the event loop."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._apply, view)

    def _apply(self, view) -> None:
        self._publish(view)

    def close(self) -> None:
        if self.metadata is not None:
            self.metadata.close()
        if self.controller is not None:
            self.controller.stop()
        if self.store is not None:
            self.store.close()

    def scram_store(self):
        """The users' SCRAM credentials in ZooKeeper (/config/users), as Kafka's ZooKeeper
        mode: every broker follows the change notifications."""
        from ..cluster.zk_user_configs import ZkScramStore

        return ZkScramStore(self.store.zk)

    # -- topics -------------------------------------------------------------------------------

    async def create_topic(self, name: str, num: int, rf: int, configs: dict,
                           assignment: dict[int, list[int]] | None, *, validate_only: bool,
                           timeout_ms: int) -> CreatedTopic:
        """CreateTopics in cluster mode: write the assignment to ZooKeeper and wait (up to
        the request's timeout) until every partition has a leader."""
        topics = self.topics
        if name in self.view.topics:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        clean = topics.validate_new(name, max(num, 1), configs) if assignment is None else \
            topics.validate_new(name, len(assignment), configs)
        self.check_collision(name)
        plan = self.plan(num, rf, assignment)
        rf_used = len(next(iter(plan.values())))
        topic_id = uuid.uuid4()
        if validate_only:  # as Kafka: the id the topic would have had
            return CreatedTopic(topic_id, clean, len(plan), rf_used)
        try:
            await asyncio.to_thread(self.store.topics.create, name, plan, topic_id, clean)
        except TopicExistsError:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.") from None
        await self.wait_for(lambda v: all((name, p) in v.states for p in plan), timeout_ms)
        return CreatedTopic(topic_id, clean, len(plan), rf_used)

    async def create_partitions(self, name: str, count: int,
                                assignment: list[list[int]] | None, *, validate_only: bool,
                                timeout_ms: int) -> None:
        """CreatePartitions in cluster mode, as Kafka's ZooKeeper mode: only the controller
        takes it (NOT_CONTROLLER elsewhere: the client finds the controller again); it places
        the new replicas and writes the topic's whole assignment znode, conditional on the
        version it planned from; the controller's next pass elects the new partitions'
        leaders and every broker opens the replicas the view assigns it."""
        if self.controller is None or not self.controller.active:
            raise TopicError(ErrorCode.not_controller, "this broker is not the controller")
        if name in await asyncio.to_thread(self.store.topics.pending_deletions):
            raise TopicError(ErrorCode.invalid_topic_exception, "The topic is queued for deletion.")
        plan = self.plan_new_partitions(name, count, assignment)
        if validate_only:
            return
        try:
            await asyncio.to_thread(self.store.topics.add_partitions, name, plan)
        except UnknownTopicError:
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             f"topic {name!r} does not exist") from None
        except ClusterError as exc:  # partitions added meanwhile: planned from a stale count
            raise TopicError(ErrorCode.invalid_partitions, str(exc)) from None
        self.controller.poke()
        await self.wait_for(lambda v: all((name, p) in v.states for p in plan), timeout_ms)

    def request_topic(self, name: str, num: int, rf: int, configs: dict
                      ) -> ErrorCode | None:
        """Auto-creation from a Metadata request: write the assignment, answer at once (the
        client asks again: LEADER_NOT_AVAILABLE meanwhile, as Kafka)."""
        try:
            clean = validate_topic_configs(configs)
            plan = self.plan(num, min(rf, max(len(self.view.brokers), 1)), None)
        except (TopicError, ConfigError) as exc:
            return getattr(exc, "error_name", ErrorCode.invalid_config)
        self._spawn_blocking(self.store.topics.create, name, plan, uuid.uuid4(), clean)
        return ErrorCode.leader_not_available

    def request_internal_topic(self, name: str) -> ErrorCode | None:
        """The coordinators' topics, created on first use with their replication factor
        (COORDINATOR_NOT_AVAILABLE until enough brokers are up, as Kafka)."""
        if name in self.view.topics:
            return None
        found = self.internal_topic_plan(name)
        if found is None:
            return ErrorCode.coordinator_not_available
        if name in self._requested_internal:
            return ErrorCode.leader_not_available
        self._requested_internal.add(name)
        plan, configs = found
        self._spawn_blocking(self.store.topics.create, name, plan, uuid.uuid4(), configs)
        return ErrorCode.leader_not_available

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
        self.check_deletable(name)
        await asyncio.to_thread(self.store.topics.request_deletion, name)
        await self.wait_for(lambda v: name not in v.topics, timeout_ms)
        self.on_topic_deleted(name)

    # -- configs ------------------------------------------------------------------------------

    async def alter_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        """``/config/topics/<name>`` and a ``/config/changes`` notification, as Kafka's
        ZooKeeper mode; every broker's view follows the config znode."""
        try:
            await asyncio.to_thread(self.store.configs.change_topic_configs, name, configs)
        except UnknownTopicError:
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             f"The topic '{name}' does not exist.") from None
        await self.wait_for(lambda v: name not in v.topics
                            or dict(v.topics[name].configs) == configs, CONFIG_WAIT_MS)

    async def alter_broker_configs(self, entity: str, configs: dict[str, str]) -> None:
        """``/config/brokers/<entity>`` and a notification that every broker follows."""
        await asyncio.to_thread(self.store.configs.change_entity_configs, ConfigType.BROKER, entity,
                                configs)
        default, own = await asyncio.to_thread(self._read_broker_configs)
        self.on_dynamic_configs(default, own)

    def _read_broker_configs(self) -> tuple[dict[str, str], dict[str, str]]:
        """(cluster-wide default, this broker's own) dynamic configs (blocking)."""
        return (self.store.configs.entity_configs(ConfigType.BROKER, ConfigType.DEFAULT),
                self.store.configs.entity_configs(ConfigType.BROKER, str(self.node_id)))

    def _on_config_changes(self, entities: list[tuple[str, str]]) -> None:
        """On a kazoo thread: a change of the default's or this broker's configs is read and
        handed to the event loop (topics' come with the view)."""
        if not any(t == ConfigType.BROKER and n in (ConfigType.DEFAULT, str(self.node_id))
                   for t, n in entities):
            return
        default, own = self._read_broker_configs()
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.on_dynamic_configs, default, own)

    # -- partition state ----------------------------------------------------------------------

    async def alter_partition(self, topic: str, index: int, state, expected_version: int
                              ) -> int | None:
        from kazoo.exceptions import KazooException

        try:
            return await asyncio.to_thread(self.store.partition_states.update, topic, index,
                                           state, expected_version)
        except (KazooException, OSError) as exc:  # ZooKeeper away: the leader tries again
            log.warning("%s-%d: ISR change failed: %s", topic, index,
                        str(exc) or type(exc).__name__)  # kazoo's errors are often empty
            return None

    # -- producer ids -------------------------------------------------------------------------

    def allocate_producer_id_block(self, size: int) -> tuple[int, int]:
        """From ``/latest_producer_id_block``, so that no two brokers ever hand out the same
        id (blocking: ZooKeeper)."""
        return self.store.producer_ids.allocate(self.node_id, size)
