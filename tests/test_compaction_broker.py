"""Log compaction in a real broker process, through confluent-kafka (librdkafka): committed and
aborted transactions, an idempotent producer, tombstones, on a compacted topic whose segments
the background cleaner rewrites while it is written; what read_committed reads stays the
latest committed value per key, aborted data never shows, the producers carry on after a
restart; a SIGKILL while the cleaner writes its segments loses nothing; the internal topics
stay bounded (issue 18, section 4)."""

from __future__ import annotations

import random
import time

import pytest
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    Producer,
    TopicPartition,
)
from support.compaction import confluent_read_committed, partition_bytes
from support.interop import confluent_create_topic

from oncelog import Admin
from oncelog import TopicPartition as OncelogTopicPartition
from oncelog.harness.broker_process import BrokerProcess
from oncelog.log.cleaner_manager import CHECKPOINT_FILE

pytestmark = pytest.mark.slow

TOPIC = "compacted"
CLEANER = {"log.cleaner.backoff.ms": "100"}
COMPACT = {"cleanup.policy": "compact", "segment.bytes": "4096",
           "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "500"}


def _wait(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _delivered(producer: Producer) -> None:
    assert producer.flush(30) == 0, "undelivered records"


class Writers:
    """A transactional producer that commits or aborts and an idempotent one, writing keys of
    a small set (tombstones now and then); ``model`` is what read_committed must end with."""

    def __init__(self, bootstrap: str, rng: random.Random) -> None:
        self.rng = rng
        self.errors: list = []
        self.txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "compactor",
                             "linger.ms": 1})
        self.txn.init_transactions(30)
        self.idem = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                              "linger.ms": 1})
        self.model: dict[bytes, bytes] = {}
        self.aborted: set[bytes] = set()
        self.n = 0

    def _record(self) -> tuple[bytes, bytes | None]:
        self.n += 1
        key = f"k{self.rng.randrange(30)}".encode()
        value = None if self.rng.random() < 0.1 else f"v{self.n}-".encode() + b"x" * 100
        return key, value

    def _apply(self, records) -> None:
        for key, value in records:
            if value is None:
                self.model.pop(key, None)
            else:
                self.model[key] = value

    def _report(self, err, _msg) -> None:
        if err is not None:
            self.errors.append(err)

    def round(self) -> None:
        records = [self._record() for _ in range(self.rng.randrange(1, 6))]
        self.txn.begin_transaction()
        for key, value in records:
            self.txn.produce(TOPIC, key=key, value=value, partition=0)
        if self.rng.random() < 0.6:
            self.txn.commit_transaction(30)
            self._apply(records)
        else:
            self.txn.abort_transaction(30)
            self.aborted.update(v for _k, v in records if v is not None)
        records = [self._record() for _ in range(self.rng.randrange(1, 4))]
        for key, value in records:
            self.idem.produce(TOPIC, key=key, value=value, partition=0,
                              on_delivery=self._report)
        _delivered(self.idem)
        assert not self.errors, self.errors
        self._apply(records)


def _cleaned_up_to(broker: BrokerProcess) -> int:
    path = broker.data_dir / f"{TOPIC}-0" / CHECKPOINT_FILE
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return -1


def _check(broker: BrokerProcess, w: Writers) -> None:
    read = confluent_read_committed(broker.bootstrap_servers, TOPIC, 1)
    latest: dict[bytes, bytes] = {}
    for key, value in read:
        if value is None:
            latest.pop(key, None)
        else:
            latest[key] = value
    assert latest == w.model
    assert not {v for _k, v in read} & w.aborted


def test_compaction_keeps_the_latest_committed_value_per_key_through_restarts(tmp_path):
    with BrokerProcess(tmp_path / "data", settings=CLEANER) as broker:
        confluent_create_topic(broker.bootstrap_servers, TOPIC, 1, COMPACT)
        w = Writers(broker.bootstrap_servers, random.Random(7))
        for _ in range(60):
            w.round()
        _wait(lambda: _cleaned_up_to(broker) > 0, "a cleaning")
        _check(broker, w)
        before = partition_bytes(broker.data_dir / f"{TOPIC}-0")
        for _ in range(60):
            w.round()
        _wait(lambda: partition_bytes(broker.data_dir / f"{TOPIC}-0") < before * 1.5,
              "the log to stay small")
        _check(broker, w)
        broker.restart()
        # The same producers carry on: their state came back from the cleaned log.
        for _ in range(20):
            w.round()
        _check(broker, w)
        w.txn.flush(10)


def test_sigkill_while_the_cleaner_writes_loses_nothing(tmp_path):
    # A slow cleaner (its I/O throttled): the kill lands while .cleaned files are written.
    settings = {**CLEANER, "log.cleaner.io.max.bytes.per.second": "300000"}
    with BrokerProcess(tmp_path / "data", settings=settings) as broker:
        confluent_create_topic(broker.bootstrap_servers, TOPIC, 1,
                               {**COMPACT, "segment.bytes": str(256 * 1024)})
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers,
                             "enable.idempotence": True, "linger.ms": 20})
        model: dict[bytes, bytes] = {}
        for i in range(20_000):
            key = f"k{i % 500}".encode()
            value = f"v{i}-".encode() + b"y" * 100
            producer.produce(TOPIC, key=key, value=value, partition=0)
            model[key] = value
            if i % 1000 == 0:
                producer.poll(0)
        _delivered(producer)
        directory = broker.data_dir / f"{TOPIC}-0"
        for attempt in range(3):
            _wait(lambda: any(directory.glob("*.cleaned")), "the cleaner writing")
            broker.kill()
            broker.start()
            read = dict(confluent_read_committed(broker.bootstrap_servers, TOPIC, 1))
            assert read == model, f"after kill {attempt}"
            # More dirt, so that the next cleaning has work to be killed in.
            for i in range(3000):
                key = f"k{i % 500}".encode()
                value = f"w{attempt}-{i}-".encode() + b"z" * 100
                producer.produce(TOPIC, key=key, value=value, partition=0)
                model[key] = value
            _delivered(producer)


def test_the_internal_topics_stay_bounded_under_many_offset_commits(tmp_path):
    settings = {**CLEANER, "offsets.topic.num.partitions": "1",
                "offsets.topic.replication.factor": "1",
                "offsets.topic.segment.bytes": str(64 * 1024),
                "transaction.state.log.num.partitions": "1",
                "transaction.state.log.replication.factor": "1",
                "transaction.state.log.min.isr": "1",
                "transaction.state.log.segment.bytes": str(64 * 1024)}
    # 10,000 OffsetCommit requests of 4 partitions: 2.6 MB uncompacted (measured with the
    # cleaner off), five times the bound checked below.
    commits = 40_000
    with BrokerProcess(tmp_path / "data", settings=settings) as broker:
        confluent_create_topic(broker.bootstrap_servers, "t", 4)
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                             "group.id": "committer", "enable.auto.commit": False})
        try:
            for i in range(commits // 4):
                offsets = [TopicPartition("t", p, i) for p in range(4)]
                consumer.commit(offsets=offsets, asynchronous=i % 50 != 0)
        finally:
            consumer.commit(offsets=[TopicPartition("t", p, commits) for p in range(4)],
                            asynchronous=False)
            consumer.close()
        # A tombstone: the group's offset of partition 3 deleted (OffsetDelete).
        with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
            deleted = admin.delete_consumer_group_offsets(
                "committer", [OncelogTopicPartition("t", 3)])
            assert list(deleted.values()) == [None]
        txn = Producer({"bootstrap.servers": broker.bootstrap_servers,
                        "transactional.id": "bounded"})
        txn.init_transactions(30)
        for i in range(300):
            txn.begin_transaction()
            txn.produce("t", key=b"k", value=str(i).encode(), partition=0)
            txn.commit_transaction(30)
        txn.flush(10)
        del txn
        offsets_dir = broker.data_dir / "__consumer_offsets-0"
        state_dir = broker.data_dir / "__transaction_state-0"
        # Uncompacted, the commits alone would take several MB; compacted, a few segments.
        _wait(lambda: partition_bytes(offsets_dir) < 512 * 1024, "__consumer_offsets compacted",
              timeout=120)
        _wait(lambda: partition_bytes(state_dir) < 256 * 1024, "__transaction_state compacted",
              timeout=120)
        broker.restart()
        check = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                          "group.id": "committer"})
        try:
            got = check.committed([TopicPartition("t", p) for p in range(4)], timeout=30)
            assert [tp.offset for tp in got] == [commits] * 3 + [OFFSET_INVALID]
        finally:
            check.close()
        # The transaction coordinator loaded its compacted log: the same id carries on.
        again = Producer({"bootstrap.servers": broker.bootstrap_servers,
                          "transactional.id": "bounded"})
        again.init_transactions(30)
        again.begin_transaction()
        again.produce("t", key=b"k", value=b"after", partition=0)
        again.commit_transaction(30)
