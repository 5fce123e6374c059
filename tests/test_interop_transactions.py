"""Transactions with third-party clients against a real broker process: confluent-kafka's and
kafka-python's transactional producers (commit, abort, send_offsets_to_transaction with the
consumer's group metadata, a zombie fenced by a new instance with the same transactional id, a
transaction aborted by the coordinator's timeout), read by read_committed consumers of every
client: each must see exactly the committed records, in order."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka import TopicPartition as ConfluentTP
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaPythonTP
from kafka.errors import KafkaError as KafkaPythonError
from kafka.structs import OffsetAndMetadata
from support.transactions import read_committed

from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow

PARTITIONS = 2
DEADLINE_S = 30.0
# The coordinator checks for timed-out transactions this often (Kafka: 10 s).
SETTINGS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
            "transaction.state.log.num.partitions": "5", "offsets.topic.num.partitions": "5",
            "group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("txn-interop") / "data",
                       settings=SETTINGS) as b:
        yield b


def new_topic(bootstrap: str, partitions: int = PARTITIONS) -> str:
    name = f"txn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


# -- read_committed readers, one per client -------------------------------------------------


def read_confluent(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> list[bytes]:
    c = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                           "isolation.level": "read_committed", "enable.auto.commit": False,
                           "enable.partition.eof": True})
    try:
        c.assign([ConfluentTP(topic, p, 0) for p in range(partitions)])
        out: list[bytes] = []
        eof: set[int] = set()
        deadline = time.monotonic() + DEADLINE_S
        while len(eof) < partitions:
            assert time.monotonic() < deadline, out
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                eof.add(msg.partition())
                continue
            out.append(msg.value())
        return out
    finally:
        c.close()


def read_kafka_python(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> list[bytes]:
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                      enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        tps = [KafkaPythonTP(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, (out, ends)
            for msgs in c.poll(timeout_ms=500).values():
                out.extend(m.value for m in msgs)
        return out
    finally:
        c.close()


READERS = {"oncelog": read_committed, "confluent": read_confluent,
           "kafka-python": read_kafka_python}


def by_partition_order(values: list[bytes]) -> list[bytes]:
    """Readers interleave partitions differently: compare each partition's sequence. Values
    are ``b"<partition>:<n>..."``."""
    return sorted(values, key=lambda v: (v.split(b":")[0], int(v.split(b":")[1].split(b"-")[0])))


# -- transactional writers, one per client ---------------------------------------------------


def confluent_producer(bootstrap: str, txn_id: str, **extra) -> ConfluentProducer:
    p = ConfluentProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                           "transaction.timeout.ms": 10_000, **extra})
    p.init_transactions(DEADLINE_S)
    return p


def kafka_python_producer(bootstrap: str, txn_id: str, **extra) -> KafkaProducer:
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id,
                      transaction_timeout_ms=10_000, **extra)
    p.init_transactions()
    return p


def write_confluent(bootstrap: str, topic: str, txn_id: str) -> list[bytes]:
    """Three transactions: commit, abort, commit. Returns what was committed."""
    p = confluent_producer(bootstrap, txn_id)
    committed = []
    for n, commit in enumerate((True, False, True)):
        p.begin_transaction()
        values = [b"%d:%d-%s" % (part, n * 10 + i, b"c" if commit else b"a")
                  for part in range(PARTITIONS) for i in range(5)]
        for v in values:
            p.produce(topic, value=v, partition=int(v.split(b":")[0]))
        if commit:
            p.commit_transaction(DEADLINE_S)
            committed.extend(values)
        else:
            p.flush(DEADLINE_S)  # the aborted records are in the log, then aborted
            p.abort_transaction(DEADLINE_S)
    p.flush(DEADLINE_S)
    return committed


def write_kafka_python(bootstrap: str, topic: str, txn_id: str) -> list[bytes]:
    p = kafka_python_producer(bootstrap, txn_id)
    committed = []
    try:
        for n, commit in enumerate((True, False, True)):
            p.begin_transaction()
            values = [b"%d:%d-%s" % (part, n * 10 + i, b"c" if commit else b"a")
                      for part in range(PARTITIONS) for i in range(5)]
            for v in values:
                p.send(topic, value=v, partition=int(v.split(b":")[0]))
            if commit:
                p.commit_transaction()
                committed.extend(values)
            else:
                p.flush()
                p.abort_transaction()
    finally:
        p.close(timeout=5)
    return committed


WRITERS = {"confluent": write_confluent, "kafka-python": write_kafka_python}


@pytest.mark.parametrize("writer", WRITERS)
def test_transactions_commit_and_abort_and_every_reader_sees_only_committed(broker, writer):
    bootstrap = broker.bootstrap_servers
    topic = new_topic(bootstrap)
    committed = WRITERS[writer](bootstrap, topic, f"{writer}-{uuid.uuid4().hex[:6]}")
    assert len(committed) == 20
    for name, read in READERS.items():
        got = read(bootstrap, topic)
        assert by_partition_order(got) == by_partition_order(committed), name


def test_confluent_zombie_is_fenced_by_a_new_instance(broker):
    bootstrap = broker.bootstrap_servers
    topic = new_topic(bootstrap)
    txn_id = f"fence-{uuid.uuid4().hex[:6]}"
    zombie = confluent_producer(bootstrap, txn_id)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"0:0-zombie", partition=0)
    zombie.flush(DEADLINE_S)
    successor = confluent_producer(bootstrap, txn_id)  # fences the zombie, aborts its txn
    successor.begin_transaction()
    successor.produce(topic, value=b"0:1-successor", partition=0)
    successor.commit_transaction(DEADLINE_S)
    with pytest.raises(KafkaException) as e:
        zombie.produce(topic, value=b"0:2-zombie", partition=0)
        zombie.commit_transaction(DEADLINE_S)
    assert e.value.args[0].fatal() or e.value.args[0].code() in (
        KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    for name, read in READERS.items():
        assert read(bootstrap, topic) == [b"0:1-successor"], name


def test_kafka_python_zombie_is_fenced_by_a_new_instance(broker):
    bootstrap = broker.bootstrap_servers
    topic = new_topic(bootstrap)
    txn_id = f"fence-kp-{uuid.uuid4().hex[:6]}"
    zombie = kafka_python_producer(bootstrap, txn_id)
    zombie.begin_transaction()
    zombie.send(topic, value=b"0:0-zombie", partition=0).get(DEADLINE_S)
    successor = kafka_python_producer(bootstrap, txn_id)
    successor.begin_transaction()
    successor.send(topic, value=b"0:1-successor", partition=0)
    successor.commit_transaction()
    successor.close(timeout=5)
    with pytest.raises(KafkaPythonError):
        zombie.send(topic, value=b"0:2-zombie", partition=0)
        zombie.commit_transaction()
    zombie.close(timeout=1)
    assert read_committed(bootstrap, topic) == [b"0:1-successor"]


def test_confluent_transaction_past_its_timeout_is_aborted_by_the_coordinator(broker):
    bootstrap = broker.bootstrap_servers
    topic = new_topic(bootstrap)
    p = ConfluentProducer({"bootstrap.servers": bootstrap,
                           "transactional.id": f"timeout-{uuid.uuid4().hex[:6]}",
                           "transaction.timeout.ms": 1000})
    p.init_transactions(DEADLINE_S)
    p.begin_transaction()
    p.produce(topic, value=b"0:0-late", partition=0)
    p.flush(DEADLINE_S)
    # The open transaction holds the LSO back until the coordinator aborts it.
    deadline = time.monotonic() + DEADLINE_S
    c = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": "lso",
                           "isolation.level": "read_committed"})
    try:
        while c.get_watermark_offsets(ConfluentTP(topic, 0), timeout=10)[1] < 2:
            assert time.monotonic() < deadline, "the timed-out transaction was never aborted"
            time.sleep(0.1)  # polling the broker's LSO: no event to await from outside
    finally:
        c.close()
    with pytest.raises(KafkaException):
        p.commit_transaction(DEADLINE_S)
    for name, read in READERS.items():
        assert read(bootstrap, topic) == [], name


@pytest.mark.parametrize("writer", ["confluent", "kafka-python"])
def test_send_offsets_to_transaction_commits_offsets_with_the_output(broker, writer):
    """A consume-transform-produce step: the consumed offsets become the group's committed
    offsets only if the transaction commits."""
    bootstrap = broker.bootstrap_servers
    source, sink = new_topic(bootstrap, 1), new_topic(bootstrap, 1)
    seed = ConfluentProducer({"bootstrap.servers": bootstrap})
    for i in range(10):
        seed.produce(source, value=b"0:%d-in" % i, partition=0)
    seed.flush(DEADLINE_S)
    group = f"copier-{uuid.uuid4().hex[:6]}"
    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "isolation.level": "read_committed",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([source])
        got = []
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < 10:
            assert time.monotonic() < deadline, got
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg)
        txn_id = f"copier-{writer}-{uuid.uuid4().hex[:6]}"
        for commit, upto in ((False, 5), (True, 5), (True, 10)):
            start = 0 if upto == 5 else 5
            if writer == "confluent":
                p = confluent_producer(bootstrap, txn_id)
                p.begin_transaction()
                for m in got[start:upto]:
                    p.produce(sink, value=m.value().replace(b"-in", b"-out"), partition=0)
                p.send_offsets_to_transaction([ConfluentTP(source, 0, upto)],
                                              consumer.consumer_group_metadata(), DEADLINE_S)
                (p.commit_transaction if commit else p.abort_transaction)(DEADLINE_S)
            else:
                kp = kafka_python_producer(bootstrap, txn_id)
                kp.begin_transaction()
                for m in got[start:upto]:
                    kp.send(sink, value=m.value().replace(b"-in", b"-out"), partition=0)
                kp.send_offsets_to_transaction(
                    {KafkaPythonTP(source, 0): OffsetAndMetadata(upto, "", -1)}, group)
                (kp.commit_transaction if commit else kp.abort_transaction)()
                kp.close(timeout=5)
            committed = consumer.committed([ConfluentTP(source, 0)], timeout=10)[0].offset
            assert committed == (upto if commit else -1001)  # -1001: none committed yet
    finally:
        consumer.close()
    assert read_committed(bootstrap, sink, 1) == [b"0:%d-out" % i for i in range(10)]
