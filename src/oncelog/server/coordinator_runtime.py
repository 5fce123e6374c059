"""What the transaction and group coordinators share (Kafka's ``CoordinatorRuntime``).

A coordinator owns the keys (transactional ids, group ids) that hash to the partitions of its
internal topic that this broker leads. The runtime follows the replica manager's leadership news
for that topic: on becoming leader of a partition it loads it (the coordinator replays the
partition into a *shard* of its state), on losing it it cancels the partition's tasks and
unloads the shard. It finds the shard of a key, appends to a partition through the replica
manager's one append path, and runs the coordinator's timers. What the coordinators decide stays
in their sans-IO cores (txn/coordinator.py, group/coordinator.py); what they do with the
decisions stays in server/txn_service.py and server/group_service.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from kio.schema.errors import ErrorCode

from ..records import split_batches
from .clock import now_ms
from .replication import AppendError
from .topics import Partition, TopicError, coordinator_partition

log = logging.getLogger("oncelog.coordinator")

APPEND_TIMEOUT_MS = 30_000


class CoordinatorRuntime:
    def __init__(self, broker, topic: str, *,
                 load: Callable[[int, Partition, int], Any],
                 unload: Callable[[int, Any], None]) -> None:
        self.broker = broker
        self.topic = topic
        self._load = load
        self._unload = unload
        # Partition index -> what the coordinator loaded from it (its shard).
        self.shards: dict[int, Any] = {}
        self._tasks: dict[int, set[asyncio.Task]] = {}
        self._timers: list[asyncio.Task] = []
        broker.replication.listeners.append(self.on_leadership)

    # -- leadership ---------------------------------------------------------------------------

    def on_leadership(self, topic: str, index: int, is_leader: bool, epoch: int) -> None:
        if topic != self.topic:
            return
        for task in self._tasks.pop(index, set()):
            task.cancel()
        old = self.shards.pop(index, None)
        if old is not None:
            self._unload(index, old)
        if not is_leader:
            return
        partition = self.broker.topics.partition(topic, index)
        if partition is not None:
            self.shards[index] = self._load(index, partition, epoch)

    # -- keys ---------------------------------------------------------------------------------

    def partition_count(self, *, create: bool = False) -> int | None:
        """The internal topic's partition count; None until it exists (``create``: its
        creation is asked for, as the first FindCoordinator does in Kafka)."""
        metadata = self.broker.metadata
        n = metadata.internal_partition_count(self.topic)
        if n is None and create:
            try:
                metadata.request_internal_topic(self.topic)
            except TopicError as exc:  # e.g. a full disk: COORDINATOR_NOT_AVAILABLE for now
                log.error("%s cannot be created: %s", self.topic, exc)
                return None
            n = metadata.internal_partition_count(self.topic)
        return n

    def partition_of(self, key: str, *, create: bool = False) -> int | None:
        """The key's partition (Kafka's abs(hash) % partition count), None before the topic
        exists."""
        n = self.partition_count(create=create)
        return None if n is None else coordinator_partition(key, n)

    def shard_for(self, key: str) -> tuple[Any, int | None]:
        """(shard, partition index) of the key; shard None when this broker does not lead
        the key's partition (NOT_COORDINATOR)."""
        index = self.partition_of(key, create=True)
        if index is None:
            return None, None
        return self.shards.get(index), index

    # -- appends ------------------------------------------------------------------------------

    async def append(self, index: int, data: bytearray, *, verification=None,
                     require_verification: bool = False) -> Any:
        """Append a batch to the partition through the one append path with acks=all (Kafka's
        coordinators write with acks=-1): the AppendResult; raises AppendError."""
        now = now_ms()

        def write(plog, leader_epoch: int):
            return plog.append(data, split_batches(data), now, verification=verification,
                               require_verification=require_verification,
                               leader_epoch=leader_epoch)

        return await self.broker.replication.append(self.topic, index, write, required_acks=-1,
                                                    timeout_ms=APPEND_TIMEOUT_MS)

    def append_now(self, index: int, data: bytearray, *, verification=None,
                   require_verification: bool = False) -> tuple[Any, Any]:
        """The append's first half only, in this turn of the event loop (the group
        coordinator answers a rebalance from what it wrote): (replica, AppendResult); the
        caller may wait for the ISR with ``replicated``. Raises AppendError."""
        now = now_ms()

        def write(plog, leader_epoch: int):
            return plog.append(data, split_batches(data), now, verification=verification,
                               require_verification=require_verification,
                               leader_epoch=leader_epoch)

        return self.broker.replication.append_local(self.topic, index, write, required_acks=1)

    async def replicated(self, index: int, end_offset: int) -> ErrorCode | None:
        """Wait until the partition's ISR has everything below ``end_offset``: None, or the
        error that stopped it."""
        replication = self.broker.replication
        try:
            r = replication.leader_replica(self.topic, index)
        except Exception as exc:  # noqa: BLE001 - ReplicationError: leadership moved
            return getattr(exc, "error_name", ErrorCode.not_leader_or_follower)
        return await replication.wait_replicated(r, end_offset, APPEND_TIMEOUT_MS)

    # -- tasks and timers ---------------------------------------------------------------------

    def spawn(self, index: int | None, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """A task of the partition's coordinator: cancelled when this broker stops leading it
        (``index`` None: cancelled only at close)."""
        task = asyncio.get_running_loop().create_task(coro)
        mine = self._tasks.setdefault(-1 if index is None else index, set())
        mine.add(task)
        task.add_done_callback(mine.discard)
        return task

    def every(self, interval_s: float, tick: Callable[[], Awaitable[None] | None]) -> None:
        async def run() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    result = tick()
                    if result is not None:
                        await result
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s coordinator timer failed", self.topic)

        self._timers.append(asyncio.get_running_loop().create_task(run()))

    def close(self) -> None:
        for t in self._timers:
            t.cancel()
        for tasks in self._tasks.values():
            for t in tasks:
                t.cancel()


__all__ = ["AppendError", "CoordinatorRuntime"]
