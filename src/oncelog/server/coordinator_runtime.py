"""What the transaction and group coordinators share (Kafka's ``CoordinatorRuntime``).

A coordinator owns the keys (transactional ids, group ids) that hash to the partitions of its
internal topic that this broker leads. The runtime follows leadership news for that topic
(``LeadershipSource``): on becoming leader of a partition it creates the partition's *shard*
(``CoordinatorShard``: the coordinator's state for the keys of that partition) and loads it, on
losing it it cancels the partition's tasks and drops the shard. It finds the shard of a key and
runs the coordinator's timers. What the coordinators decide stays in their sans-IO cores
(txn/coordinator.py, group/coordinator.py), which are the shards; what they do with the
decisions stays in server/txn_service.py and server/group_service.py.

Both coordinators write in one shape (Kafka's ``CoordinatorResult``): a write operation runs on
the key's ACTIVE shard and returns the records to append, the response and what to do once the
write is done (``on_done``); ``schedule_write`` runs it in a task of the partition's, appends
its records through the ``PartitionWriter`` (origin COORDINATOR, acks=all: min.insync.replicas
is checked before the append), waits until the partition's ISR has them, runs ``on_done`` and
answers. The operation and the leader's append happen in one step of that task, so the records
are in the log in the order the shard decided; a caller that goes away (a client
disconnecting) does not leave the write half done. A failed write raises
``CoordinatorWriteError`` with the append's error; the service maps it to its own (Kafka's
coordinator services do, not its runtime). The shards change their state when the operation
runs, not when the write is replicated (Kafka keeps it in timeline structures it rolls back on
a failed write; ours do not: see docs/design.md).

Each shard has a state (Kafka's ``CoordinatorState``): LOADING while the partition is replayed
into it, ACTIVE once it is, FAILED when the replay raised, CLOSED once dropped. A key whose
shard is LOADING is answered COORDINATOR_LOAD_IN_PROGRESS (the client asks again), one whose
partition is not led here, or whose shard FAILED or is CLOSED, NOT_COORDINATOR.

Loading runs on the event loop in chunks of ``LOAD_CHUNK_BATCHES`` batches, yielding between
them, not in a worker thread: the log and the shard are only ever touched from the loop (no lock
between the replay and appends, retention or truncation), a thread would not replay faster under
the GIL, and an unload stops a load at its next chunk. The first chunk is replayed when the
leadership news comes, so a partition that small (a new one) is ACTIVE at once; a bigger one
goes on in a task of its own. The replay reads to the log end as it is when it finishes
(appends made meanwhile, e.g. transaction markers on ``__consumer_offsets``, are replayed too),
and the shard turns ACTIVE in the same turn of the loop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from kio.schema.errors import ErrorCode

from ..log import AppendResult
from ..log.producer_state import VerificationGuard
from ..records import build_batch
from ..records.batch import CONTROL_ABORT, CONTROL_COMMIT, BatchHeader, Record, parse_control_record
from .clock import now_ms
from .replication import AppendEntry, AppendError, AppendOrigin, ReplicaManager
from .topics import TopicError, coordinator_partition

log = logging.getLogger("oncelog.coordinator")

APPEND_TIMEOUT_MS = 30_000
# Batches replayed between two yields to the event loop while a shard loads.
LOAD_CHUNK_BATCHES = 64

NOT_COORDINATOR = ErrorCode.not_coordinator
COORDINATOR_LOAD_IN_PROGRESS = ErrorCode.coordinator_load_in_progress


# -- ports --------------------------------------------------------------------------------------

class CoordinatorShard(Protocol):
    """The coordinator's state for the keys of one partition of its internal topic (Kafka's
    ``CoordinatorShard``), rebuilt by replaying the partition."""

    def replay(self, offset: int, producer_id: int | None, record: Record) -> None:
        """One record of the partition, in log order (``producer_id`` when it came in a
        transactional batch)."""

    def replay_end_transaction(self, producer_id: int, committed: bool) -> None:
        """The producer's transaction ended on this partition (a marker)."""


S = TypeVar("S", bound=CoordinatorShard)
R = TypeVar("R")  # a coordinator's record, which its serializer turns into (key, value)
T = TypeVar("T")  # a write's response

Serializer = Callable[[R], tuple[bytes, bytes | None]]


@dataclass
class CoordinatorResult(Generic[R, T]):
    """Kafka's ``CoordinatorResult``: what a write operation decided on its shard. ``records``
    go to the shard's partition (one batch); ``response`` is answered once the ISR has them.
    ``on_appended()`` runs once the leader's log has them (a change that follows the log: the
    log's replay would make it too), ``on_done(error)`` once the ISR has them (error None) or
    the write failed (its error), before the answer; neither when the shard was dropped
    meanwhile."""

    response: T
    records: Sequence[R] = ()
    on_appended: Callable[[], None] | None = None
    on_done: Callable[[ErrorCode | None], None] | None = None


class CoordinatorWriteError(Exception):
    """A write that could not be done: the key's shard is not ACTIVE here
    (COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR), or its records were refused or not
    replicated (the append's error, e.g. NOT_ENOUGH_REPLICAS, NOT_LEADER_OR_FOLLOWER,
    REQUEST_TIMED_OUT)."""

    def __init__(self, error: ErrorCode, message: str = "") -> None:
        super().__init__(message or error.name)
        self.error = error

LeadershipListener = Callable[[str, int, bool, int], None]


class LeadershipSource(Protocol):
    """Who tells the runtime this broker's role for every partition: (topic, index,
    is_leader, leader epoch) on each change (the replica manager)."""

    listeners: list[LeadershipListener]


class ReplayableLog(Protocol):
    def iter_records(self) -> Iterator[tuple[BatchHeader, Sequence[Record]]]:
        """(header, records) of every batch to the log end, control batches included; the
        end as it is when the iteration gets there."""
        ...


class ReplayablePartition(Protocol):
    @property
    def log(self) -> ReplayableLog: ...


class PartitionLookup(Protocol):
    def partition(self, topic: str, index: int) -> ReplayablePartition | None:
        """The partition when this broker hosts it."""
        ...


class InternalTopicMetadata(Protocol):
    """The internal topic's partition count, and its creation on first use."""

    def internal_partition_count(self, name: str) -> int | None: ...

    def request_internal_topic(self, name: str) -> ErrorCode | None: ...


class PartitionWriter(Protocol):
    """The one port both coordinators append through (Kafka's coordinator PartitionWriter):
    their records on a partition of their topic, origin COORDINATOR, acks=all."""

    def append_unreplicated(self, index: int, records: bytearray, *,
                            verification_guard: VerificationGuard | None = None,
                            require_verification: bool = False) -> AppendResult:
        """The append's leader half, in this turn of the event loop (min.insync.replicas
        checked first); ``replicated`` waits for the rest. Raises AppendError."""
        ...

    async def replicated(self, index: int, end_offset: int) -> ErrorCode | None:
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

    def append_unreplicated(self, index: int, records: bytearray, *,
                            verification_guard: VerificationGuard | None = None,
                            require_verification: bool = False) -> AppendResult:
        entry = AppendEntry(records, verification=verification_guard,
                            require_verification=require_verification)
        return self.replication.append_to_leader((self.topic, index), entry,
                                                 origin=AppendOrigin.COORDINATOR,
                                                 required_acks=-1)

    async def replicated(self, index: int, end_offset: int) -> ErrorCode | None:
        return await self.replication.replicated((self.topic, index), end_offset,
                                                 self.timeout_ms)


# -- the runtime --------------------------------------------------------------------------------

class ShardState(enum.Enum):
    """Kafka's ``CoordinatorState``."""

    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"
    CLOSED = "closed"


@dataclass
class ShardContext(Generic[S]):
    """One partition of the internal topic this broker leads (or led): its shard and state."""

    index: int
    epoch: int
    shard: S
    state: ShardState = ShardState.LOADING
    tasks: set[asyncio.Task] = field(default_factory=set)
    error: BaseException | None = None


class CoordinatorRuntime(Generic[S, R]):
    def __init__(self, topic: str, *, writer: PartitionWriter, leadership: LeadershipSource,
                 partitions: PartitionLookup, metadata: InternalTopicMetadata,
                 new_shard: Callable[[int, int], S], serializer: Serializer[R],
                 on_loaded: Callable[[int, S], None] | None = None,
                 on_unloaded: Callable[[int, S], None] | None = None) -> None:
        """``new_shard(index, leader epoch)`` makes an empty shard for a partition;
        ``serializer`` turns the coordinator's records into (key, value) for the log;
        ``on_loaded`` runs when its replay is done (the shard is ACTIVE), ``on_unloaded``
        when a shard is dropped, whatever its state (leadership lost or moved)."""
        self.topic = topic
        self.writer = writer
        self._serializer = serializer
        self._partitions = partitions
        self._metadata = metadata
        self._new_shard = new_shard
        self._on_loaded = on_loaded
        self._on_unloaded = on_unloaded
        self._contexts: dict[int, ShardContext[S]] = {}
        self._orphans: set[asyncio.Task] = set()  # tasks of no partition: cancelled at close
        self._timers: list[asyncio.Task] = []
        leadership.listeners.append(self.on_leadership)

    # -- leadership ---------------------------------------------------------------------------

    def on_leadership(self, topic: str, index: int, is_leader: bool, epoch: int) -> None:
        if topic != self.topic:
            return
        self.unload(index)
        if not is_leader:
            return
        partition = self._partitions.partition(topic, index)
        if partition is None:
            return
        ctx = ShardContext(index, epoch, self._new_shard(index, epoch))
        self._contexts[index] = ctx
        batches = iter(partition.log.iter_records())
        # The first chunk here and now: a partition that small (a new one) is ACTIVE at once,
        # a bigger one goes on loading in a task of its own.
        if self._replay_chunk(ctx, batches):
            self.spawn(index, self._load(ctx, batches))

    def _replay_chunk(self, ctx: ShardContext[S],
                      batches: Iterator[tuple[BatchHeader, Sequence[Record]]]) -> bool:
        """Replay up to ``LOAD_CHUNK_BATCHES`` batches: True when there are more, False when
        the shard is loaded (ACTIVE) or failed (FAILED)."""
        try:
            for _ in range(LOAD_CHUNK_BATCHES):
                found = next(batches, None)
                if found is None:
                    self._activate(ctx)
                    return False
                self._replay(ctx.shard, *found)
        except Exception as exc:  # noqa: BLE001 - a bad partition fails its shard alone
            self._failed(ctx, exc)
            return False
        return True

    def unload(self, index: int) -> None:
        """Drop the partition's shard: its tasks (its load too) are cancelled, its state
        CLOSED."""
        ctx = self._contexts.pop(index, None)
        if ctx is None:
            return
        ctx.state = ShardState.CLOSED
        for task in list(ctx.tasks):
            task.cancel()
        if self._on_unloaded is not None:
            self._on_unloaded(index, ctx.shard)

    async def _load(self, ctx: ShardContext[S],
                    batches: Iterator[tuple[BatchHeader, Sequence[Record]]]) -> None:
        while ctx.state is ShardState.LOADING:
            await asyncio.sleep(0)  # the broker keeps answering meanwhile
            if ctx.state is not ShardState.LOADING or not self._replay_chunk(ctx, batches):
                return

    def _failed(self, ctx: ShardContext[S], exc: Exception) -> None:
        log.error("%s-%d cannot be loaded: %r", self.topic, ctx.index, exc, exc_info=exc)
        ctx.state, ctx.error = ShardState.FAILED, exc

    def _activate(self, ctx: ShardContext[S]) -> None:
        if ctx.state is not ShardState.LOADING or self._contexts.get(ctx.index) is not ctx:
            return
        ctx.state = ShardState.ACTIVE
        if self._on_loaded is not None:
            self._on_loaded(ctx.index, ctx.shard)

    @staticmethod
    def _replay(shard: S, header: BatchHeader, records: Sequence[Record]) -> None:
        if header.is_control:
            if not records:
                return  # a marker the log cleaner emptied: its transaction is long done
            ctype, _epoch = parse_control_record(records[0])
            if ctype in (CONTROL_COMMIT, CONTROL_ABORT):
                shard.replay_end_transaction(header.producer_id, ctype == CONTROL_COMMIT)
            return
        pid = header.producer_id if header.is_transactional else None
        for r in records:
            shard.replay(r.offset, pid, r)

    # -- shards -------------------------------------------------------------------------------

    def state(self, index: int) -> ShardState | None:
        """The partition's shard state; None when this broker does not lead it."""
        ctx = self._contexts.get(index)
        return None if ctx is None else ctx.state

    @property
    def shards(self) -> dict[int, S]:
        """The ACTIVE shards, by partition."""
        return {i: c.shard for i, c in self._contexts.items() if c.state is ShardState.ACTIVE}

    def active(self, index: int) -> S | None:
        ctx = self._contexts.get(index)
        return ctx.shard if ctx is not None and ctx.state is ShardState.ACTIVE else None

    def loading(self) -> bool:
        """Some partition led here is still being loaded."""
        return any(c.state is ShardState.LOADING for c in self._contexts.values())

    def loading_note(self) -> str:
        """", 3 partitions loading" (for the summary line of partitions taken up), or ""."""
        n = sum(c.state is ShardState.LOADING for c in self._contexts.values())
        return f", {n} partition{'s' if n != 1 else ''} loading" if n else ""

    # -- keys ---------------------------------------------------------------------------------

    def partition_count(self, *, create: bool = False) -> int | None:
        """The internal topic's partition count; None until it exists (``create``: its
        creation is asked for, as the first FindCoordinator does in Kafka)."""
        metadata = self._metadata
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

    def shard_for(self, key: str) -> tuple[S | None, ErrorCode | None]:
        """(shard, None) for a key whose shard is ACTIVE here, else (None, the error to answer
        with): COORDINATOR_LOAD_IN_PROGRESS while it loads, NOT_COORDINATOR when this broker
        does not lead the key's partition (or its shard failed or closed)."""
        index = self.partition_of(key, create=True)
        ctx = self._contexts.get(index) if index is not None else None
        if ctx is None:
            return None, NOT_COORDINATOR
        if ctx.state is ShardState.ACTIVE:
            return ctx.shard, None
        if ctx.state is ShardState.LOADING:
            return None, COORDINATOR_LOAD_IN_PROGRESS
        return None, NOT_COORDINATOR

    # -- writes -------------------------------------------------------------------------------

    async def schedule_write(self, index: int | None, name: str,
                             op: Callable[[S], CoordinatorResult[R, T]], *,
                             producer: tuple[int, int] | None = None,
                             verification_guard: VerificationGuard | None = None,
                             require_verification: bool = False) -> T:
        """Kafka's scheduleWriteOperation (scheduleTransactionalWriteOperation with
        ``producer``: the records go as that producer's transactional batch, its epoch checked
        by the log, KIP-890's ``verification_guard`` with it): ``op`` on the partition's ACTIVE
        shard, its records appended and replicated, ``on_done``, then its response. The write
        runs in a task of the partition's (writes run in the order they were scheduled); a
        caller that goes away does not stop it. Raises CoordinatorWriteError."""
        task = self._spawn_write(index, name, op, producer, verification_guard,
                                 require_verification)
        try:
            done = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the shard was dropped before the write was done
                raise CoordinatorWriteError(NOT_COORDINATOR,
                                            f"{self.topic}-{index} is no longer led here"
                                            ) from None
            raise
        if isinstance(done, ErrorCode):
            raise CoordinatorWriteError(done)
        return done.response

    def write_in_background(self, index: int, name: str,
                            op: Callable[[S], CoordinatorResult[R, Any]]) -> None:
        """A write nobody answers (a timer's, a follow-up's); its failure is logged (and told
        to ``on_done``)."""
        try:
            self._spawn_write(index, name, op, None, None, False)
        except CoordinatorWriteError as exc:
            log.debug("%s on %s-%d: %s", name, self.topic, index, exc)

    def _spawn_write(self, index: int | None, name: str,
                     op: Callable[[S], CoordinatorResult[R, T]],
                     producer: tuple[int, int] | None,
                     verification_guard: VerificationGuard | None, require_verification: bool
                     ) -> asyncio.Task[CoordinatorResult[R, T] | ErrorCode]:
        ctx = self._contexts.get(index) if index is not None else None
        if ctx is None or ctx.state is not ShardState.ACTIVE:
            raise CoordinatorWriteError(
                COORDINATOR_LOAD_IN_PROGRESS if ctx is not None
                and ctx.state is ShardState.LOADING else NOT_COORDINATOR)
        return self.spawn(ctx.index, self._write(ctx, name, op, producer, verification_guard,
                                                 require_verification))

    async def _write(self, ctx: ShardContext[S], name: str,
                     op: Callable[[S], CoordinatorResult[R, T]],
                     producer: tuple[int, int] | None,
                     verification_guard: VerificationGuard | None, require_verification: bool
                     ) -> CoordinatorResult[R, T] | ErrorCode:
        """One write: its result, or the error that stopped it. The operation and the
        leader's append happen in one step, so the log has the records in the order the shard
        decided them."""
        if ctx.state is not ShardState.ACTIVE:
            return NOT_COORDINATOR
        result = op(ctx.shard)
        error: ErrorCode | None = None
        if result.records:
            now = now_ms()
            records = [(*self._serializer(r), (), now) for r in result.records]
            if producer is None:
                data = bytearray(build_batch(records))
            else:
                data = bytearray(build_batch(records, producer_id=producer[0],
                                             producer_epoch=producer[1],
                                             is_transactional=True))
            try:
                appended = self.writer.append_unreplicated(
                    ctx.index, data, verification_guard=verification_guard,
                    require_verification=require_verification)
            except AppendError as exc:
                error = exc.error_name
            else:
                if result.on_appended is not None:
                    result.on_appended()
                # (an ISR of one has it already: no turn of the loop in between)
                error = await self.writer.replicated(ctx.index, appended.last_offset + 1)
            if error is not None:
                level = logging.ERROR if error == ErrorCode.kafka_storage_error \
                    else logging.DEBUG
                log.log(level, "%s on %s-%d failed: %s", name, self.topic, ctx.index,
                        error.name)
        if result.on_done is not None:
            result.on_done(error)
        return result if error is None else error

    # -- tasks and timers ---------------------------------------------------------------------

    def spawn(self, index: int | None, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """A task of the partition's coordinator: cancelled when this broker stops leading it
        (``index`` None, or a partition not led here: cancelled only at close)."""
        task = asyncio.get_running_loop().create_task(coro)
        ctx = self._contexts.get(index) if index is not None else None
        mine = ctx.tasks if ctx is not None else self._orphans
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
        for index in list(self._contexts):
            ctx = self._contexts[index]
            ctx.state = ShardState.CLOSED
            for t in list(ctx.tasks):
                t.cancel()
        for t in list(self._orphans):
            t.cancel()


__all__ = ["AppendError", "CoordinatorResult", "CoordinatorRuntime", "CoordinatorShard",
           "CoordinatorWriteError", "PartitionWriter", "ReplicaPartitionWriter", "ShardState"]
