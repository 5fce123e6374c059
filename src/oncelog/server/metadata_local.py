"""A single node is a cluster of one: the metadata of a broker without ZooKeeper.

As in Kafka, where a lone broker is a cluster with replication factor 1 and the same code runs
either way, the broker under ``LocalMetadata`` has a replica manager, partition leaders, leader
epochs and ISRs, and its coordinators follow the leadership of their partitions. The difference
is only where the metadata lives and who decides:

- the state is the data directory: the topics are the ``.topics/`` files (server/topics.py),
  the leader epochs the partitions' ``leader-epoch-checkpoint`` files, the producer id blocks
  ``producer-id-block``;
- the controller's decisions (cluster/election.py) run in process, with this broker as the
  only live broker. A start is a broker that re-registers: every hosted partition is elected
  again at a higher leader epoch (Kafka's controller does the same when a broker bounces). The
  coordinators take the leader epoch of their partition as coordinator epoch, so markers of an
  earlier run are fenced (this replaces the earlier ``txn-coordinator-epoch`` file, which is
  read once to carry its epoch over and then removed).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from types import MappingProxyType

from kio.schema.errors import ErrorCode

from ..cluster.election import new_partition_states, on_brokers_changed
from ..cluster.model import BrokerInfo, ClusterView, LeaderAndIsr, TopicAssignment
from . import dynamic_config
from .clock import now_ms
from .metadata import CreatedTopic, Metadata
from .topics import TopicError

log = logging.getLogger("oncelog.metadata")

# Written by oncelog before a single node was a cluster of one: the transaction coordinator's
# epoch, bumped at every start. Read once (the new leader epochs start above it).
LEGACY_EPOCH_FILE = "txn-coordinator-epoch"
PRODUCER_ID_BLOCK_FILE = "producer-id-block"
CONTROLLER_EPOCH = 0  # one controller, ever: this broker


class LocalMetadata(Metadata):
    def _setup(self) -> None:
        self._seq = 0
        self._states: dict[tuple[str, int], tuple[LeaderAndIsr, int]] = {}

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Elect this broker leader of every partition it has, one leader epoch above the
        last one each partition recorded, and publish the view."""
        self.loop = asyncio.get_running_loop()
        self.credentials.open_credentials(self.scram_store())
        data_dir = self.data_dir
        legacy = _read_legacy_epoch(data_dir / LEGACY_EPOCH_FILE)
        assignments = self._assignments()
        # The state each partition was left in: led by this broker at the last epoch its log
        # recorded. The controller sees this broker come back (``bounced``) and elects it again.
        previous: dict[tuple[str, int], LeaderAndIsr] = {}
        for name, t in self.topics.topics.items():
            for p in t.partitions:
                latest = p.log.leader_epoch_cache.latest_epoch
                epoch = max(-1 if latest is None else latest, legacy)
                previous[(name, p.index)] = LeaderAndIsr(self.node_id, max(epoch, 0),
                                                         (self.node_id,), CONTROLLER_EPOCH)
        live = {self.node_id}
        changed = on_brokers_changed(assignments, previous, live, CONTROLLER_EPOCH,
                                     bounced=live)
        self._states = {tp: (changed.get(tp, state), 0) for tp, state in previous.items()}
        for tp, state in new_partition_states(assignments, previous, live,
                                              CONTROLLER_EPOCH).items():
            self._states[tp] = (state, 0)
        self._publish_local()
        # The epochs are in the partitions' checkpoints now (the replica manager assigned them
        # on becoming leader): the old epoch file has done its job.
        if legacy >= 0:
            (data_dir / LEGACY_EPOCH_FILE).unlink(missing_ok=True)

    def close(self) -> None:
        pass

    def _assignments(self) -> dict[str, dict[int, tuple[int, ...]]]:
        return {name: {p.index: (self.node_id,) for p in t.partitions}
                for name, t in self.topics.topics.items()}

    def _publish_local(self) -> None:
        self._seq += 1
        host, port = self.advertised()
        topics = {
            name: TopicAssignment(name, t.topic_id, {p.index: (self.node_id,)
                                                     for p in t.partitions}, t.configs)
            for name, t in self.topics.topics.items()}
        view = ClusterView(
            self._seq, MappingProxyType({self.node_id: BrokerInfo(self.node_id, host, port)}),
            MappingProxyType(topics), MappingProxyType(dict(self._states)), self.node_id)
        self._publish(view)

    # -- topics -------------------------------------------------------------------------------

    def _create(self, name: str, num: int, configs: dict, *, internal: bool = False) -> None:
        """Create the topic's logs (server/topics.py undoes a half-made one), elect its
        partitions' first leader (this broker, epoch 0) and publish."""
        topic = self.topics.create(name, num, configs, now_ms(), internal=internal)
        assignments = {name: {p.index: (self.node_id,) for p in topic.partitions}}
        for tp, state in new_partition_states(assignments, (), {self.node_id},
                                              CONTROLLER_EPOCH).items():
            self._states[tp] = (state, 0)
        self._publish_local()

    async def create_topic(self, name: str, num: int, rf: int, configs: dict,
                           assignment: dict[int, list[int]] | None, *, validate_only: bool,
                           timeout_ms: int) -> CreatedTopic:
        topics = self.topics
        clean = topics.validate_new(name, max(num, 1) if assignment is None
                                    else len(assignment), configs)
        self.check_collision(name)
        plan = self.plan(num, rf, assignment)
        rf_used = len(next(iter(plan.values())))
        if validate_only:  # as Kafka: the id the topic would have had
            import uuid

            return CreatedTopic(uuid.uuid4(), clean, len(plan), rf_used)
        self._create(name, len(plan), configs)
        topic = topics.topics[name]
        return CreatedTopic(topic.topic_id, dict(topic.configs), len(plan), rf_used)

    async def create_partitions(self, name: str, count: int,
                                assignment: list[list[int]] | None, *, validate_only: bool,
                                timeout_ms: int) -> None:
        plan = self.plan_new_partitions(name, count, assignment)
        if validate_only:
            return
        topic = self.topics.topics[name]
        try:
            self.topics.host(name, topic.topic_id, count, topic.configs,
                                    {p.index for p in topic.partitions} | set(plan), now_ms())
        except OSError as exc:
            raise TopicError(ErrorCode.kafka_storage_error, f"cannot add partitions to {name!r}: "
                             f"{exc}") from None
        assignments = {name: {p: (self.node_id,) for p in plan}}
        for tp, state in new_partition_states(assignments, (), {self.node_id},
                                              CONTROLLER_EPOCH).items():
            self._states[tp] = (state, 0)
        self._publish_local()

    def request_topic(self, name: str, num: int, rf: int, configs: dict
                      ) -> ErrorCode | None:
        try:
            self.plan(num, min(rf, 1), None)
            self._create(name, num, configs)
        except TopicError as exc:
            return exc.error_name
        return None

    def internal_replication_factor(self, configured: int) -> int:
        # offsets.topic.replication.factor and transaction.state.log.replication.factor are 3
        # by default, which a cluster of one can never meet; Kafka makes a lone broker's user
        # set them to 1, we take the cluster's size.
        return min(configured, len(self.view.brokers))

    def request_internal_topic(self, name: str) -> ErrorCode | None:
        if name in self.view.topics:
            return None
        found = self.internal_topic_plan(name)
        if found is None:
            return ErrorCode.coordinator_not_available
        plan, configs = found
        self._create(name, len(plan), configs, internal=True)  # TopicError: e.g. a full disk
        return None

    async def delete_topic(self, name: str, timeout_ms: int) -> None:
        self.check_deletable(name)
        self.topics.delete(name)
        self._states = {tp: s for tp, s in self._states.items() if tp[0] != name}
        self._publish_local()
        self.on_topic_deleted(name)

    # -- configs ------------------------------------------------------------------------------

    async def alter_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        if name not in self.topics.topics:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        self.topics.update_configs(name, configs)
        self._publish_local()

    async def alter_broker_configs(self, entity: str, configs: dict[str, str]) -> None:
        """Kept in ``<data-dir>/dynamic-broker-configs.json``."""
        data_dir = self.data_dir
        stored = dynamic_config.load_local(data_dir)
        stored[entity] = dict(configs)
        dynamic_config.save_local(data_dir, stored)
        self.on_dynamic_configs(stored.get(dynamic_config.DEFAULT_ENTITY, {}),
                                          stored.get(str(self.node_id), {}))

    # -- partition state ----------------------------------------------------------------------

    async def alter_partition(self, topic: str, index: int, state: LeaderAndIsr,
                              expected_version: int) -> int | None:
        """The leader's ISR change (Kafka's AlterPartition), on the condition of the state's
        version; the new version, or None on a conflict."""
        found = self._states.get((topic, index))
        if found is None or found[1] != expected_version:
            return None
        self._states[(topic, index)] = (state, expected_version + 1)
        self._publish_local()
        return expected_version + 1

    # -- producer ids -------------------------------------------------------------------------

    def allocate_producer_id_block(self, size: int) -> tuple[int, int]:
        """The end of the block is written (and fsynced) to ``<data-dir>/producer-id-block``
        before any id of it is handed out: after a crash the broker starts from the recorded
        end, skipping whatever was left of the block; ids may be wasted, never reused."""
        path = self.data_dir / PRODUCER_ID_BLOCK_FILE
        start = _read_block_end(path)
        end = start + size
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(str(end))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return start, end - 1


def _read_block_end(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0
    try:
        value = int(text)
    except ValueError:
        raise RuntimeError(f"{path} is damaged ({text!r}); refusing to reuse ids") from None
    if value < 0:
        raise RuntimeError(f"{path} holds a negative block end {value}")
    return value


def _read_legacy_epoch(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return -1
