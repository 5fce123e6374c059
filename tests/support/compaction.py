"""Helpers for the log-compaction tests: random transactional histories written into a
PartitionLog, and what a read_committed consumer reads back (through the client's own
decoding, so that the consumer's aborted-transaction filtering is the one under test). The
histories are a single node's: after each append the replica manager, the only in-sync
replica, moves the high watermark to the log end (support/logs.py)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from oncelog.client.consumer.fetcher import decode_records
from oncelog.client.types import TopicPartition
from oncelog.log import PartitionLog
from oncelog.log.cleaner_manager import CleanerManager
from oncelog.log.log_cleaner import clean_log
from oncelog.records import build_batch, split_batches

from .logs import advance_high_watermark

TP = TopicPartition("t", 0)


def read_log(plog: PartitionLog, *, committed: bool) -> list:
    """Every record a consumer reading from the log start gets (read_committed: up to the
    last stable offset, aborted transactions filtered; else: up to the high watermark)."""
    start = plog.log_start_offset
    end = plog.last_stable_offset if committed else plog.high_watermark
    out: list = []
    offset = start
    while offset < end:  # a fetch at a time, as a consumer reads (one segment each)
        data = plog.read(offset, 1 << 30, end)
        if not data:
            break
        # What the broker sends beside the data: the aborted transactions of its range.
        aborted = [(a.first_offset, a.producer_id)
                   for a in plog.aborted_transactions(offset, end)] if committed else None
        records, offset = decode_records(TP, bytes(data), offset, read_committed=committed,
                                         aborted=aborted, check_crcs=True)
        out.extend(records)
    return out


def latest_values(records) -> dict[bytes, bytes]:
    """Key -> value as a consumer that applies every record in order ends with (tombstones
    delete)."""
    out: dict[bytes, bytes] = {}
    for r in records:
        if r.value is None:
            out.pop(r.key, None)
        else:
            out[r.key] = r.value
    return out


@dataclass
class History:
    """A random history in a log: transactional producers that commit or abort, an idempotent
    producer, plain writes; keys from a small set, tombstones now and then. ``aborted_values``
    are the values of aborted transactions (which must never be read as committed)."""

    plog: PartitionLog
    rng: random.Random
    now: int = 1_000_000
    keys: int = 20
    seq: dict[int, int] = field(default_factory=dict)
    open_txn: dict[int, list[bytes]] = field(default_factory=dict)
    aborted_values: set[bytes] = field(default_factory=set)
    counter: int = 0

    def _records(self, n: int) -> list:
        out = []
        for _ in range(n):
            self.counter += 1
            key = f"k{self.rng.randrange(self.keys)}".encode()
            value = None if self.rng.random() < 0.15 else f"v{self.counter}".encode()
            out.append((key, value, [], self.now))
        return out

    def _append(self, pid: int, records: list, transactional: bool) -> None:
        seq = self.seq.get(pid, 0) if pid >= 0 else -1
        data = bytearray(build_batch(records, producer_id=pid, producer_epoch=0 if pid >= 0
                                     else -1, base_sequence=seq,
                                     is_transactional=transactional))
        self.plog.append(data, split_batches(data), self.now)
        advance_high_watermark(self.plog)
        if pid >= 0:
            self.seq[pid] = seq + len(records)

    def end_txn(self, pid: int, commit: bool) -> None:
        self.plog.append_marker(pid, 0, commit, 0, self.now)
        advance_high_watermark(self.plog)

    def step(self) -> None:
        self.now += self.rng.randrange(1, 50)
        kind = self.rng.random()
        if kind < 0.2:
            self._append(-1, self._records(self.rng.randrange(1, 4)), False)
        elif kind < 0.35:
            self._append(10, self._records(self.rng.randrange(1, 4)), False)  # idempotent
        else:
            pid = self.rng.randrange(1, 5)
            if pid in self.open_txn and self.rng.random() < 0.35:
                commit = self.rng.random() < 0.6
                values = self.open_txn.pop(pid)
                if not commit:
                    self.aborted_values.update(values)
                self.end_txn(pid, commit)
            else:
                recs = self._records(self.rng.randrange(1, 4))
                self.open_txn.setdefault(pid, []).extend(r[1] for r in recs if r[1])
                self._append(pid, recs, True)

    def close_all(self) -> None:
        for pid in list(self.open_txn):
            values = self.open_txn.pop(pid)
            commit = self.rng.random() < 0.5
            if not commit:
                self.aborted_values.update(values)
            self.end_txn(pid, commit)


def clean_now(manager: CleanerManager, plog: PartitionLog, now: int,
              memory_bytes: int = 1 << 20):
    """One cleaning of ``plog`` now, whatever its dirty ratio (None when nothing is
    cleanable)."""
    ltc = manager.log_to_clean("t-0", plog, now)
    manager.state(plog).in_progress = True
    return clean_log(manager, ltc, now, memory_bytes)


def confluent_read_committed(bootstrap: str, topic: str, partitions: int,
                             timeout: float = 60.0) -> list[tuple[bytes, bytes | None]]:
    """(key, value) of every record a read_committed confluent-kafka consumer reads from the
    start of each partition to its end (until it says end of partition)."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.time()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
        out: list[tuple[bytes, bytes | None]] = []
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < partitions:
            assert time.monotonic() < deadline, f"read {len(out)}, at the end of {done}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == -191, msg.error()  # _PARTITION_EOF
                done.add(msg.partition())
                continue
            out.append((msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def partition_bytes(directory) -> int:
    """The size of a partition directory's segment files. The cleaner replaces segments while
    this runs (Kafka's replaceSegments: the cleaned ``.log.swap`` first, then the old ``.log``
    deleted, then the ``.swap`` renamed): a swap in flight is counted, and when a listed file
    is gone (deleted or renamed) before its size is read the directory is measured again."""
    while True:
        try:
            return sum(p.stat().st_size for p in directory.iterdir()  # one listing
                       if p.name.endswith((".log", ".log.swap")))
        except FileNotFoundError:
            continue
