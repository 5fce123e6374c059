"""Targeted transaction faults (issue 31) on a real broker process (a one-broker ZooKeeper
cluster) behind the Kafka-protocol fault proxy:

- KAFKA-17754: an EndTxn delayed (held by the network until the client's retry went through)
  or duplicated, and a WriteTxnMarkers delayed or duplicated, that lands after the same
  producer's next transaction began must not touch that transaction: no early commit or abort,
  nothing torn, no aborted read. Transaction version 2 (KIP-890: every transaction has an epoch
  of its own, and the markers carry it, KIP-1228) guarantees it, for our client and the bare-wire
  writer. Transaction version 1 cannot tell the late request from the next one (the same
  producer id and epoch for every transaction): what it guarantees, and what not, as Kafka.
- KAFKA-17582: a copier (consume-transform-produce) of our client that rewinds to the committed
  offsets after an abort (``Consumer.seek_to_committed``) neither skips nor duplicates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import struct
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka import Producer as ConfluentProducer
from support.raw_wire import RawConnection, fetch_request, metadata_request
from support.zookeeper import require_zookeeper

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.aio import AsyncConsumer
from oncelog.harness.local_cluster import LocalCluster
from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch, decode_batch, iter_batches
from oncelog.verify.proxy import FaultProxy
from oncelog.verify.raw_writer import RawTxnWriter

pytestmark = pytest.mark.cluster

SETTINGS = {"transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "offsets.topic.replication.factor": "1", "transaction.state.log.min.isr": "1"}
NONE, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, PRODUCER_FENCED = 0, 47, 48, 90
_names = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    require_zookeeper()
    with LocalCluster(tmp_path_factory.mktemp("targeted-txn") / "cluster", 1,
                      broker_settings=SETTINGS, die_with_parent=True,
                      zookeeper_fsync=False) as c:
        yield c


ONCELOG = "oncelog"
KAFKA = pytest.param("kafka", marks=pytest.mark.kafka, id="kafka")
BOTH = [ONCELOG, KAFKA]


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> str:
    """The bootstrap address of the broker under test (``indirect`` parameter): ours, or
    Apache Kafka (the session's shared one), which behaves the same: the evidence that what
    the test expects is Kafka's behaviour (KIP-890, KIP-1228, KAFKA-17754)."""
    if getattr(request, "param", ONCELOG) == "kafka":
        return request.getfixturevalue("apache_kafka")
    return request.getfixturevalue("cluster").bootstrap_servers


@pytest.fixture
def topic(broker: str) -> str:
    name = f"t{next(_names)}-{uuid.uuid4().hex[:6]}"
    with Admin(bootstrap_servers=broker) as admin:
        admin.create_topics([NewTopic(name, 1, replication_factor=1)])
    deadline = time.monotonic() + 30
    with RawConnection(broker) as conn:  # Kafka creates topics asynchronously
        while True:
            partitions = conn.request(metadata_request([name])).topics[0].partitions
            if partitions and int(partitions[0].leader_id) >= 0:
                return name
            assert time.monotonic() < deadline, f"{name} has no leader"
            time.sleep(0.1)


@pytest.fixture
def proxy(broker: str):
    with FaultProxy(broker) as p:
        yield p


def visible(bootstrap: str, topic: str) -> list[str]:
    """What a read_committed consumer reads now: everything below the last stable offset."""
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                  auto_offset_reset="earliest", fetch_max_wait_ms=50) as c:
        end = c.end_offsets([tp], timeout=30)[tp]
        c.assign([tp])
        c.seek_to_beginning()
        out: list[str] = []
        while c.position(tp) < end:
            out += [(r.value or b"").decode() for r in c.poll(0.5)]
        return out


def last_marker(bootstrap: str, topic: str) -> tuple[int, int, bool, int]:
    """(producer id, producer epoch, commit, coordinator epoch) of the partition's last
    COMMIT/ABORT marker, read from the log."""
    deadline = time.monotonic() + 30
    with RawConnection(bootstrap) as conn:
        while True:  # the markers are written after EndTxn's answer
            found = None
            pd = conn.request(fetch_request(topic, 0, 0)).responses[0].partitions[0]
            data = pd.records or b""
            for pos, h in iter_batches(data):
                if h.is_control:
                    _, records = decode_batch(data, pos)
                    kind = struct.unpack_from(">hh", records[0].key)[1]  # 0 ABORT, 1 COMMIT
                    coordinator_epoch = struct.unpack_from(">hi", records[0].value)[1]
                    found = (h.producer_id, h.producer_epoch, kind == 1, coordinator_epoch)
            if found is not None:
                return found
            assert time.monotonic() < deadline, "no marker in the log"
            time.sleep(0.05)


def write_markers(bootstrap: str, topic: str, marker: tuple[int, int, bool, int],
                  transaction_version: int) -> int:
    """The coordinator's WriteTxnMarkers again (v2: with its transaction version)."""
    producer_id, epoch, commit, coordinator_epoch = marker
    mod = request_module(ApiKey.WRITE_TXN_MARKERS, 2)
    request = make(mod.WriteTxnMarkersRequest, markers=(make(
        mod.WritableTxnMarker, producer_id=producer_id, producer_epoch=epoch,
        transaction_result=commit, coordinator_epoch=coordinator_epoch,
        transaction_version=transaction_version,
        topics=(make(mod.WritableTxnMarkerTopic, name=topic, partition_indexes=(0,)),)),),)
    with RawConnection(bootstrap) as conn:
        response = conn.request(request)
    return int(response.markers[0].topics[0].partitions[0].error_code)


# -- KAFKA-17754, transaction version 2 --------------------------------------------------------


def find_coordinator(bootstrap: str, transactional_id: str) -> None:
    """FindCoordinator until answered (the first one creates the transaction log); the
    broker under test is a single node: its own coordinator."""
    mod = request_module(ApiKey.FIND_COORDINATOR, 4)
    request = make(mod.FindCoordinatorRequest, key_type=1, coordinator_keys=(transactional_id,))
    deadline = time.monotonic() + 30
    with RawConnection(bootstrap) as conn:
        while int(conn.request(request).coordinators[0].error_code) != NONE:
            assert time.monotonic() < deadline, "no transaction coordinator"
            time.sleep(0.1)


class OurWriter:
    """Our producer (transaction version 2) through the proxy."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.p = Producer(bootstrap_servers=bootstrap, transactional_id=f"ours-{topic}",
                          request_timeout_ms=1000, linger_ms=0)
        self.p.init_transactions(30)

    def begin(self) -> None:
        self.p.begin_transaction()

    def send(self, value: str) -> None:
        self.p.send(self.topic, value.encode(), partition=0).result(30)

    def end(self, commit: bool) -> None:
        (self.p.commit_transaction if commit else self.p.abort_transaction)(30)

    def close(self) -> None:
        self.p.close()


class RawWriter:
    """The bare-wire writer (transaction version 2 or the old protocol) through the proxy."""

    def __init__(self, bootstrap: str, topic: str, protocol: str) -> None:
        self.topic = topic
        tid = f"raw-{protocol}-{topic}"
        find_coordinator(bootstrap, tid)
        # Kafka, loaded, may refuse a first send while it verifies the partition with its
        # coordinator (KIP-890): retried as a producer would.
        self.w = RawTxnWriter(bootstrap, tid, protocol, request_timeout=1.0, send_retry_s=15.0)
        self.w.init()
        assert self.w.protocol == protocol

    def begin(self) -> None:
        self.w.begin()

    def send(self, value: str) -> None:
        outcome = self.w.send(self.topic, 0, [value])
        assert outcome == "ok", f"{outcome}: error {self.w.last_error}"

    def end(self, commit: bool) -> None:
        assert self.w.end(commit) == ("committed" if commit else "aborted")

    def close(self) -> None:
        self.w.close()


def writer(kind: str, bootstrap: str, topic: str) -> OurWriter | RawWriter:
    return OurWriter(bootstrap, topic) if kind == "ours" else RawWriter(bootstrap, topic, kind)


@pytest.mark.parametrize(("broker", "kind", "late", "first"), [
    (ONCELOG, "ours", "delayed", "commit"), (ONCELOG, "ours", "duplicated", "commit"),
    (ONCELOG, "ours", "duplicated", "abort"), (ONCELOG, "tv2", "delayed", "abort"),
    (ONCELOG, "tv2", "duplicated", "commit"), (KAFKA, "tv2", "delayed", "commit"),
    (KAFKA, "tv2", "duplicated", "abort"), (KAFKA, "ours", "duplicated", "commit")],
    indirect=["broker"])
def test_late_end_txn_leaves_the_next_transaction_alone(broker, topic, proxy, kind, late,
                                                        first):
    w = writer(kind, proxy.bootstrap_servers, topic)
    try:
        w.begin()
        w.send("t1")
        if late == "delayed":
            proxy.hold_next(ApiKey.END_TXN)  # held until after T2 began: the retry goes through
        else:
            proxy.copy_next(ApiKey.END_TXN)
        w.end(first == "commit")
        assert (proxy.held_count() if late == "delayed" else proxy.copied_count()) == 1
        w.begin()
        w.send("t2-a")  # T2 is open on the partition (and, for TV2, at the coordinator)
        if late == "delayed":
            assert proxy.release_held() == 1
            proxy.wait_idle()
        else:
            (answer,) = proxy.replay_copies()
            assert int(answer.error_code) == PRODUCER_FENCED  # T1's epoch is the past
        expected = ["t1"] if first == "commit" else []
        assert visible(broker, topic) == expected  # T2 not ended early
        w.send("t2-b")
        w.end(True)
        assert visible(broker, topic) == [*expected, "t2-a", "t2-b"]
    finally:
        w.close()


@pytest.mark.parametrize(("broker", "first"), [(ONCELOG, "commit"), (ONCELOG, "abort"),
                                               (KAFKA, "commit")], indirect=["broker"])
def test_late_write_txn_markers_leave_the_next_transaction_alone(broker, topic, first):
    """The coordinator's WriteTxnMarkers of T1, delivered again after T1 ended (a retry: taken,
    changes nothing) and once more after T2 wrote to the partition (refused: the marker's epoch
    is T2's, KAFKA-17754). Without the transaction version in the marker (WriteTxnMarkers v2,
    KIP-1228) the partition took it and ended T2's records with T1's result."""
    bootstrap = broker
    w = RawWriter(bootstrap, topic, "tv2")
    try:
        w.begin()
        w.send("t1")
        w.end(first == "commit")
        marker = last_marker(bootstrap, topic)
        assert marker[:3] == (w.w.producer_id, w.w.epoch, first == "commit")
        expected = ["t1"] if first == "commit" else []
        assert write_markers(bootstrap, topic, marker, 2) == NONE  # a retry of it: harmless
        assert visible(bootstrap, topic) == expected
        w.begin()
        w.send("t2-a")
        assert write_markers(bootstrap, topic, marker, 2) == INVALID_PRODUCER_EPOCH
        assert visible(bootstrap, topic) == expected  # T2 still open: not ended early
        w.send("t2-b")
        w.end(True)
        assert visible(bootstrap, topic) == [*expected, "t2-a", "t2-b"]
    finally:
        w.close()


# -- KAFKA-17754, transaction version 1 ---------------------------------------------------------


class ConfluentWriter:
    """confluent-kafka (librdkafka: EndTxn v1, transaction version 1) through the proxy."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.config = {"bootstrap.servers": bootstrap, "transactional.id": f"conf-{topic}",
                       "linger.ms": 0}
        self.p = ConfluentProducer(self.config)
        self.p.init_transactions(30)

    def begin(self) -> None:
        self.p.begin_transaction()

    def try_send(self, value: str) -> bool:
        errors: list[Any] = []
        self.p.produce(self.topic, value.encode(), partition=0,
                       on_delivery=lambda err, _msg: errors.append(err))
        self.p.flush(30)
        return errors == [None]

    def send(self, value: str) -> None:
        assert self.try_send(value)

    def end(self, commit: bool) -> None:
        (self.p.commit_transaction if commit else self.p.abort_transaction)(30)

    def fail_and_restart(self) -> None:
        """The transaction failed: abort (librdkafka finds the abort refused: fatal), and a new
        producer with the same transactional.id goes on."""
        try:
            self.p.abort_transaction(30)
        except KafkaException as exc:
            assert exc.args[0].fatal()  # EndTxn(abort): INVALID_TXN_STATE, T2 is over
        self.p = ConfluentProducer(self.config)
        self.p.init_transactions(30)

    def close(self) -> None:
        self.p.flush(5)


class OldRawWriter(RawWriter):
    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(bootstrap, topic, "old")

    def try_send(self, value: str) -> bool:
        return self.w.send(self.topic, 0, [value]) == "ok"

    def fail_and_restart(self) -> None:
        assert self.w.end(True) == "aborted"  # a send failed: the writer aborts
        self.w.init()


def old_writer(kind: str, bootstrap: str, topic: str) -> ConfluentWriter | OldRawWriter:
    return ConfluentWriter(bootstrap, topic) if kind == "confluent" \
        else OldRawWriter(bootstrap, topic)


@pytest.mark.parametrize(("broker", "kind"), [(ONCELOG, "old"), (ONCELOG, "confluent")],
                         indirect=["broker"])
def test_old_protocol_late_end_txn_before_the_next_transaction_is_harmless(broker, topic,
                                                                           proxy, kind):
    """Transaction version 1: a duplicated EndTxn that lands before the next transaction added
    a partition is answered (the same result: done) and ends nothing."""
    w = old_writer(kind, proxy.bootstrap_servers, topic)
    try:
        w.begin()
        w.send("t1")
        proxy.copy_next(ApiKey.END_TXN)
        w.end(True)
        (answer,) = proxy.replay_copies()
        assert int(answer.error_code) == NONE
        w.begin()
        w.send("t2")
        assert visible(broker, topic) == ["t1"]
        w.end(True)
        assert visible(broker, topic) == ["t1", "t2"]
    finally:
        w.close()


@pytest.mark.parametrize(("broker", "kind"), [(ONCELOG, "old"), (ONCELOG, "confluent"),
                                              (KAFKA, "old"), (KAFKA, "confluent")],
                         indirect=["broker"])
def test_old_protocol_cannot_tell_a_late_end_txn_from_the_next_one(broker, topic, proxy, kind):
    """Transaction version 1, as Kafka (TransactionCoordinator.endTransaction: at TV1 the
    request's epoch must equal the transaction's, which is every transaction's): T1's
    duplicated EndTxn, landing once T2 is open, commits T2 early -- KAFKA-17754, which only
    transaction version 2 avoids (KIP-890). What still holds: the writer hears of it (its next
    batch is refused, INVALID_TXN_STATE, KIP-890 part 1's verification: T2 is over), and the
    transaction after it is untouched. docs/kafka-compatibility.md."""
    w = old_writer(kind, proxy.bootstrap_servers, topic)
    try:
        w.begin()
        w.send("t1")
        proxy.copy_next(ApiKey.END_TXN)
        w.end(True)
        w.begin()
        w.send("t2-a")
        (answer,) = proxy.replay_copies()
        assert int(answer.error_code) == NONE  # taken for T2's commit
        assert visible(broker, topic) == ["t1", "t2-a"]
        assert not w.try_send("t2-b")  # verification: T2 is over
        w.fail_and_restart()  # T2-a stays committed: the protocol's limit
        w.begin()
        w.send("t3")
        w.end(True)
        assert visible(broker, topic) == ["t1", "t2-a", "t3"]
    finally:
        w.close()


@pytest.mark.parametrize("broker", BOTH, indirect=True)
def test_old_protocol_marker_cannot_be_told_from_the_next_transactions(broker, topic):
    """A WriteTxnMarkers without the transaction version (v1, or v2 with 0: an older
    coordinator, an admin tool's abort) is checked as before KIP-1228, by Kafka too: a late one
    at the epoch of the producer's open transaction ends it."""
    w = RawWriter(broker, topic, "tv2")
    try:
        w.begin()
        w.send("t1")
        w.end(True)
        marker = last_marker(broker, topic)
        w.begin()
        w.send("t2-a")
        assert write_markers(broker, topic, marker, 0) == NONE
        assert visible(broker, topic) == ["t1", "t2-a"]
    finally:
        w.close()


# -- KAFKA-17582: the copier rewinds after an abort -------------------------------------------


@pytest.mark.parametrize("mode", ["assign", "subscribe"])
def test_copier_rewinds_after_an_abort(cluster, mode):
    bootstrap = cluster.bootstrap_servers
    source, sink = f"in{next(_names)}", f"out{next(_names)}"
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(source, 1, replication_factor=1),
                             NewTopic(sink, 1, replication_factor=1)])
    values = [f"v{i}" for i in range(40)]
    with Producer(bootstrap_servers=bootstrap) as p:
        for v in values:
            p.send(source, v.encode(), partition=0)
        p.flush(30)
    tp = TopicPartition(source, 0)
    group = f"copier-{source}"
    producer = Producer(bootstrap_servers=bootstrap, transactional_id=f"copier-{source}",
                        linger_ms=0)
    consumer = Consumer(bootstrap_servers=bootstrap, group_id=group,
                        isolation_level="read_committed", enable_auto_commit=False,
                        auto_offset_reset="earliest", max_poll_records=7, fetch_max_wait_ms=50)
    aborted = 0
    try:
        producer.init_transactions(30)
        if mode == "assign":
            consumer.assign([tp])
        else:
            consumer.subscribe([source])
        for round_ in itertools.count():
            assert round_ < 200, "the copier made no progress"
            records = consumer.poll(0.5)
            if not records:
                if consumer.committed([tp], 30)[tp] == len(values):
                    break
                continue
            producer.begin_transaction()
            for r in records:
                producer.send(sink, r.value, partition=0)
            producer.send_offsets_to_transaction({tp: records[-1].offset + 1},
                                                 consumer.group_metadata())
            if round_ % 3 == 1:  # every third transaction fails and is aborted
                producer.abort_transaction(30)
                aborted += 1
                consumer.seek_to_committed()
            else:
                producer.commit_transaction(30)
    finally:
        consumer.close()
        producer.close()
    assert aborted >= 2
    assert visible(bootstrap, sink) == values  # each exactly once, in order


def test_seek_to_committed_without_a_commit_uses_auto_offset_reset(cluster):
    topic = f"s{next(_names)}"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, replication_factor=1)])
    with Producer(bootstrap_servers=cluster.bootstrap_servers) as p:
        p.send(topic, b"x", partition=0).result(30)
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=f"g-{topic}",
                  enable_auto_commit=False, auto_offset_reset="earliest") as c:
        c.assign([tp])
        c.seek(tp, 1)
        assert c.seek_to_committed() == {tp: None}
        assert c.position(tp) == 0
        c.commit({tp: 1})
        c.seek(tp, 0)
        assert c.seek_to_committed(tp) == {tp: 1}
        assert c.position(tp) == 1

    async def in_asyncio() -> None:
        async with AsyncConsumer(bootstrap_servers=cluster.bootstrap_servers,
                                 group_id=f"g-{topic}", enable_auto_commit=False,
                                 auto_offset_reset="earliest") as ac:
            ac.assign([tp])
            assert await ac.position(tp) == 1  # the committed offset
            await ac.seek(tp, 0)
            assert [r.value for r in await ac.poll(10)] == [b"x"]
            assert await ac.seek_to_committed() == {tp: 1}
            assert await ac.position(tp) == 1
            await ac.seek(tp, 0)
            assert await ac.seek_to_committed(tp) == {tp: 1}
            assert await ac.position(tp) == 1

    asyncio.run(in_asyncio())


# -- the transaction version the markers carry ---------------------------------------------------


def test_markers_say_transaction_version_2_only_when_their_epoch_is_bumped(tmp_path):
    """A transaction version 2 transaction ends with markers one epoch past it, marked version
    2 (so a late one is refused in the next transaction). The coordinator's abort of one whose
    epoch is exhausted (32766: the next one takes a new producer id) keeps its epoch: those
    markers must not claim version 2, or the partition refuses them and the transaction
    hangs there."""
    from oncelog.log import LogConfig, PartitionLog
    from oncelog.records import split_batches
    from oncelog.txn.coordinator import SendMarkers, TransactionCoordinator, WriteTxnLog

    def run(core, effects):
        out = []
        for e in effects:
            if isinstance(e, WriteTxnLog):
                out += run(core, core.write_done(e.transactional_id, True))
            elif isinstance(e, SendMarkers):
                out.append(e)
        return out

    ids = itertools.count(1000)
    core = TransactionCoordinator(allocate_producer_id=lambda: next(ids), max_timeout_ms=60_000,
                                  expiration_ms=10**9)
    core.load([])
    log = PartitionLog(tmp_path / "t-0", LogConfig(), 0)
    for txn, epoch in (("normal", 5), ("exhausted", 32766)):
        started = core.init_producer_id(txn, 1000, 0)
        run(core, started.effects)
        pid = started.producer_id
        m = core.transactions[txn]
        core.transactions[txn] = dataclasses.replace(m, producer_epoch=epoch)
        run(core, core.add_partitions(txn, pid, epoch, [("t", 0)], 0, txn_version=2).effects)
        data = bytearray(build_batch([(None, b"v", [], 0)], producer_id=pid,
                                     producer_epoch=epoch, base_sequence=0,
                                     is_transactional=True))
        log.append(data, split_batches(data), 0)
        if txn == "normal":
            (marker,) = run(core, core.end_txn(txn, pid, epoch, True, 0, version=5,
                                               txn_version=2).effects)
            assert (marker.producer_epoch, marker.transaction_version) == (epoch + 1, 2)
        else:
            (marker,) = run(core, core.abort_timed_out(10_000))
            assert (marker.producer_epoch, marker.transaction_version) == (epoch, 0)
        log.append_marker(pid, marker.producer_epoch, marker.commit, 0, 0,
                          transaction_version=marker.transaction_version)
    assert log.last_stable_offset == log.high_watermark  # nothing left open


def test_assigned_consumer_starts_at_the_committed_offsets(cluster):
    """A consumer with a group_id and assign() starts where the group committed (Kafka's
    consumer fetches the committed offsets for assigned partitions too); auto.offset.reset
    only where nothing is committed; an explicit seek_to_beginning still wins. Without it a
    copier restarted with assign() copied everything again."""
    topic = f"s{next(_names)}"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, replication_factor=1)])
    with Producer(bootstrap_servers=cluster.bootstrap_servers) as p:
        for v in (b"a", b"b", b"c"):
            p.send(topic, v, partition=0)
        p.flush(30)
    tp = TopicPartition(topic, 0)
    config = {"bootstrap_servers": cluster.bootstrap_servers, "group_id": f"g-{topic}",
              "enable_auto_commit": False, "auto_offset_reset": "earliest"}
    with Consumer(**config) as c:
        c.assign([tp])
        assert c.position(tp) == 0  # nothing committed: auto.offset.reset
        c.commit({tp: 2})
    with Consumer(**config) as c:
        c.assign([tp])
        assert [r.value for r in c.poll(10)] == [b"c"]
    with Consumer(**config) as c:
        c.assign([tp])
        assert c.position(tp) == 2
        c.seek_to_beginning()
        assert c.position(tp) == 0
