"""The coordinator runtime (server/coordinator_runtime.py) against in-memory doubles: a fake
partition writer, a leadership source the test drives, the internal topic's metadata, and
partitions whose logs are real record batches in memory. No broker, no sockets.

A shard is created and loaded when its partition's leadership comes (LOADING, then ACTIVE), a
key of a LOADING shard is answered COORDINATOR_LOAD_IN_PROGRESS, an unload cancels the
partition's tasks and drops exactly its shard, and a replay that raises leaves the shard FAILED
(NOT_COORDINATOR). The group coordinator's cores are such shards, one per partition."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.group.coordinator import GroupCoordinator
from oncelog.group.log_format import OffsetKey, OffsetValue, encode_key, encode_offset
from oncelog.log import AppendResult
from oncelog.protocol import ApiKey, RequestHeader, make, request_module
from oncelog.records.batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    BatchHeader,
    Record,
    build_batch,
    build_control_batch,
    decode_batch,
    iter_batches,
)
from oncelog.server.context import RequestContext
from oncelog.server.coordinator_runtime import (
    LOAD_CHUNK_BATCHES,
    AppendError,
    CoordinatorResult,
    CoordinatorRuntime,
    CoordinatorWriteError,
    ShardState,
)
from oncelog.server.group_service import GroupRecord, serialize
from oncelog.server.handlers.group import handle_describe_groups, handle_list_groups
from oncelog.server.topics import coordinator_partition

TOPIC = "__consumer_offsets"
KeyValue = tuple[bytes, bytes | None]


class InMemoryLog:
    """Record batches, as the log holds them; read to the end as it is when the reader gets
    there (as PartitionLog.iter_records)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.next_offset = 0

    def append(self, batch: bytes) -> None:
        buf = bytearray(batch)
        buf[0:8] = self.next_offset.to_bytes(8, "big")  # the batch's base offset
        self.data += buf
        for _pos, h in iter_batches(bytes(buf)):
            self.next_offset = h.next_offset

    def iter_records(self) -> Iterator[tuple[BatchHeader, list[Record]]]:
        pos = 0
        while pos < len(self.data):
            data = bytes(self.data)
            for p, h in iter_batches(data, pos):
                _, records = decode_batch(data, p)
                pos = p + h.size
                yield h, records
                break


class InMemoryPartition:
    def __init__(self) -> None:
        self.log = InMemoryLog()

    def add(self, key: bytes, value: bytes | None = None, *, producer_id: int | None = None
            ) -> None:
        if producer_id is None:
            self.log.append(build_batch([(key, value, (), 0)]))
        else:
            self.log.append(build_batch([(key, value, (), 0)], producer_id=producer_id,
                                        producer_epoch=0, is_transactional=True))

    def marker(self, producer_id: int, commit: bool) -> None:
        self.log.append(build_control_batch(CONTROL_COMMIT if commit else CONTROL_ABORT,
                                            producer_id=producer_id, producer_epoch=0,
                                            coordinator_epoch=0, timestamp=0))


class Partitions:
    def __init__(self) -> None:
        self.hosted: dict[tuple[str, int], InMemoryPartition] = {}

    def partition(self, topic: str, index: int) -> InMemoryPartition | None:
        return self.hosted.get((topic, index))


class Leadership:
    def __init__(self) -> None:
        self.listeners: list[Any] = []

    def tell(self, index: int, is_leader: bool, epoch: int = 1) -> None:
        for listener in self.listeners:
            listener(TOPIC, index, is_leader, epoch)


class Metadata:
    def __init__(self, count: int | None) -> None:
        self.count = count
        self.requested: list[str] = []

    def internal_partition_count(self, name: str) -> int | None:
        return self.count

    def request_internal_topic(self, name: str) -> str | None:
        self.requested.append(name)
        return ErrorCode.leader_not_available


class FakeWriter:
    """The PartitionWriter port on the in-memory partitions: the leader's append writes the
    batch to the partition's log (or raises ``refuse``); the ISR catches up when the test says
    so (``catch_up``), or the wait fails (``fail_replication``)."""

    def __init__(self, partitions: Partitions) -> None:
        self.partitions = partitions
        self.refuse: ErrorCode | None = None
        self.waits: list[tuple[int, int, asyncio.Future]] = []
        # An ISR of one: the leader's append is replicated at once (with this error, if set).
        self.isr_of_one = False
        self.isr_error: ErrorCode | None = None

    def append_unreplicated(self, index: int, records: bytearray, *,
                            verification_guard: Any = None,
                            require_verification: bool = False) -> AppendResult:
        if self.refuse is not None:
            raise AppendError(self.refuse, "refused")
        plog = self.partitions.hosted[(TOPIC, index)].log
        base = plog.next_offset
        plog.append(bytes(records))
        return AppendResult(base, plog.next_offset - 1, -1, 0)

    async def replicated(self, index: int, end_offset: int) -> ErrorCode | None:
        if self.isr_of_one:
            return self.isr_error
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.waits.append((index, end_offset, fut))
        return await fut

    def catch_up(self, error: ErrorCode | None = None) -> list[int]:
        """The ISR has everything appended (or the wait ends with ``error``): the end
        offsets answered."""
        ended = [end for _i, end, fut in self.waits if not fut.done()]
        for _i, _end, fut in self.waits:
            if not fut.done():
                fut.set_result(error)
        self.waits = []
        return ended


class RecordingShard:
    def __init__(self, index: int, epoch: int, fail_on: bytes | None = None) -> None:
        self.index, self.epoch = index, epoch
        self.replayed: list[tuple[int, int | None, bytes | None]] = []
        self.markers: list[tuple[int, bool]] = []
        self.fail_on = fail_on

    def replay(self, offset: int, producer_id: int | None, record: Record) -> None:
        if self.fail_on is not None and record.key == self.fail_on:
            raise ValueError("a record this shard cannot take")
        self.replayed.append((offset, producer_id, record.key))

    def replay_end_transaction(self, producer_id: int, committed: bool) -> None:
        self.markers.append((producer_id, committed))


class Harness:
    def __init__(self, count: int = 2, fail_on: bytes | None = None) -> None:
        self.partitions = Partitions()
        self.leadership = Leadership()
        self.metadata = Metadata(count)
        self.writer = FakeWriter(self.partitions)
        self.loaded: list[int] = []
        self.unloaded: list[tuple[int, Any]] = []
        self.runtime: CoordinatorRuntime[RecordingShard, KeyValue] = CoordinatorRuntime(
            TOPIC, writer=self.writer, leadership=self.leadership, partitions=self.partitions,
            metadata=self.metadata, serializer=lambda r: r,
            new_shard=lambda i, e: RecordingShard(i, e, fail_on),
            on_loaded=lambda i, _s: self.loaded.append(i),
            on_unloaded=lambda i, s: self.unloaded.append((i, s)))

    def host(self, index: int) -> InMemoryPartition:
        p = self.partitions.hosted[(TOPIC, index)] = InMemoryPartition()
        return p


def key_of(partition: int, n: int = 2, prefix: str = "k") -> str:
    return next(k for k in (f"{prefix}{i}" for i in range(1000))
                if coordinator_partition(k, n) == partition)


async def settle(runtime: CoordinatorRuntime, index: int) -> int:
    """Let the loop run until the partition's shard is no longer LOADING: the turns it took
    (bounded: a load that never ends fails the test)."""
    for turn in range(10_000):
        if runtime.state(index) is not ShardState.LOADING:
            return turn
        await asyncio.sleep(0)
    raise AssertionError("the load did not end")


def test_a_big_partition_loads_off_the_leadership_call_and_answers_load_in_progress():
    async def main() -> None:
        h = Harness()
        p = h.host(0)
        batches = 3 * LOAD_CHUNK_BATCHES + 5
        for i in range(batches):
            p.add(b"r%d" % i)
        key = key_of(0)
        h.leadership.tell(0, True, epoch=7)
        # The leadership call returned with the partition still loading.
        assert h.runtime.state(0) is ShardState.LOADING
        assert h.runtime.shard_for(key) == (None, ErrorCode.coordinator_load_in_progress)
        assert h.runtime.shards == {}
        assert h.runtime.loading()
        assert h.loaded == []
        # Appended while it loads (a marker on __consumer_offsets): replayed too.
        p.add(b"late", producer_id=5)
        p.marker(5, commit=True)
        turns = await settle(h.runtime, 0)
        assert turns >= 3  # it yielded between its chunks
        assert h.runtime.state(0) is ShardState.ACTIVE
        shard, error = h.runtime.shard_for(key)
        assert error is None and shard is not None
        assert shard.epoch == 7
        assert [k for _o, _p, k in shard.replayed] == [b"r%d" % i for i in range(batches)] \
            + [b"late"]
        assert [o for o, _p, _k in shard.replayed] == list(range(batches + 1))
        assert shard.replayed[-1][1] == 5  # the transactional batch's producer
        assert shard.markers == [(5, True)]
        assert h.loaded == [0]
        assert not h.runtime.loading()

    asyncio.run(main())


def test_an_empty_partition_is_active_at_once():
    async def main() -> None:
        h = Harness()
        h.host(1)
        h.leadership.tell(1, True)
        assert h.runtime.state(1) is ShardState.ACTIVE
        assert h.loaded == [1]
        assert h.runtime.shard_for(key_of(1))[1] is None

    asyncio.run(main())


def test_keys_of_partitions_not_led_here_or_before_the_topic_exists():
    async def main() -> None:
        h = Harness(count=None)
        assert h.runtime.shard_for("g") == (None, ErrorCode.not_coordinator)
        assert h.metadata.requested == [TOPIC]  # asked to be created on first use
        h.metadata.count = 2
        h.host(0)
        h.leadership.tell(0, True)
        assert h.runtime.shard_for(key_of(1)) == (None, ErrorCode.not_coordinator)
        h.leadership.tell(0, False)
        assert h.runtime.shard_for(key_of(0)) == (None, ErrorCode.not_coordinator)
        assert h.runtime.state(0) is None

    asyncio.run(main())


def test_unload_cancels_the_partitions_tasks_and_drops_only_its_shard():
    async def main() -> None:
        h = Harness()
        p0 = h.host(0)
        for i in range(2 * LOAD_CHUNK_BATCHES):
            p0.add(b"a%d" % i)
        h.host(1).add(b"b")
        h.leadership.tell(0, True)
        h.leadership.tell(1, True)
        assert h.runtime.state(0) is ShardState.LOADING
        assert h.runtime.state(1) is ShardState.ACTIVE
        loading = h.runtime.shard_for(key_of(0))
        assert loading == (None, ErrorCode.coordinator_load_in_progress)
        await settle(h.runtime, 0)
        shard0 = h.runtime.shards[0]
        shard1 = h.runtime.shards[1]

        forever = asyncio.Event()
        t0 = h.runtime.spawn(0, forever.wait())
        t1 = h.runtime.spawn(1, forever.wait())
        await asyncio.sleep(0)
        h.leadership.tell(0, False)
        await asyncio.sleep(0)
        assert t0.cancelled()
        assert not t1.done()
        assert h.unloaded == [(0, shard0)]
        assert h.runtime.shards == {1: shard1}
        assert h.runtime.state(0) is None
        h.runtime.close()
        await asyncio.sleep(0)
        assert t1.cancelled()

    asyncio.run(main())


def test_unload_while_loading_stops_the_load():
    async def main() -> None:
        h = Harness()
        p = h.host(0)
        for i in range(4 * LOAD_CHUNK_BATCHES):
            p.add(b"r%d" % i)
        h.leadership.tell(0, True)
        await asyncio.sleep(0)
        assert h.runtime.state(0) is ShardState.LOADING
        h.leadership.tell(0, False)
        assert h.runtime.state(0) is None
        dropped = h.unloaded[0][1]
        replayed = len(dropped.replayed)
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(dropped.replayed) == replayed < 4 * LOAD_CHUNK_BATCHES
        assert h.loaded == []

    asyncio.run(main())


def test_a_replay_that_raises_leaves_the_shard_failed():
    async def main() -> None:
        h = Harness(fail_on=b"bad")
        p = h.host(0)
        for i in range(2 * LOAD_CHUNK_BATCHES):
            p.add(b"r%d" % i)
        p.add(b"bad")
        p.add(b"after")
        h.leadership.tell(0, True)
        await settle(h.runtime, 0)
        assert h.runtime.state(0) is ShardState.FAILED
        assert h.runtime.shard_for(key_of(0)) == (None, ErrorCode.not_coordinator)
        assert h.loaded == []
        assert h.runtime.shards == {}
        # A new leadership (another epoch) loads it anew.
        h.leadership.tell(0, True, epoch=2)
        await settle(h.runtime, 0)
        assert h.runtime.state(0) is ShardState.FAILED
        assert [s.epoch for _i, s in h.unloaded] == [1]

    asyncio.run(main())


def _group_harness() -> tuple[Harness, CoordinatorRuntime[GroupCoordinator, GroupRecord]]:
    h = Harness()
    runtime: CoordinatorRuntime[GroupCoordinator, GroupRecord] = CoordinatorRuntime(
        TOPIC, writer=h.writer, leadership=h.leadership, partitions=h.partitions,
        metadata=h.metadata, serializer=serialize,
        new_shard=lambda _i, _e: GroupCoordinator(
            min_session_timeout_ms=6000, max_session_timeout_ms=300000,
            initial_rebalance_delay_ms=0, clock=lambda: 1000))
    return h, runtime


def _offset(p: InMemoryPartition, group: str, offset: int, producer_id: int | None = None
            ) -> None:
    p.add(encode_key(OffsetKey(group, "t", 0)), encode_offset(OffsetValue(offset)),
          producer_id=producer_id)


def test_group_cores_are_per_partition_shards():
    async def main() -> None:
        h, runtime = _group_harness()
        g0, g1 = key_of(0, prefix="group-"), key_of(1, prefix="group-")
        p0, p1 = h.host(0), h.host(1)
        _offset(p0, g0, 5)
        _offset(p0, g0, 9, producer_id=3)  # pending until its marker
        p0.marker(3, commit=True)
        _offset(p0, g0, 11, producer_id=4)
        p0.marker(4, commit=False)
        _offset(p1, g1, 7)
        h.leadership.tell(0, True)
        h.leadership.tell(1, True)
        await settle(runtime, 0)
        core0, core1 = runtime.shards[0], runtime.shards[1]
        assert set(core0.groups) == {g0} and set(core1.groups) == {g1}
        assert core0.groups[g0].offsets[("t", 0)].offset == 9  # committed; 11 aborted
        assert core0.groups[g0].pending_txn_offsets == {}
        assert core1.groups[g1].offsets[("t", 0)].offset == 7
        h.leadership.tell(0, False)
        assert runtime.shards == {1: core1}
        assert runtime.shard_for(g0) == (None, ErrorCode.not_coordinator)
        assert runtime.shard_for(g1) == (core1, None)

    asyncio.run(main())


@pytest.mark.parametrize("commit", [True, False])
def test_a_group_shard_completes_pending_offsets_on_a_marker(commit):
    core = GroupCoordinator(min_session_timeout_ms=1, max_session_timeout_ms=2,
                            initial_rebalance_delay_ms=0)
    p = InMemoryPartition()
    _offset(p, "g", 1)
    _offset(p, "g", 2, producer_id=8)
    for h, records in p.log.iter_records():
        for r in records:
            core.replay(r.offset, h.producer_id if h.is_transactional else None, r)
    assert core.groups["g"].offsets[("t", 0)].offset == 1
    core.replay_end_transaction(8, commit)
    assert core.groups["g"].offsets[("t", 0)].offset == (2 if commit else 1)
    assert core.groups["g"].pending_txn_offsets == {}


# -- writes: one shape for both coordinators (Kafka's CoordinatorResult) -----------------------

class Calls:
    """What a write's callbacks saw, in order."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def result(self, response: Any, *records: KeyValue) -> CoordinatorResult[KeyValue, Any]:
        return CoordinatorResult(response, records,
                                 on_appended=lambda: self.seen.append("appended"),
                                 on_done=lambda error: self.seen.append(("done", error)))


async def waiting(writer: FakeWriter, n: int = 1) -> None:
    """Let the loop run until ``n`` writes wait for the ISR (bounded)."""
    for _ in range(100):
        if len([w for w in writer.waits if not w[2].done()]) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError("no write waits for the ISR")


def _records(p: InMemoryPartition) -> list[tuple[BatchHeader, list[bytes | None]]]:
    return [(h, [r.key for r in records]) for h, records in p.log.iter_records()]


def test_a_write_appends_its_records_and_answers_once_the_isr_has_them():
    async def main() -> None:
        h = Harness()
        p = h.host(0)
        h.leadership.tell(0, True)
        calls = Calls()
        ran: list[RecordingShard] = []

        def op(shard: RecordingShard) -> CoordinatorResult[KeyValue, Any]:
            ran.append(shard)
            return calls.result("answer", (b"k1", b"v1"), (b"k2", None))

        write = asyncio.ensure_future(h.runtime.schedule_write(0, "op", op))
        await waiting(h.writer)
        # The operation ran on the partition's shard and its records are in the leader's log,
        # one batch, serialized; the answer waits for the ISR.
        assert ran == [h.runtime.shards[0]]
        ((header, keys),) = _records(p)
        assert keys == [b"k1", b"k2"] and not header.is_transactional
        assert calls.seen == ["appended"]
        assert not write.done()
        assert h.writer.catch_up() == [2]
        assert await write == "answer"
        assert calls.seen == ["appended", ("done", None)]

    asyncio.run(main())


def test_a_write_without_records_answers_at_once():
    async def main() -> None:
        h = Harness()
        h.host(0)
        h.leadership.tell(0, True)
        calls = Calls()
        assert await h.runtime.schedule_write(0, "op", lambda _s: calls.result(7)) == 7
        assert calls.seen == [("done", None)] and h.writer.waits == []

    asyncio.run(main())


def test_a_refused_append_or_a_failed_replication_raises_the_appends_error():
    async def main() -> None:
        h = Harness()
        p = h.host(0)
        h.leadership.tell(0, True)
        calls = Calls()
        h.writer.refuse = ErrorCode.not_enough_replicas
        with pytest.raises(CoordinatorWriteError) as refused:
            await h.runtime.schedule_write(0, "op", lambda _s: calls.result(1, (b"k", b"v")))
        assert refused.value.error == ErrorCode.not_enough_replicas
        assert calls.seen == [("done", ErrorCode.not_enough_replicas)]  # never "appended"
        assert _records(p) == []
        h.writer.refuse = None
        calls.seen.clear()
        write = asyncio.ensure_future(
            h.runtime.schedule_write(0, "op", lambda _s: calls.result(1, (b"k", b"v"))))
        await waiting(h.writer)
        h.writer.catch_up(ErrorCode.request_timed_out)
        with pytest.raises(CoordinatorWriteError) as timed_out:
            await write
        assert timed_out.value.error == ErrorCode.request_timed_out
        assert calls.seen == ["appended", ("done", ErrorCode.request_timed_out)]

    asyncio.run(main())


def test_a_write_to_a_shard_not_active_here_is_refused_before_it_runs():
    async def main() -> None:
        h = Harness()
        p = h.host(0)
        for i in range(2 * LOAD_CHUNK_BATCHES):
            p.add(b"r%d" % i)
        h.leadership.tell(0, True)
        ran: list[int] = []

        def op(_s: RecordingShard) -> CoordinatorResult[KeyValue, None]:
            ran.append(1)
            return CoordinatorResult(None, [(b"k", b"v")])

        for index, error in ((0, ErrorCode.coordinator_load_in_progress),
                             (1, ErrorCode.not_coordinator), (None, ErrorCode.not_coordinator)):
            with pytest.raises(CoordinatorWriteError) as refused:
                await h.runtime.schedule_write(index, "op", op)
            assert refused.value.error == error
        assert ran == []

    asyncio.run(main())


def test_writes_append_in_the_order_they_ran_and_as_a_producers_batch():
    async def main() -> None:
        h = Harness()
        p = h.host(0)
        h.leadership.tell(0, True)
        first = asyncio.ensure_future(h.runtime.schedule_write(
            0, "a", lambda _s: CoordinatorResult("a", [(b"a", b"1")])))
        second = asyncio.ensure_future(h.runtime.schedule_write(
            0, "b", lambda _s: CoordinatorResult("b", [(b"b", b"2")]),
            producer=(42, 3)))
        await waiting(h.writer, 2)
        (h1, k1), (h2, k2) = _records(p)
        assert (k1, k2) == ([b"a"], [b"b"])
        assert not h1.is_transactional
        assert h2.is_transactional and (h2.producer_id, h2.producer_epoch) == (42, 3)
        assert h.writer.catch_up() == [1, 2]
        assert (await first, await second) == ("a", "b")

    asyncio.run(main())


def test_a_write_finishes_when_its_caller_goes_away_and_not_when_its_shard_does():
    async def main() -> None:
        h = Harness()
        h.host(0)
        h.leadership.tell(0, True)
        calls = Calls()
        # The caller (a request whose client disconnected) is cancelled: the write goes on.
        write = asyncio.ensure_future(
            h.runtime.schedule_write(0, "op", lambda _s: calls.result(1, (b"k", b"v"))))
        await waiting(h.writer)
        write.cancel()
        await asyncio.sleep(0)
        assert write.cancelled()
        h.writer.catch_up()
        for _ in range(3):
            await asyncio.sleep(0)
        assert calls.seen == ["appended", ("done", None)]
        # The shard is dropped while its write waits: NOT_COORDINATOR, and no on_done.
        calls.seen.clear()
        write = asyncio.ensure_future(
            h.runtime.schedule_write(0, "op", lambda _s: calls.result(1, (b"k", b"v"))))
        await waiting(h.writer)
        h.leadership.tell(0, False)
        with pytest.raises(CoordinatorWriteError) as dropped:
            await write
        assert dropped.value.error == ErrorCode.not_coordinator
        h.writer.catch_up()
        await asyncio.sleep(0)
        assert calls.seen == ["appended"]

    asyncio.run(main())


def test_a_background_write_runs_and_a_refused_one_is_dropped():
    async def main() -> None:
        h = Harness()
        p = h.host(0)
        h.leadership.tell(0, True)
        calls = Calls()
        h.runtime.write_in_background(0, "tick", lambda _s: calls.result(None, (b"t", None)))
        await waiting(h.writer)
        assert [k for _h, k in _records(p)] == [[b"t"]]
        h.writer.catch_up()
        await asyncio.sleep(0)
        assert calls.seen == ["appended", ("done", None)]
        h.runtime.write_in_background(1, "tick", lambda _s: calls.result(None, (b"u", None)))
        assert len(_records(p)) == 1

    asyncio.run(main())


def test_a_write_an_isr_of_one_has_at_once_completes_in_one_step():
    async def main() -> None:
        h = Harness()
        p = h.host(0)
        h.leadership.tell(0, True)
        h.writer.isr_of_one = True
        calls = Calls()
        h.runtime.write_in_background(0, "op", lambda _s: calls.result(None, (b"k", b"v")))
        # Done in the write's first step: no turn of the loop between the append and on_done.
        await asyncio.sleep(0)
        assert calls.seen == ["appended", ("done", None)] and h.writer.waits == []
        assert await h.runtime.schedule_write(
            0, "op", lambda _s: calls.result("answer", (b"k2", b"v"))) == "answer"
        h.writer.isr_error = ErrorCode.not_enough_replicas_after_append
        calls.seen.clear()
        with pytest.raises(CoordinatorWriteError) as shrunk:
            await h.runtime.schedule_write(0, "op", lambda _s: calls.result(1, (b"k3", b"v")))
        assert shrunk.value.error == ErrorCode.not_enough_replicas_after_append
        assert calls.seen == ["appended", ("done", ErrorCode.not_enough_replicas_after_append)]
        assert len(_records(p)) == 3

    asyncio.run(main())



# -- the group coordinator's answers while a partition loads (Kafka's GroupCoordinator:
# handleListGroups answers COORDINATOR_LOAD_IN_PROGRESS while any of its partitions loads,
# with the groups of the loaded ones; handleDescribeGroup's validateGroupStatus answers it for a
# group of a loading partition) --------------------------------------------------------------

class GroupsPort:
    """What ListGroups and DescribeGroups ask of the group coordinator (GroupCoordinatorPort),
    as server/group_service.py answers it, over a runtime of group cores."""

    def __init__(self, runtime: CoordinatorRuntime[GroupCoordinator, GroupRecord]) -> None:
        self.runtime = runtime

    def groups(self) -> dict[str, Any]:
        return {g: group for core in self.runtime.shards.values()
                for g, group in core.groups.items()}

    def group(self, group_id: str) -> Any:
        core = self.runtime.shard_for(group_id)[0]
        return None if core is None else core.groups.get(group_id)

    def not_coordinator(self, group_id: str) -> ErrorCode | None:
        return self.runtime.shard_for(group_id)[1]

    def loading(self) -> bool:
        return self.runtime.loading()


async def _ask(handler: Any, broker: Any, api: ApiKey, version: int, name: str,
               **fields: Any) -> Any:
    request = make(getattr(request_module(api, version), name), **fields)
    ctx = RequestContext(RequestHeader(api, version, 1, "test", 0), "127.0.0.1:1")
    return await handler(broker, ctx, request)


def test_list_and_describe_groups_while_a_partition_loads():
    async def main() -> None:
        h, runtime = _group_harness()
        g0, g1 = key_of(0, prefix="group-"), key_of(1, prefix="group-")
        p0, p1 = h.host(0), h.host(1)
        for i in range(2 * LOAD_CHUNK_BATCHES):
            _offset(p0, g0, i)
        _offset(p1, g1, 7)
        broker = SimpleNamespace(group_coordinator=GroupsPort(runtime),
                                 allowed=lambda *_a: True)

        async def listed(version: int = 4) -> tuple[ErrorCode, list[str]]:
            r = await _ask(handle_list_groups, broker, ApiKey.LIST_GROUPS, version,
                           "ListGroupsRequest", states_filter=(), types_filter=())
            return r.error_code, sorted(g.group_id for g in r.groups)

        async def described(group_id: str) -> ErrorCode:
            r = await _ask(handle_describe_groups, broker, ApiKey.DESCRIBE_GROUPS, 5,
                           "DescribeGroupsRequest", groups=(group_id,),
                           include_authorized_operations=False)
            return r.groups[0].error_code

        h.leadership.tell(0, True)  # many batches: still loading when the call returns
        h.leadership.tell(1, True)
        assert runtime.state(0) is ShardState.LOADING and runtime.state(1) is ShardState.ACTIVE
        # The loaded partition's groups are listed, with the error saying the list is partial.
        for version in (0, 4, 5):
            assert await listed(version) == (ErrorCode.coordinator_load_in_progress, [g1])
        assert await described(g0) == ErrorCode.coordinator_load_in_progress
        assert await described(g1) == ErrorCode.none
        await settle(runtime, 0)
        assert await listed() == (ErrorCode.none, [g0, g1])
        assert await described(g0) == ErrorCode.none

    asyncio.run(main())
