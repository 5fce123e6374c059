"""What the transaction and group coordinators share (Kafka's ``CoordinatorRuntime``).

A coordinator owns the keys (transactional ids, group ids) that hash to the partitions of its
internal topic that this broker leads. The runtime follows the replica manager's leadership news
for that topic: on becoming leader of a partition it loads it (the coordinator replays the
partition into a *shard* of its state), on losing it it cancels the partition's tasks and
unloads the shard. It finds the shard of a key and runs the coordinator's timers. Both
coordinators append through its ``writer``, a ``PartitionWriter`` (the replica manager's one
append path, origin COORDINATOR, acks=all). What the coordinators decide stays
in their sans-IO cores (txn/coordinator.py, group/coordinator.py); what they do with the
decisions stays in server/txn_service.py and server/group_service.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from ..log import AppendResult
from ..log.producer_state import VerificationGuard
from .replication import AppendEntry, AppendError, AppendOrigin, ReplicaManager
from .topics import Partition, TopicError, coordinator_partition

log = logging.getLogger("oncelog.coordinator")

APPEND_TIMEOUT_MS = 30_000


class PartitionWriter(Protocol):
    """The one port both coordinators append through (Kafka's coordinator PartitionWriter):
    their records on a partition of their topic, origin COORDINATOR, acks=all (min.insync.replicas
    checked first). Raises AppendError."""

    async def append(self, index: int, records: bytearray, *,
                     verification_guard: VerificationGuard | None = None,
                     require_verification: bool = False) -> AppendResult:
        """Append, and wait until the partition's ISR has the records."""
        ...

    def append_unreplicated(self, index: int, records: bytearray, *,
                            verification_guard: VerificationGuard | None = None,
                            require_verification: bool = False) -> AppendResult:
        """The same append's leader half only, in this turn of the event loop (the group
        coordinator answers a rebalance from what it wrote); ``replicated`` waits for the
        rest."""
        ...

    async def replicated(self, index: int, end_offset: int) -> str | None:
        """Wait until the partition's ISR has everything below ``end_offset``: None, or the
        error that stopped it."""
        ...


class ReplicaPartitionWriter:
    """``PartitionWriter`` on the replica manager's ``append_records``."""

    def __init__(self, replication: ReplicaManager, topic: str,
                 timeout_ms: int = APPEND_TIMEOUT_MS) -> None:
        self.replication = replication
        self.topic = topic
        self.timeout_ms = timeout_ms

    async def append(self, index: int, records: bytearray, *,
                     verification_guard: VerificationGuard | None = None,
                     require_verification: bool = False) -> AppendResult:
        tp = (self.topic, index)
        entry = AppendEntry(records, verification=verification_guard,
                            require_verification=require_verification)
        result = (await self.replication.append_records(
            {tp: entry}, origin=AppendOrigin.COORDINATOR, required_acks=-1,
            timeout_ms=self.timeout_ms))[tp]
        if isinstance(result, AppendError):
            raise result
        return result

    def append_unreplicated(self, index: int, records: bytearray, *,
                            verification_guard: VerificationGuard | None = None,
                            require_verification: bool = False) -> AppendResult:
        entry = AppendEntry(records, verification=verification_guard,
                            require_verification=require_verification)
        return self.replication.append_to_leader((self.topic, index), entry,
                                                 origin=AppendOrigin.COORDINATOR,
                                                 required_acks=-1)

    async def replicated(self, index: int, end_offset: int) -> str | None:
        return await self.replication.replicated((self.topic, index), end_offset,
                                                 self.timeout_ms)


class CoordinatorRuntime:
    def __init__(self, broker, topic: str, *,
                 load: Callable[[int, Partition, int], Any],
                 unload: Callable[[int, Any], None],
                 writer: PartitionWriter | None = None) -> None:
        self.broker = broker
        self.topic = topic
        self.writer: PartitionWriter = writer if writer is not None \
            else ReplicaPartitionWriter(broker.replication, topic)
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


__all__ = ["AppendError", "CoordinatorRuntime", "PartitionWriter", "ReplicaPartitionWriter"]
