"""The producer's RecordAccumulator on its own (sans IO): when it wakes the sender, which
batches expire, and what flush waits for."""

from __future__ import annotations

import threading
import time

from oncelog.client.metadata import Cluster, TopicMetadata
from oncelog.client.producer.accumulator import RecordAccumulator
from oncelog.client.types import BrokerNode, PartitionInfo, TopicPartition
from oncelog.records import Compression

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)
CLUSTER = Cluster(brokers={1: BrokerNode(1, "h", 1)}, topics={"t": TopicMetadata(
    "t", 0, False, {0: PartitionInfo(0, 1), 1: PartitionInfo(1, 1)})})
FAR = time.monotonic() + 3600


def accumulator(batch_size: int = 100, linger_ms: int = 5) -> tuple[RecordAccumulator, list]:
    acc = RecordAccumulator(batch_size=batch_size, linger_ms=linger_ms, buffer_memory=1 << 20,
                            compression=Compression.NONE)
    wakeups: list[float] = []
    acc.wakeup = lambda: wakeups.append(time.monotonic())
    return acc, wakeups


def append(acc: RecordAccumulator, tp: TopicPartition, size: int = 10):
    return acc.append(tp, None, b"v" * size, (), 0, FAR)


def test_the_first_batch_wakes_the_sender_then_only_what_is_due_before_it_looks():
    acc, wakeups = accumulator(batch_size=1000, linger_ms=10_000)
    append(acc, TP0)
    assert len(wakeups) == 1  # nothing was known of the sender: it may sleep for long
    append(acc, TP0)
    assert len(wakeups) == 1  # same batch
    # The sender looks: nothing ready, it will look again when TP0's batch is due.
    nodes, next_check, _ = acc.ready(CLUSTER, time.monotonic(), lambda tp, b: True)
    assert not nodes and next_check > 1.0 - 1e-3
    append(acc, TP1)  # a new batch due as late as the one it waits for: no wakeup
    assert len(wakeups) == 1
    append(acc, TP0, 1000)  # does not fit: TP0's batch is full, due now
    assert len(wakeups) == 2
    append(acc, TP0, 1000)  # another full one before the sender looked: it is awake already
    assert len(wakeups) == 2
    nodes, _, _ = acc.ready(CLUSTER, time.monotonic(), lambda tp, b: True)
    assert nodes == {1}
    append(acc, TP1, 1000)  # ready() promised to look again only in a while: wake it
    assert len(wakeups) == 3


def test_a_batch_due_sooner_than_the_sender_looks_wakes_it():
    acc, wakeups = accumulator(linger_ms=0)
    append(acc, TP0)
    acc.ready(CLUSTER, time.monotonic(), lambda tp, b: False)  # nothing sendable: sleeps 1 s
    append(acc, TP1)  # linger.ms 0: due now
    assert len(wakeups) == 2


def test_expired_takes_the_old_batches_from_each_queue_front():
    acc, _ = accumulator(batch_size=10)
    for _ in range(3):
        append(acc, TP0)  # three batches of one record
    time.sleep(0.02)
    for _ in range(2):
        append(acc, TP0)
    append(acc, TP1)
    expired = acc.expired(time.monotonic(), 0.015)
    assert [b.tp for b in expired] == [TP0] * 3
    assert [b.tp for b in acc.queued_batches()] == [TP0, TP0, TP1]
    assert acc.expired(time.monotonic(), 10.0) == []


def test_await_settled_waits_for_release_and_counts_what_is_left():
    acc, _ = accumulator(batch_size=1000)
    futures = [append(acc, TP0) for _ in range(3)] + [append(acc, TP1)]
    pending = acc.flush_begin()
    assert acc.await_settled(pending, time.monotonic() + 0.01) == 4
    first, second = sorted(pending, key=lambda b: b.tp.partition)

    def settle() -> None:
        for batch in (first, second):
            batch.complete(0, None)
            acc.release(batch)

    threading.Timer(0.02, settle).start()
    assert acc.await_settled(pending, time.monotonic() + 10) == 0
    assert all(f.done() for f in futures)  # flush returns once the futures are done
    acc.flush_end()
