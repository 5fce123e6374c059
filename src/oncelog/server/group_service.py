"""The group coordinator's IO: carries out what group/coordinator.py decides.

The group coordinator owns the groups of the ``__consumer_offsets`` partitions this broker
leads: the coordinator runtime (server/coordinator_runtime.py) loads a partition on becoming its
leader and unloads it (its groups forgotten, their members told NOT_COORDINATOR) on losing it.

JoinGroup and SyncGroup answers that wait for a rebalance are futures, resolved when the core
says so (``RespondJoin`` / ``RespondSync``); a timer ticks the core for session expiry and due
rebalances. Offsets and group metadata are appended to the group's partition of
``__consumer_offsets`` (Kafka's ``abs(hash(group)) % offsets.topic.num.partitions``); a
TxnOffsetCommit is appended as a transactional batch of the producer (its epoch checked by the
log), and its offsets stay pending until handlers/txn_markers.py reports the transaction's
marker on that partition. A partition is replayed when loaded, markers included.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from ..group.coordinator import (
    Effect,
    GroupCoordinator,
    JoinResponse,
    RespondJoin,
    RespondSync,
    SyncResponse,
    WriteRecords,
)
from ..group.log_format import (
    GroupLogFormatError,
    GroupValue,
    OffsetKey,
    OffsetValue,
    decode_group,
    decode_key,
    decode_offset,
    encode_group,
    encode_key,
    encode_offset,
)
from ..records import build_batch
from ..records.batch import CONTROL_COMMIT, parse_control_record
from .clock import now_ms
from .coordinator_runtime import AppendError, CoordinatorRuntime
from .topics import CONSUMER_OFFSETS, coordinator_partition

log = logging.getLogger("oncelog.group")

TICK_S = 0.1
TP = tuple[str, int]


class GroupService:
    def __init__(self, broker) -> None:
        self.broker = broker
        cfg = broker.config
        self.core = GroupCoordinator(
            min_session_timeout_ms=cfg.int("group.min.session.timeout.ms"),
            max_session_timeout_ms=cfg.int("group.max.session.timeout.ms"),
            initial_rebalance_delay_ms=cfg.int("group.initial.rebalance.delay.ms"),
            max_group_size=cfg.int("group.max.size"))
        # The __consumer_offsets partitions this broker leads (and so coordinates) are the
        # runtime's shards; where each one's last append ended (an offset commit waits for
        # its replication).
        self.runtime = CoordinatorRuntime(broker, CONSUMER_OFFSETS, load=self._load,
                                          unload=self._unload)
        broker.replication.load_details[CONSUMER_OFFSETS] = \
            lambda: f"{len(self.core.groups)} groups"
        self._appended_end: dict[int, int] = {}
        self._joins: dict[tuple[str, str], asyncio.Future] = {}
        self._syncs: dict[tuple[str, str], asyncio.Future] = {}

    # -- loading the partitions this broker leads ---------------------------------------------

    def _load(self, index: int, p, _epoch: int) -> bool:
        self._load_partition(p, self.runtime.partition_count() or 1)
        log.debug("group coordinator for %s-%d: %d groups in all", CONSUMER_OFFSETS, index,
                  len(self.core.groups))
        return True

    def _unload(self, index: int, _shard) -> None:
        """Leadership lost: the partition's groups are forgotten; their members waiting for a
        rebalance are told NOT_COORDINATOR and find the new coordinator."""
        n = self.runtime.partition_count() or 1
        mine = {g for g in self.core.groups if coordinator_partition(g, n) == index}
        for g in mine:
            self.core.groups.pop(g, None)
        for (g, _m), fut in [*self._joins.items(), *self._syncs.items()]:
            if g in mine and not fut.done():
                fut.cancel()
        self._appended_end.pop(index, None)

    def _load_partition(self, p, n: int) -> None:
        """Replay one partition of __consumer_offsets (markers included)."""
        now = now_ms()
        for h, records in p.log.iter_records():
            if h.is_control:
                if not records:
                    continue  # a marker the log cleaner emptied: its transaction is long done
                ctype, _epoch = parse_control_record(records[0])
                groups = [g for g in self.core.groups if coordinator_partition(g, n) == p.index]
                self.core.complete_txn_offsets(groups, h.producer_id, ctype == CONTROL_COMMIT)
                continue
            pid = h.producer_id if h.is_transactional else None
            for r in records:
                try:
                    key = decode_key(r.key or b"")
                    if isinstance(key, OffsetKey):
                        self.core.load_offset(
                            key, None if r.value is None else decode_offset(r.value), pid)
                    else:
                        self.core.load_group(
                            key, None if r.value is None else decode_group(r.value), now)
                except GroupLogFormatError as exc:
                    log.error("skipping a bad record at %s-%d offset %d: %s",
                              CONSUMER_OFFSETS, p.index, r.offset, exc)

    def not_coordinator(self, group_id: str) -> ErrorCode | None:
        """NOT_COORDINATOR unless this broker leads the group's partition."""
        index = self.partition_index(group_id, create=True)
        return ErrorCode.not_coordinator if index is None or index not in self.runtime.shards else None

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
        err = await self.runtime.replicated(index, end)
        if err == ErrorCode.not_leader_or_follower:
            return ErrorCode.not_coordinator
        return ErrorCode.coordinator_not_available if err else None

    def start(self) -> None:
        self.runtime.every(TICK_S, self._tick)
        self.runtime.every(self.broker.config.int("offsets.retention.check.interval.ms") / 1000,
                           self._expire_offsets)

    def _tick(self) -> None:
        self.execute(self.core.tick(now_ms()))

    def _expire_offsets(self) -> None:
        """Kafka's offsets.retention.check.interval.ms task: offsets (and groups left with
        none) past offsets.retention.minutes go, with their tombstones."""
        retention_ms = self.broker.config.int("offsets.retention.minutes") * 60_000
        self.execute(self.core.expire_offsets(now_ms(), retention_ms))

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
        p = self.broker.topics.partition(CONSUMER_OFFSETS, index) if index is not None \
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
            # The one append path's local half; commits then wait for the ISR (replicated).
            _replica, result = self.runtime.append_now(
                index, data, verification=verification,
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
        member_id, response, effects = self.core.join(group_id, member_id, *args, **kw)
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
        response, effects = self.core.sync(group_id, generation, member_id, group_instance_id,
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
        error = self.core.validate_commit(group_id, generation, member_id, group_instance_id,
                                          transactional=False)
        if error:
            return error
        error = self.append(self.core.commit_records(group_id, offsets))
        if error:
            return ErrorCode.not_coordinator if error == ErrorCode.not_coordinator \
                else ErrorCode.coordinator_not_available
        error = await self.replicated(group_id)
        if error:
            return error
        self.core.apply_offsets(group_id, offsets)
        return None

    async def txn_commit(self, group_id: str, producer_id: int, producer_epoch: int,
                   generation: int, member_id: str, group_instance_id: str | None,
                   offsets: dict[TP, OffsetValue], *, verification=None,
                   require_verification: bool = False) -> ErrorCode | None:
        error = self.core.validate_commit(group_id, generation, member_id, group_instance_id,
                                          transactional=True)
        if error:
            return error
        error = self.append(self.core.commit_records(group_id, offsets),
                            producer=(producer_id, producer_epoch), verification=verification,
                            require_verification=require_verification)
        if error:
            return error if error in (ErrorCode.invalid_producer_epoch, ErrorCode.invalid_txn_state,
                                      ErrorCode.not_coordinator) \
                else ErrorCode.coordinator_not_available
        self.core.add_pending_txn_offsets(group_id, producer_id, offsets)
        return await self.replicated(group_id)

    def complete_txn_offsets(self, partition_index: int, producer_id: int, commit: bool) -> None:
        """The transaction's marker is on this ``__consumer_offsets`` partition."""
        n = self.runtime.partition_count() or 1
        groups = [g for g in self.core.groups if coordinator_partition(g, n) == partition_index]
        self.core.complete_txn_offsets(groups, producer_id, commit)

    # -- metrics ------------------------------------------------------------------------------

    def metric_samples(self):
        from .metrics import Sample

        yield Sample("oncelog_groups", "consumer groups the group coordinator holds",
                     len(self.core.groups))
        from .group_lag import lag_samples

        yield from lag_samples(self.broker)
