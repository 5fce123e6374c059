"""The group coordinator's IO: carries out what group/coordinator.py decides.

The group coordinator owns the groups of the ``__consumer_offsets`` partitions this broker
leads, one core (group/coordinator.py) per partition: the coordinator runtime
(server/coordinator_runtime.py) makes a partition's core and replays the partition into it on
becoming its leader, and drops it (its groups forgotten, their members told NOT_COORDINATOR) on
losing it. A group's requests go to the core of its partition.

Every request that may write runs as a write operation of the runtime (``schedule_write``): the
core decides, its ``WriteRecords`` are appended to the group's partition of
``__consumer_offsets`` (Kafka's ``abs(hash(group)) % offsets.topic.num.partitions``) with
acks=all, and the answer (with the held JoinGroup and SyncGroup answers the core releases,
``RespondJoin`` / ``RespondSync``) goes once the ISR has them. A JoinGroup or SyncGroup answer
that waits for a rebalance is a future, resolved when the core says so; a timer ticks the core
for session expiry and due rebalances. A TxnOffsetCommit is appended as a transactional batch
of the producer (its epoch checked by the log), and its offsets stay pending until
server/txn_marker_writer.py reports the transaction's marker on that partition. A partition is
replayed when loaded, markers included.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

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
from ..group.log_format import (
    GroupKey,
    GroupValue,
    OffsetKey,
    OffsetValue,
    encode_group,
    encode_key,
    encode_offset,
)
from .clock import now_ms
from .coordinator_runtime import (
    CoordinatorResult,
    CoordinatorRuntime,
    CoordinatorWriteError,
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
T = TypeVar("T")

# One record of __consumer_offsets: an offset or a group's metadata (None: a tombstone).
GroupRecord = tuple[OffsetKey | GroupKey, OffsetValue | GroupValue | None]
GroupResult = CoordinatorResult[GroupRecord, T]

# A TxnOffsetCommit's write errors answered as they are (the rest as ``write_error`` maps).
_TXN_COMMIT_ERRORS = {ErrorCode.invalid_producer_epoch, ErrorCode.invalid_txn_state}


def serialize(record: GroupRecord) -> tuple[bytes, bytes | None]:
    key, value = record
    if isinstance(value, OffsetValue):
        return encode_key(key), encode_offset(value)
    if isinstance(value, GroupValue):
        return encode_key(key), encode_group(value)
    return encode_key(key), None


def write_error(error: ErrorCode) -> ErrorCode:
    """A failed write's error as the group coordinator answers it: NOT_COORDINATOR when the
    partition is not (or no longer) led here, COORDINATOR_LOAD_IN_PROGRESS while it loads,
    COORDINATOR_NOT_AVAILABLE for the rest (NOT_ENOUGH_REPLICAS, a timeout, a storage
    error)."""
    if error in (ErrorCode.not_coordinator, ErrorCode.not_leader_or_follower,
                 ErrorCode.unknown_topic_or_partition, ErrorCode.coordinator_load_in_progress):
        return ErrorCode.coordinator_load_in_progress \
            if error == ErrorCode.coordinator_load_in_progress else ErrorCode.not_coordinator
    return ErrorCode.coordinator_not_available


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
        # runtime's shards, a core each.
        self.runtime: CoordinatorRuntime[GroupCoordinator, GroupRecord] = CoordinatorRuntime(
            CONSUMER_OFFSETS, writer=writer, leadership=leadership, partitions=partitions,
            metadata=metadata, new_shard=self._new_shard, serializer=serialize,
            on_loaded=self._loaded, on_unloaded=self._unloaded)
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

    def loading(self) -> bool:
        """A partition this broker leads is still being loaded (ListGroups' answer is
        partial: COORDINATOR_LOAD_IN_PROGRESS, as Kafka's)."""
        return self.runtime.loading()

    def partition_index(self, group_id: str, *, create: bool = False) -> int | None:
        """The group's partition of ``__consumer_offsets`` (Kafka's abs(hash) % its partition
        count); None until the topic exists (its creation is asked for with ``create``)."""
        return self.runtime.partition_of(group_id, create=create)

    def start(self) -> None:
        self.runtime.every(TICK_S, self._tick)
        self.runtime.every(self.config.int("offsets.retention.check.interval.ms") / 1000,
                           self._expire_offsets)

    def _tick(self) -> None:
        now = now_ms()
        for index, core in self.runtime.shards.items():
            if core.groups:  # (a partition without groups has nothing to expire or complete)
                self.runtime.write_in_background(
                    index, "classic-group-tick", lambda c: self._result(c.tick(now), None))

    def _expire_offsets(self) -> None:
        """Kafka's offsets.retention.check.interval.ms task: offsets (and groups left with
        none) past offsets.retention.minutes go, with their tombstones."""
        retention_ms = self.config.int("offsets.retention.minutes") * 60_000
        now = now_ms()
        for index, core in self.runtime.shards.items():
            if core.groups:
                self.runtime.write_in_background(
                    index, "expire-offsets",
                    lambda c: self._result(c.expire_offsets(now, retention_ms), None))

    def close(self) -> None:
        self.runtime.close()
        for fut in [*self._joins.values(), *self._syncs.values()]:
            fut.cancel()

    # -- writes -------------------------------------------------------------------------------

    def _result(self, effects: Iterable[Effect], response: T) -> GroupResult[T]:
        """A core's effects as a write's result: its records, and the held JoinGroup /
        SyncGroup answers it releases, given once the write is done (the ISR has the
        records), or failed."""
        records: list[GroupRecord] = []
        answers: list[RespondJoin | RespondSync] = []
        for e in effects:
            if isinstance(e, WriteRecords):
                records.extend(e.records)
            else:
                answers.append(e)
        if not answers:
            return CoordinatorResult(response, records)
        return CoordinatorResult(response, records, on_done=lambda _error: self._answer(answers))

    def _answer(self, answers: Iterable[RespondJoin | RespondSync]) -> None:
        for e in answers:
            held = self._joins if isinstance(e, RespondJoin) else self._syncs
            fut = held.pop((e.group_id, e.member_id), None)
            if fut is not None and not fut.done():
                fut.set_result(e.response)

    async def _write(self, group_id: str, name: str,
                     op: Callable[[GroupCoordinator], GroupResult[T]], **kw: Any) -> T:
        """``op`` as a write on the group's partition (``CoordinatorRuntime.schedule_write``).
        Raises CoordinatorWriteError."""
        return await self.runtime.schedule_write(self.partition_index(group_id), name, op, **kw)

    def offsets_partition(self, group_id: str):
        index = self.partition_index(group_id)
        p = self.partitions.partition(CONSUMER_OFFSETS, index) if index is not None \
            else None
        if p is None:
            raise LookupError(f"this broker does not host the partition of group {group_id}")
        return p

    # -- requests -----------------------------------------------------------------------------

    async def join(self, group_id: str, member_id: str, *args, **kw) -> JoinResponse:
        held: dict[tuple[str, str], asyncio.Future] = {}

        def op(core: GroupCoordinator) -> GroupResult[JoinResponse | None]:
            joined, response, effects = core.join(group_id, member_id, *args, **kw)
            if response is None:  # held until the rebalance completes
                key = (group_id, joined)
                held[key] = self._joins[key] = asyncio.get_running_loop().create_future()
            return self._result(effects, response)

        try:
            response = await self._write(group_id, "classic-group-join", op)
        except CoordinatorWriteError as exc:
            response = JoinResponse(write_error(exc.error))
        for key, fut in held.items():
            try:
                return response or await fut
            finally:
                self._joins.pop(key, None)
        assert response is not None
        return response

    async def sync(self, group_id: str, generation: int, member_id: str,
                   group_instance_id: str | None, assignments: dict[str, bytes] | None
                   ) -> SyncResponse:
        key = (group_id, member_id)
        held: list[asyncio.Future] = []

        def op(core: GroupCoordinator) -> GroupResult[SyncResponse | None]:
            response, effects = core.sync(group_id, generation, member_id, group_instance_id,
                                          assignments, now_ms())
            if response is None:  # held until the leader's assignment is written
                self._syncs[key] = asyncio.get_running_loop().create_future()
                held.append(self._syncs[key])
            return self._result(effects, response)

        try:
            response = await self._write(group_id, "classic-group-sync", op)
        except CoordinatorWriteError as exc:
            response = SyncResponse(write_error(exc.error))
        try:
            return response or await held[0]
        finally:
            self._syncs.pop(key, None)

    async def leave(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[ErrorCode | None, list[ErrorCode | None]]:
        """LeaveGroup: (the request's error, each member's)."""
        def op(core: GroupCoordinator) -> GroupResult[list[ErrorCode | None]]:
            errors, effects = core.leave(group_id, members, now_ms())
            return self._result(effects, errors)

        try:
            return None, await self._write(group_id, "classic-group-leave", op)
        except CoordinatorWriteError as exc:
            return write_error(exc.error), []

    async def commit(self, group_id: str, generation: int, member_id: str,
                     group_instance_id: str | None, offsets: dict[TP, OffsetValue]
                     ) -> ErrorCode | None:
        def op(core: GroupCoordinator) -> GroupResult[ErrorCode | None]:
            error = core.validate_commit(group_id, generation, member_id, group_instance_id,
                                         transactional=False)
            if error:
                return CoordinatorResult(error)
            def done(error: ErrorCode | None) -> None:
                if error is None:  # committed once the ISR has them
                    core.apply_offsets(group_id, offsets)

            return CoordinatorResult(None, core.commit_records(group_id, offsets).records,
                                     on_done=done)

        try:
            return await self._write(group_id, "commit-offset", op)
        except CoordinatorWriteError as exc:
            return write_error(exc.error)

    async def txn_commit(self, group_id: str, producer_id: int, producer_epoch: int,
                         generation: int, member_id: str, group_instance_id: str | None,
                         offsets: dict[TP, OffsetValue], *, verification=None,
                         require_verification: bool = False) -> ErrorCode | None:
        def op(core: GroupCoordinator) -> GroupResult[ErrorCode | None]:
            error = core.validate_commit(group_id, generation, member_id, group_instance_id,
                                         transactional=True)
            if error:
                return CoordinatorResult(error)
            # Pending from the leader's append on (the log has them: the transaction's
            # marker completes them), until the marker.
            return CoordinatorResult(None, core.commit_records(group_id, offsets).records,
                                     on_appended=lambda: core.add_pending_txn_offsets(
                                         group_id, producer_id, offsets))

        try:
            return await self._write(group_id, "txn-commit-offset", op,
                                     producer=(producer_id, producer_epoch),
                                     verification_guard=verification,
                                     require_verification=require_verification)
        except CoordinatorWriteError as exc:
            return exc.error if exc.error in _TXN_COMMIT_ERRORS else write_error(exc.error)

    async def delete_group(self, group_id: str) -> ErrorCode | None:
        """DeleteGroups of one group: its error, or None once its tombstones are written."""
        def op(core: GroupCoordinator) -> GroupResult[ErrorCode | None]:
            error, effects = core.delete_group(group_id, now_ms())
            return self._result(effects, error)

        try:
            return await self._write(group_id, "delete-group", op)
        except CoordinatorWriteError as exc:
            return write_error(exc.error)

    async def delete_offsets(self, group_id: str, partitions: list[TP],
                             subscribed_topics: Callable[[bytes], Iterable[str]]
                             ) -> tuple[ErrorCode | None, dict[TP, ErrorCode | None]]:
        """OffsetDelete (KIP-496): the group's error, and each partition's."""
        def op(core: GroupCoordinator
               ) -> GroupResult[tuple[ErrorCode | None, dict[TP, ErrorCode | None]]]:
            error, errors, effects = core.delete_offsets(group_id, partitions,
                                                         subscribed_topics)
            return self._result(effects, (error, errors))

        try:
            return await self._write(group_id, "delete-offsets", op)
        except CoordinatorWriteError as exc:
            return write_error(exc.error), {}

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
