"""The group coordinator's IO: carries out what group/coordinator.py decides.

The group coordinator owns the groups of the ``__consumer_offsets`` partitions this broker
leads, one core (group/coordinator.py) per partition: the coordinator runtime
(server/coordinator_runtime.py) makes a partition's core and replays the partition into it on
becoming its leader, and drops it (its groups forgotten, their members told NOT_COORDINATOR) on
losing it. A group's requests go to the core of its partition.

JoinGroup and SyncGroup answers that wait for a rebalance are futures, resolved when the core
says so (``RespondJoin`` / ``RespondSync``); a timer ticks the core for session expiry and due
rebalances. Offsets and group metadata are appended to the group's partition of
``__consumer_offsets`` (Kafka's ``abs(hash(group)) % offsets.topic.num.partitions``); a
TxnOffsetCommit is appended as a transactional batch of the producer (its epoch checked by the
log), and its offsets stay pending until server/txn_marker_writer.py reports the transaction's
marker on that partition. A partition is replayed when loaded, markers included.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from ..group.coordinator import (
    Effect,
    Group,
    GroupCoordinator,
    JoinResponse,
    RespondJoin,
    RespondSync,
    SyncResponse,
    WriteRecords,
)
from ..group.log_format import GroupValue, OffsetValue, encode_group, encode_key, encode_offset
from ..records import build_batch
from .clock import now_ms
from .coordinator_runtime import (
    AppendError,
    CoordinatorRuntime,
    InternalTopicMetadata,
    LeadershipSource,
    PartitionWriter,
)
from .topics import CONSUMER_OFFSETS

if TYPE_CHECKING:
    from .config import BrokerConfig
    from .ports import HostedPartitions

log = logging.getLogger("oncelog.group")

TICK_S = 0.1
TP = tuple[str, int]


class GroupService:
    """Built by the broker (server/broker.py) from what it uses: the broker settings, the
    ``__consumer_offsets`` partitions' writer, leadership news and logs, and the cluster's
    metadata (the topic's partition count, its creation on first use)."""

    def __init__(self, config: BrokerConfig, *, writer: PartitionWriter,
                 leadership: LeadershipSource, partitions: HostedPartitions,
                 metadata: InternalTopicMetadata) -> None:
        self.config = config
        self.partitions = partitions
        # The __consumer_offsets partitions this broker leads (and so coordinates) are the
        # runtime's shards, a core each; where each one's last append ended (an offset commit
        # waits for its replication).
        self.runtime: CoordinatorRuntime[GroupCoordinator] = CoordinatorRuntime(
            CONSUMER_OFFSETS, writer=writer, leadership=leadership, partitions=partitions,
            metadata=metadata, new_shard=self._new_shard, on_loaded=self._loaded,
            on_unloaded=self._unloaded)
        self._appended_end: dict[int, int] = {}
        self._joins: dict[tuple[str, str], asyncio.Future] = {}
        self._syncs: dict[tuple[str, str], asyncio.Future] = {}

    # -- loading the partitions this broker leads ---------------------------------------------

    def load_summary(self) -> str:
        """What the loaded partitions hold (the replica manager's summary line)."""
        return f"{len(self.groups())} groups" + self.runtime.loading_note()

    def _new_shard(self, _index: int, _epoch: int) -> GroupCoordinator:
        cfg = self.config
        return GroupCoordinator(
            min_session_timeout_ms=cfg.int("group.min.session.timeout.ms"),
            max_session_timeout_ms=cfg.int("group.max.session.timeout.ms"),
            initial_rebalance_delay_ms=cfg.int("group.initial.rebalance.delay.ms"),
            max_group_size=cfg.int("group.max.size"), clock=now_ms)

    def _loaded(self, index: int, core: GroupCoordinator) -> None:
        log.debug("group coordinator for %s-%d: %d groups", CONSUMER_OFFSETS, index,
                  len(core.groups))

    def _unloaded(self, index: int, core: GroupCoordinator) -> None:
        """Leadership lost: the partition's groups are forgotten; their members waiting for a
        rebalance are told NOT_COORDINATOR and find the new coordinator."""
        mine = set(core.groups)
        for (g, _m), fut in [*self._joins.items(), *self._syncs.items()]:
            if g in mine and not fut.done():
                fut.cancel()
        self._appended_end.pop(index, None)

    # -- the group's core ---------------------------------------------------------------------

    def not_coordinator(self, group_id: str) -> ErrorCode | None:
        """NOT_COORDINATOR unless this broker leads the group's partition,
        COORDINATOR_LOAD_IN_PROGRESS while that partition is being loaded."""
        return self.runtime.shard_for(group_id)[1]

    def shard(self, group_id: str) -> GroupCoordinator:
        """The core of the group's partition, which the caller found led here
        (``not_coordinator``) in this turn of the event loop."""
        core, error = self.runtime.shard_for(group_id)
        if core is None:
            raise LookupError(f"group {group_id!r}: {error.name if error else None}")
        return core

    def group(self, group_id: str) -> Group | None:
        """The group, when this broker coordinates it."""
        core = self.runtime.shard_for(group_id)[0]
        return None if core is None else core.groups.get(group_id)

    def groups(self) -> dict[str, Group]:
        """Every group this broker coordinates (of the loaded partitions)."""
        return {g: group for core in self.runtime.shards.values()
                for g, group in core.groups.items()}

    def partition_index(self, group_id: str, *, create: bool = False) -> int | None:
        """The group's partition of ``__consumer_offsets`` (Kafka's abs(hash) % its partition
        count); None until the topic exists (its creation is asked for with ``create``)."""
        return self.runtime.partition_of(group_id, create=create)

    async def replicated(self, group_id: str) -> ErrorCode | None:
        """Wait until what was appended for the group is on the whole ISR (Kafka appends
        offsets with acks=all)."""
        index = self.partition_index(group_id)
        end = self._appended_end.get(index) if index is not None else None
        if index is None or end is None:
            return None
        err = await self.runtime.writer.replicated(index, end)
        if err == ErrorCode.not_leader_or_follower:
            return ErrorCode.not_coordinator
        return ErrorCode.coordinator_not_available if err else None

    def start(self) -> None:
        self.runtime.every(TICK_S, self._tick)
        self.runtime.every(self.config.int("offsets.retention.check.interval.ms") / 1000,
                           self._expire_offsets)

    def _tick(self) -> None:
        now = now_ms()
        for core in self.runtime.shards.values():
            self.execute(core.tick(now))

    def _expire_offsets(self) -> None:
        """Kafka's offsets.retention.check.interval.ms task: offsets (and groups left with
        none) past offsets.retention.minutes go, with their tombstones."""
        retention_ms = self.config.int("offsets.retention.minutes") * 60_000
        now = now_ms()
        for core in self.runtime.shards.values():
            self.execute(core.expire_offsets(now, retention_ms))

    def close(self) -> None:
        self.runtime.close()
        for fut in [*self._joins.values(), *self._syncs.values()]:
            fut.cancel()

    # -- effects ------------------------------------------------------------------------------

    def execute(self, effects: Iterable[Effect]) -> bool:
        ok = True
        for e in effects:
            if isinstance(e, RespondJoin):
                fut = self._joins.pop((e.group_id, e.member_id), None)
                if fut is not None and not fut.done():
                    fut.set_result(e.response)
            elif isinstance(e, RespondSync):
                fut = self._syncs.pop((e.group_id, e.member_id), None)
                if fut is not None and not fut.done():
                    fut.set_result(e.response)
            else:
                ok = self.append(e) is None and ok
        return ok

    def offsets_partition(self, group_id: str):
        return self._partition(group_id)

    def _partition(self, group_id: str):
        index = self.partition_index(group_id)
        p = self.partitions.partition(CONSUMER_OFFSETS, index) if index is not None \
            else None
        if p is None:
            raise LookupError(f"this broker does not host the partition of group {group_id}")
        return p

    def append(self, e: WriteRecords, producer: tuple[int, int] | None = None, *,
               verification=None, require_verification: bool = False) -> ErrorCode | None:
        """Append the records (as the producer's transactional batch when given); the error
        name, or None."""
        if not e.records:  # an OffsetCommit naming no topics: nothing to write (Kafka's
            return None    # storeOffsets answers an empty commit without appending)
        now = now_ms()
        records = []
        for key, value in e.records:
            encoded = None
            if isinstance(value, OffsetValue):
                encoded = encode_offset(value)
            elif isinstance(value, GroupValue):
                encoded = encode_group(value)
            records.append((encode_key(key), encoded, (), now))
        if producer is None:
            data = bytearray(build_batch(records))
        else:
            data = bytearray(build_batch(records, producer_id=producer[0],
                                         producer_epoch=producer[1], is_transactional=True))
        index = self.partition_index(e.group_id)
        if index is None:
            return ErrorCode.not_coordinator
        try:
            # The append's leader half; commits then wait for the ISR (replicated).
            result = self.runtime.writer.append_unreplicated(
                index, data, verification_guard=verification,
                require_verification=require_verification)
        except AppendError as exc:
            if exc.error_name in (ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition):
                return ErrorCode.not_coordinator
            if exc.error_name == ErrorCode.kafka_storage_error:
                log.error("__consumer_offsets write for group %r failed: %s", e.group_id, exc)
            return exc.error_name
        self._appended_end[index] = result.last_offset + 1
        return None

    # -- requests -----------------------------------------------------------------------------

    async def join(self, group_id: str, member_id: str, *args, **kw) -> JoinResponse:
        core, refused = self.runtime.shard_for(group_id)
        if core is None:
            return JoinResponse(refused)
        member_id, response, effects = core.join(group_id, member_id, *args, **kw)
        if response is not None:
            self.execute(effects)
            return response
        fut = asyncio.get_running_loop().create_future()
        self._joins[(group_id, member_id)] = fut
        self.execute(effects)
        try:
            return await fut
        finally:
            self._joins.pop((group_id, member_id), None)

    async def sync(self, group_id: str, generation: int, member_id: str,
                   group_instance_id: str | None, assignments: dict[str, bytes] | None
                   ) -> SyncResponse:
        core, refused = self.runtime.shard_for(group_id)
        if core is None:
            return SyncResponse(refused)
        response, effects = core.sync(group_id, generation, member_id, group_instance_id,
                                      assignments, now_ms())
        if response is not None:
            self.execute(effects)
            return response
        fut = asyncio.get_running_loop().create_future()
        self._syncs[(group_id, member_id)] = fut
        if not self.execute(effects):
            self._syncs.pop((group_id, member_id), None)
            return SyncResponse(ErrorCode.coordinator_not_available)
        try:
            return await fut
        finally:
            self._syncs.pop((group_id, member_id), None)

    async def commit(self, group_id: str, generation: int, member_id: str,
                     group_instance_id: str | None, offsets: dict[TP, OffsetValue]
                     ) -> ErrorCode | None:
        core, error = self.runtime.shard_for(group_id)
        if core is None:
            return error
        error = core.validate_commit(group_id, generation, member_id, group_instance_id,
                                     transactional=False)
        if error:
            return error
        error = self.append(core.commit_records(group_id, offsets))
        if error:
            return ErrorCode.not_coordinator if error == ErrorCode.not_coordinator \
                else ErrorCode.coordinator_not_available
        error = await self.replicated(group_id)
        if error:
            return error
        core.apply_offsets(group_id, offsets)
        return None

    async def txn_commit(self, group_id: str, producer_id: int, producer_epoch: int,
                   generation: int, member_id: str, group_instance_id: str | None,
                   offsets: dict[TP, OffsetValue], *, verification=None,
                   require_verification: bool = False) -> ErrorCode | None:
        core, error = self.runtime.shard_for(group_id)
        if core is None:
            return error
        error = core.validate_commit(group_id, generation, member_id, group_instance_id,
                                     transactional=True)
        if error:
            return error
        error = self.append(core.commit_records(group_id, offsets),
                            producer=(producer_id, producer_epoch), verification=verification,
                            require_verification=require_verification)
        if error:
            return error if error in (ErrorCode.invalid_producer_epoch, ErrorCode.invalid_txn_state,
                                      ErrorCode.not_coordinator) \
                else ErrorCode.coordinator_not_available
        core.add_pending_txn_offsets(group_id, producer_id, offsets)
        return await self.replicated(group_id)

    def complete_txn_offsets(self, partition_index: int, producer_id: int, commit: bool) -> None:
        """The transaction's marker is on this ``__consumer_offsets`` partition (a partition
        still loading replays the marker from its log)."""
        core = self.runtime.active(partition_index)
        if core is not None:
            core.replay_end_transaction(producer_id, commit)

    # -- metrics ------------------------------------------------------------------------------

    def metric_samples(self):
        from .metrics import Sample

        yield Sample("oncelog_groups", "consumer groups the group coordinator holds",
                     len(self.groups()))
        from .group_lag import lag_samples

        yield from lag_samples(self.groups(), self.partitions)
