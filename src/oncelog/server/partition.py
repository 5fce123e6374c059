"""Kafka's ``Partition``: one partition this broker hosts as a replica, in its role (leader or
follower) at the partition's leader epoch.

As leader it keeps each follower's progress (its log end offset from its fetches, when it last
caught up, its log start offset), the ISR and its changes (a follower not caught up for
``replica.lag.time.max.ms`` is removed, one that reached the high watermark added, written
through the metadata on the condition of the state's version: Kafka's AlterPartition), the high
watermark (the smallest log end offset of the ISR; while an ISR change is being written its new
members count too, Kafka's "maximal ISR") and the requests waiting for it: acks=all appends
until the high watermark passes their records, DeleteRecords until every live replica's log
start passed its offset. As follower it only says that its log must first be truncated where it
diverges from the leader's (server/replica_fetcher.py does the fetching).

The replica manager (server/replication.py) keeps the map of partitions, hands them their
leadership from the cluster view, and appends through them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from .clock import now_ms
from .topics import Partition as LocalPartition

log = logging.getLogger("oncelog.replication")

TP = tuple[str, int]


def broker_ids(ids) -> str:
    """A list of broker ids as Kafka's logs print one: ``[1,2,3]`` (not a Python tuple)."""
    return "[" + ",".join(str(i) for i in ids) + "]"


class ReplicationError(Exception):
    def __init__(self, error_name: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_name = error_name


@dataclass
class FollowerProgress:
    """The leader's view of one follower (Kafka's Replica state)."""

    leo: int = -1  # unknown until its first fetch at this leader epoch
    last_fetch_ms: int = 0
    leader_leo_at_last_fetch: int = 0
    last_caught_up_ms: int = 0
    log_start_offset: int = -1  # as its last fetch said (DeleteRecords' low watermark)


# The metadata's conditional write of a partition's state (Kafka's AlterPartition): the new
# state's version, or None when the condition failed.
AlterPartition = Callable[[str, int, Any, int], Awaitable[int | None]]


class Partition:
    def __init__(self, local: LocalPartition, replicas: tuple[int, ...], node_id: int, *,
                 alter_partition: AlterPartition,
                 spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self.partition = local  # the hosted partition: its log and its long polls
        self.log = local.log  # a partition keeps its log; read on every append
        self.replicas = replicas
        self.node_id = node_id
        self._alter_partition = alter_partition
        self._spawn = spawn
        self.leader = -1
        self.leader_epoch = -1
        self.isr: tuple[int, ...] = ()
        self.controller_epoch = 0
        self.zk_version = -1
        self.is_leader = False
        self.followers: dict[int, FollowerProgress] = {}
        self.waiters: list[tuple[int, asyncio.Future]] = []  # acks=all: (end offset, future)
        # DeleteRecords waiting for every live replica's log start to reach an offset.
        self.start_waiters: list[tuple[int, asyncio.Future]] = []
        self.needs_truncation = False  # follower: ask the leader where our logs diverge first
        self.isr_change_in_flight = False
        # The ISR being written to ZooKeeper. Until the write is confirmed the high watermark
        # counts its members too (Kafka's "maximal ISR"): once written, the controller may
        # elect a replica just added, which must then hold everything acknowledged.
        self.pending_isr: tuple[int, ...] = ()

    @property
    def tp(self) -> TP:
        return (self.partition.topic, self.partition.index)

    # -- leadership ---------------------------------------------------------------------------

    def make_leader(self, state, version: int, now: int) -> None:
        self.is_leader = True
        self.leader, self.leader_epoch = state.leader, state.leader_epoch
        self.isr, self.zk_version, self.controller_epoch = tuple(state.isr), version, \
            state.controller_epoch
        self.needs_truncation = False
        self.followers = {f: FollowerProgress(last_caught_up_ms=now)
                          for f in self.replicas if f != self.node_id}
        # Kafka's makeLeader: the new epoch starts at our log end, so OffsetForLeaderEpoch
        # answers followers of the old epoch correctly before anything is appended.
        self.log.leader_epoch_cache.assign(state.leader_epoch, self.log.log_end_offset)
        self.maybe_advance_hw()

    def make_follower(self, state) -> None:
        self.is_leader = False
        self.leader, self.leader_epoch = state.leader, state.leader_epoch
        self.followers = {}
        self.needs_truncation = True
        self.fail_waiters(ErrorCode.not_leader_or_follower)

    def update_state(self, state, version: int) -> None:
        """A new view at the same leader epoch: its ISR (and the state's version)."""
        self.isr, self.zk_version = tuple(state.isr), version
        self.controller_epoch = state.controller_epoch
        if self.is_leader:
            self.maybe_advance_hw()

    # -- the leader's appends and their waiters -----------------------------------------------

    def check_enough_replicas(self) -> None:
        """acks=all: refuse before appending when the ISR is below min.insync.replicas."""
        need = self.log.config.min_insync_replicas
        if len(self.isr) < need:
            raise ReplicationError(ErrorCode.not_enough_replicas,
                                   f"{len(self.isr)} in-sync replicas of {self.partition.topic}-"
                                   f"{self.partition.index}, min.insync.replicas is {need}")

    def isr_error(self) -> ErrorCode | None:
        """After an acks=all write reached the high watermark: the ISR may have shrunk below
        min.insync.replicas meanwhile (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""
        if len(self.isr) < self.log.config.min_insync_replicas:
            return ErrorCode.not_enough_replicas_after_append
        return None

    def appended(self) -> None:
        """The leader appended: followers' long polls wake up (they read to the log end);
        consumers' when the high watermark moved (at once with a lone ISR)."""
        self.maybe_advance_hw()
        self.partition.notify_log_end()

    def add_waiter(self, end_offset: int) -> asyncio.Future:
        """acks=all: a future answered (None, or the error) once the high watermark reaches
        ``end_offset``, or leadership is lost."""
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append((end_offset, fut))
        return fut

    def remove_waiter(self, fut: asyncio.Future) -> None:
        self.waiters = [(o, f) for o, f in self.waiters if f is not fut]

    async def wait_replicated(self, end_offset: int, timeout_ms: int) -> ErrorCode | None:
        """acks=all: wait until the high watermark reaches ``end_offset`` (the offset after
        the batch); None, or the error to answer with."""
        if self.log.high_watermark < end_offset:
            fut = self.add_waiter(end_offset)
            try:
                err = await asyncio.wait_for(fut, max(timeout_ms, 0) / 1000)
            except TimeoutError:
                return ErrorCode.request_timed_out
            finally:
                self.remove_waiter(fut)
            if err is not None:
                return err
        return self.isr_error()

    def fail_waiters(self, error: ErrorCode) -> None:
        for _offset, fut in self.waiters + self.start_waiters:
            if not fut.done():
                fut.set_result(error)
        self.waiters, self.start_waiters = [], []

    def maybe_advance_hw(self) -> bool:
        """Move the high watermark to what every ISR member has; True if it moved (and
        long polls were woken)."""
        if not self.is_leader:
            return False
        plog = self.log
        new_hw = plog.log_end_offset
        for f in (*self.isr, *self.pending_isr) if self.pending_isr else self.isr:
            if f != self.node_id:
                progress = self.followers.get(f)
                new_hw = min(new_hw, progress.leo if progress is not None else -1)
        if new_hw <= plog.high_watermark:
            return False
        plog.update_high_watermark(new_hw)
        self.partition.notify_high_watermark()  # consumers long-polling for it
        if self.waiters:
            hw = plog.high_watermark
            still = []
            for offset, fut in self.waiters:
                if offset <= hw:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    still.append((offset, fut))
            self.waiters = still
        return True

    # -- followers' fetches and the ISR -------------------------------------------------------

    def update_follower_fetch_state(self, replica_id: int, fetch_offset: int,
                                    log_start_offset: int, live: Collection[int]) -> None:
        """A follower's fetch: its log end offset is ``fetch_offset``, its log start
        ``log_start_offset`` (Kafka's updateFollowerFetchState). May expand the ISR, move the
        high watermark and the low watermark (of the replicas on ``live`` brokers)."""
        progress = self.followers.get(replica_id)
        if progress is None:
            return
        if log_start_offset != progress.log_start_offset:
            progress.log_start_offset = log_start_offset
            self.maybe_complete_delete_records(live)
        now = now_ms()
        leo = self.log.log_end_offset
        if fetch_offset >= leo:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, now)
        elif fetch_offset >= progress.leader_leo_at_last_fetch:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms,
                                             progress.last_fetch_ms)
        progress.leo = fetch_offset
        progress.last_fetch_ms = now
        progress.leader_leo_at_last_fetch = leo
        if replica_id not in self.isr and self._caught_up_for_isr(fetch_offset):
            self.change_isr(tuple(x for x in self.replicas
                                  if x in self.isr or x == replica_id))
        self.maybe_advance_hw()

    def _caught_up_for_isr(self, fetch_offset: int) -> bool:
        # Kafka: at the high watermark, and past the start of the current leader epoch (so the
        # follower has truncated to this leader's log).
        start = self.log.leader_epoch_cache.start_offset_of(self.leader_epoch)
        return fetch_offset >= self.log.high_watermark and (start is None
                                                            or fetch_offset >= start)

    def maybe_shrink_isr(self, now: int, lag_ms: int) -> None:
        """Remove the followers not caught up for ``lag_ms`` from the ISR."""
        if not self.is_leader or self.isr_change_in_flight:
            return
        lagging = {f for f in self.isr if f != self.node_id
                   and (p := self.followers.get(f)) is not None
                   and now - p.last_caught_up_ms > lag_ms}
        if lagging:
            log.info("%s-%d: replicas %s out of sync (not caught up for %d ms)",
                     *self.tp, broker_ids(sorted(lagging)), lag_ms)
            self.change_isr(tuple(x for x in self.isr if x not in lagging))

    def change_isr(self, isr: tuple[int, ...]) -> None:
        """Write the new ISR through the metadata (Kafka's AlterPartition; the partition's
        state znode, on the condition of its version); it comes back as a new view."""
        if self.isr_change_in_flight or isr == self.isr or not isr:
            return
        self.isr_change_in_flight = True
        self.pending_isr = isr
        from ..cluster.model import LeaderAndIsr

        state = LeaderAndIsr(self.node_id, self.leader_epoch, isr, self.controller_epoch)
        topic, index = self.tp
        expected = self.zk_version

        async def write() -> None:
            try:
                version = await self._alter_partition(topic, index, state, expected)
            except Exception as exc:  # noqa: BLE001 - ZooKeeper away: next time, again
                log.warning("%s-%d: ISR change to %s failed: %s", topic, index,
                            broker_ids(isr), str(exc) or type(exc).__name__)
                version = None
            finally:
                self.isr_change_in_flight = False
                self.pending_isr = ()
            if version is None:
                return  # conflict: the controller or a newer view wins; the watch tells us
            if self.is_leader and self.leader_epoch == state.leader_epoch \
                    and self.zk_version == expected:
                log.info("%s-%d: ISR %s -> %s", topic, index, broker_ids(self.isr),
                         broker_ids(isr))
                self.isr, self.zk_version = isr, version
                self.maybe_advance_hw()

        self._spawn(write())

    # -- DeleteRecords (KIP-107) ---------------------------------------------------------------

    def low_watermark(self, live: Collection[int]) -> int:
        """Kafka's lowWatermarkIfLeader: the lowest log start offset of the replicas on
        ``live`` brokers (the leader's own included), as their fetches said."""
        low = self.log.log_start_offset
        for f, progress in self.followers.items():
            if f in live:
                low = min(low, progress.log_start_offset)
        return low

    def maybe_complete_delete_records(self, live: Collection[int]) -> None:
        if not self.start_waiters:
            return
        low = self.low_watermark(live)
        for offset, fut in self.start_waiters:
            if offset <= low and not fut.done():
                fut.set_result(None)

    async def wait_log_start(self, target: int, timeout_ms: int) -> ErrorCode | None:
        """DeleteRecords: wait until every live replica's log start reached ``target``;
        None, or the error."""
        fut = asyncio.get_running_loop().create_future()
        self.start_waiters.append((target, fut))
        try:
            return await asyncio.wait_for(fut, max(timeout_ms, 0) / 1000)
        except TimeoutError:
            return ErrorCode.request_timed_out
        finally:
            self.start_waiters = [(o, f) for o, f in self.start_waiters if f is not fut]
