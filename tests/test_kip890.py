"""KIP-890 on the wire: the broker's defense against late messages.

Part 1 (older clients, Produce v11 and below): a transactional batch that would open its
producer's transaction on a partition is verified with the coordinator first; a late batch of a
transaction that already ended is refused (INVALID_TXN_STATE) instead of opening a hanging
transaction -- unless ``transaction.partition.verification.enable`` is off, which is how the old
protocol behaves. Part 2 (transaction version 2): the partition joins the transaction with the
first Produce v12 / TxnOffsetCommit v5, every EndTxn v5 bumps the epoch (so a late batch of the
previous transaction is fenced), a non-zero first sequence is OUT_OF_ORDER_SEQUENCE_NUMBER. Our
client uses version 2 whenever the broker finalizes it."""

from __future__ import annotations

import time

import pytest
from kio.schema.errors import ErrorCode
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    idempotent_batch,
    list_offsets_request,
)

from oncelog import Consumer, Producer
from oncelog.log import LogAppendError, LogConfig, PartitionLog
from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch, split_batches
from oncelog.server.embedded import EmbeddedBroker

TOPIC, GROUP = "kip890", "kip890-group"
INVALID_TXN_STATE, OUT_OF_ORDER = 48, 45
INVALID_PRODUCER_EPOCH, PRODUCER_FENCED = 47, 90


def broker(**config):
    cfg = {"transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2"}
    cfg.update(config)
    return EmbeddedBroker(config=cfg)


def req(api, version, cls, **fields):
    return make(getattr(request_module(api, version), cls), **fields)


def retry(fn, until, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        r = fn()
        if until(r):
            return r
        assert time.monotonic() < deadline, r
        time.sleep(0.02)


class Wire:
    """A raw transactional client of either protocol."""

    def __init__(self, conn: RawConnection, txn_id: str) -> None:
        self.conn, self.txn_id = conn, txn_id
        self.seq = 0

    def init(self, version=4):
        r = retry(lambda: self.conn.request(req(
            ApiKey.INIT_PRODUCER_ID, version, "InitProducerIdRequest",
            transactional_id=self.txn_id, transaction_timeout=60_000, producer_id=-1,
            producer_epoch=-1)), lambda r: r.error_code == 0)
        self.pid, self.epoch = r.producer_id, r.producer_epoch
        return r

    def add(self, partition=0):
        mod = request_module(ApiKey.ADD_PARTITIONS_TO_TXN, 3)
        r = self.conn.request(make(
            mod.AddPartitionsToTxnRequest, v3_and_below_transactional_id=self.txn_id,
            v3_and_below_producer_id=self.pid, v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=(make(mod.AddPartitionsToTxnTopic, name=TOPIC,
                                      partitions=(partition,)),)))
        return r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code

    def batch(self, values, epoch=None, seq=None):
        b = idempotent_batch(self.pid, self.epoch if epoch is None else epoch,
                             self.seq if seq is None else seq, values, is_transactional=True)
        if seq is None:
            self.seq += len(values)
        return b

    def produce(self, batch, version=9, partition=0, transactional_id="self"):
        mod = request_module(ApiKey.PRODUCE, version)
        pd = make(mod.PartitionProduceData, index=partition, records=batch)
        r = self.conn.request(make(
            mod.ProduceRequest, acks=-1, timeout=30_000,
            transactional_id=self.txn_id if transactional_id == "self" else transactional_id,
            topic_data=(make(mod.TopicProduceData, name=TOPIC, partition_data=(pd,)),)))
        return r.responses[0].partition_responses[0]

    def end(self, commit=True, version=3, epoch=None):
        r = retry(lambda: self.conn.request(req(
            ApiKey.END_TXN, version, "EndTxnRequest", transactional_id=self.txn_id,
            producer_id=self.pid, producer_epoch=self.epoch if epoch is None else epoch,
            committed=commit)), lambda r: r.error_code != 51)  # CONCURRENT_TRANSACTIONS
        return r

    def describe(self):
        (s,) = self.conn.request(req(ApiKey.DESCRIBE_TRANSACTIONS, 0,
                                     "DescribeTransactionsRequest",
                                     transactional_ids=(self.txn_id,))).transaction_states
        return s.transaction_state, s.producer_epoch, {
            (t.topic, p) for t in s.topics for p in t.partitions}


def offsets(conn, partition=0):
    hw = conn.request(list_offsets_request(TOPIC, partition, -1)).topics[0].partitions[0].offset
    lso = conn.request(list_offsets_request(TOPIC, partition, -1, isolation_level=1)
                       ).topics[0].partitions[0].offset
    return hw, lso


def wait_stable(conn, partition=0):
    retry(lambda: offsets(conn, partition), lambda o: o[0] == o[1])


@pytest.fixture
def setup(request):
    config = getattr(request, "param", {})
    with broker(**config) as b, RawConnection(b.bootstrap_servers) as conn:
        assert conn.request(create_topics_request(TOPIC, 2)).topics[0].error_code == 0
        yield b, conn


# -- ApiVersions ------------------------------------------------------------------------------


def _api_versions(conn):
    r = conn.request(req(ApiKey.API_VERSIONS, 3, "ApiVersionsRequest",
                         client_software_name="t", client_software_version="1"))
    return ({k.api_key: k.max_version for k in r.api_keys},
            {f.name: f.max_version_level for f in r.finalized_features})


def test_the_broker_finalizes_transaction_version_2_and_can_be_held_at_1():
    with broker() as b, RawConnection(b.bootstrap_servers) as conn:
        versions, features = _api_versions(conn)
        assert features == {"transaction.version": 2}
        assert (versions[ApiKey.PRODUCE], versions[ApiKey.END_TXN],
                versions[ApiKey.TXN_OFFSET_COMMIT], versions[ApiKey.INIT_PRODUCER_ID],
                versions[ApiKey.ADD_PARTITIONS_TO_TXN]) == (12, 5, 5, 6, 5)
    with broker(**{"transaction.version": "1"}) as b, RawConnection(b.bootstrap_servers) as conn:
        versions, features = _api_versions(conn)
        assert features == {"transaction.version": 1}
        assert (versions[ApiKey.PRODUCE], versions[ApiKey.END_TXN],
                versions[ApiKey.TXN_OFFSET_COMMIT]) == (11, 4, 4)
        # Produce v12 is then refused as any unsupported version: the connection is closed.
        w = Wire(conn, "x")
        w.pid, w.epoch = 1, 0
        with pytest.raises((ConnectionError, OSError, TimeoutError)):
            w.produce(w.batch([b"a"]), version=12)


# -- part 1: verification for older clients ---------------------------------------------------


def test_a_batch_for_a_partition_not_in_the_transaction_is_refused(setup):
    b, conn = setup
    w = Wire(conn, "v-old")
    w.init()
    r = w.produce(w.batch([b"never added"]))
    assert r.error_code == INVALID_TXN_STATE
    assert offsets(conn) == (0, 0)  # nothing written, no hanging transaction
    assert w.add() == 0
    assert w.produce(w.batch([b"a"], seq=0)).error_code == 0
    assert b.broker.txn_verifier.failures == 1 and b.broker.txn_verifier.count == 2


def test_a_late_batch_after_the_commit_is_refused(setup):
    b, conn = setup
    w = Wire(conn, "v-late")
    w.init()
    w.add()
    assert w.produce(w.batch([b"in time"])).error_code == 0
    assert w.end(commit=False).error_code == 0
    wait_stable(conn)
    hw = offsets(conn)[0]
    # The next batch of the same epoch arrives late (after the abort marker): refused.
    r = w.produce(w.batch([b"late"]))
    assert r.error_code == INVALID_TXN_STATE, r
    assert offsets(conn) == (hw, hw)


@pytest.mark.parametrize("setup", [{"transaction.partition.verification.enable": "false"}],
                         indirect=True)
def test_without_verification_a_late_batch_opens_a_hanging_transaction(setup):
    """What the old protocol allows (and why KIP-890 exists)."""
    b, conn = setup
    w = Wire(conn, "v-off")
    w.init()
    w.add()
    w.produce(w.batch([b"in time"]))
    assert w.end(commit=False).error_code == 0
    wait_stable(conn)
    r = w.produce(w.batch([b"late"]))
    assert r.error_code == 0
    hw, lso = offsets(conn)
    assert lso == r.base_offset < hw  # the LSO is stuck: read_committed readers stop here
    assert w.describe()[0] == "CompleteAbort"  # and the coordinator knows nothing of it
    assert b.broker.txn_verifier.count == 0


def test_the_race_with_a_marker_written_after_the_answer_is_closed(tmp_path):
    """A marker between the coordinator's answer and the append drops the guard."""
    log = PartitionLog(tmp_path, LogConfig(), 0)
    state = log.producer_state
    guard = state.start_verification(7, 0)
    log.append_marker(7, 0, False, 0, 1_000)  # the transaction ended meanwhile
    data = bytearray(build_batch([(None, b"late", [], 1_000)], producer_id=7, producer_epoch=0,
                                 base_sequence=0, is_transactional=True))
    with pytest.raises(LogAppendError) as exc:
        log.append(data, split_batches(data), 1_000, verification=guard,
                   require_verification=True)
    assert exc.value.error_name == ErrorCode.invalid_txn_state
    # A fresh verification (the coordinator said yes again) lets it through, once.
    guard = state.start_verification(7, 0)
    log.append(data, split_batches(data), 1_000, verification=guard, require_verification=True)
    assert not state.needs_verification(7, 0)
    log.close(1_000)


def test_txn_offset_commit_of_an_older_client_is_verified(setup):
    b, conn = setup
    w = Wire(conn, "v-offsets")
    w.init()
    w.add()
    mod = request_module(ApiKey.TXN_OFFSET_COMMIT, 3)

    def commit():
        r = conn.request(make(
            mod.TxnOffsetCommitRequest, transactional_id=w.txn_id, group_id=GROUP,
            producer_id=w.pid, producer_epoch=w.epoch, generation_id=-1, member_id="",
            group_instance_id=None, topics=(make(mod.TxnOffsetCommitRequestTopic, name=TOPIC,
                                                 partitions=(make(
                mod.TxnOffsetCommitRequestPartition, partition_index=0, committed_offset=5,
                committed_leader_epoch=-1, committed_metadata=""),)),)))
        return r.topics[0].partitions[0].error_code

    assert commit() == INVALID_TXN_STATE  # no AddOffsetsToTxn first
    assert conn.request(req(ApiKey.ADD_OFFSETS_TO_TXN, 3, "AddOffsetsToTxnRequest",
                            transactional_id=w.txn_id, producer_id=w.pid,
                            producer_epoch=w.epoch, group_id=GROUP)).error_code == 0
    assert commit() == 0


# -- part 2: transaction version 2 -------------------------------------------------------------


def test_produce_v12_adds_the_partition_and_end_txn_v5_bumps_the_epoch(setup):
    b, conn = setup
    w = Wire(conn, "tv2")
    w.init(version=5)
    assert w.produce(w.batch([b"a", b"b"]), version=12).error_code == 0
    assert w.produce(w.batch([b"c"], seq=0), version=12, partition=1).error_code == 0
    state, epoch, parts = w.describe()
    assert (state, epoch, parts) == ("Ongoing", 0, {(TOPIC, 0), (TOPIC, 1)})
    r = w.end(commit=True, version=5)
    assert (r.error_code, r.producer_id, r.producer_epoch) == (0, w.pid, 1)
    wait_stable(conn)
    # A late batch of epoch 0 is fenced by the markers' epoch 1 ...
    assert w.produce(w.batch([b"late"]), version=12).error_code == INVALID_PRODUCER_EPOCH
    # ... while the next transaction starts at sequence 0 of epoch 1.
    w.epoch, w.seq = 1, 0
    assert w.produce(w.batch([b"next"], seq=3), version=12).error_code == OUT_OF_ORDER
    assert w.produce(w.batch([b"next"]), version=12).error_code == 0
    assert w.describe()[:2] == ("Ongoing", 1)
    # A retried EndTxn of the earlier transaction is not taken for this one.
    assert w.end(commit=True, version=5, epoch=0).error_code == PRODUCER_FENCED
    r = w.end(commit=False, version=5)
    assert (r.error_code, r.producer_epoch) == (0, 2)


def test_a_nonzero_first_sequence_of_an_idempotent_producer_is_accepted(setup):
    """Kafka (ProducerAppendInfo.checkSequence): a producer the partition does not know is
    taken at any sequence; only a transaction version 2 producer's transactional batch, whose
    partition was verified, must start at 0. Not refused with UNKNOWN_PRODUCER_ID either: that
    is fatal to librdkafka's idempotent producer, whose first batch may have died with a
    leader."""
    b, conn = setup
    w = Wire(conn, "seq")
    w.pid, w.epoch = conn.request(req(ApiKey.INIT_PRODUCER_ID, 4, "InitProducerIdRequest",
                                      transactional_id=None, transaction_timeout=60_000,
                                      producer_id=-1, producer_epoch=-1)).producer_id, 0
    assert w.produce(idempotent_batch(w.pid, 0, 5, [b"x"]), version=12,
                     transactional_id=None).error_code == 0
    assert w.produce(idempotent_batch(w.pid, 0, 7, [b"x"]), version=11,
                     transactional_id=None).error_code == OUT_OF_ORDER  # known now: a gap


def test_txn_offset_commit_v5_adds_the_offsets_partition(setup):
    b, conn = setup
    w = Wire(conn, "tv2-offsets")
    w.init(version=5)
    mod = request_module(ApiKey.TXN_OFFSET_COMMIT, 5)
    r = conn.request(make(
        mod.TxnOffsetCommitRequest, transactional_id=w.txn_id, group_id=GROUP,
        producer_id=w.pid, producer_epoch=w.epoch, generation_id=-1, member_id="",
        group_instance_id=None, topics=(make(mod.TxnOffsetCommitRequestTopic, name=TOPIC,
                                             partitions=(make(
            mod.TxnOffsetCommitRequestPartition, partition_index=0, committed_offset=5,
            committed_leader_epoch=-1, committed_metadata=""),)),)))
    assert r.topics[0].partitions[0].error_code == 0
    assert any(t == "__consumer_offsets" for t, _ in w.describe()[2])


# -- our client ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tv", [2, 1])
def test_our_client_uses_version_2_when_offered(tv):
    with broker(**{"transaction.version": str(tv)}) as b:
        with RawConnection(b.bootstrap_servers) as conn:
            assert conn.request(create_topics_request(TOPIC, 2)).topics[0].error_code == 0
        p = Producer(bootstrap_servers=b.bootstrap_servers, transactional_id=f"ours-{tv}",
                     linger_ms=0)
        try:
            p.init_transactions(10)
            assert p._txn.transaction_v2 == (tv == 2)
            epochs = []
            for i in range(3):
                p.begin_transaction()
                p.send(TOPIC, f"v{i}".encode(), partition=i % 2)
                (p.commit_transaction if i != 1 else p.abort_transaction)(10)
                epochs.append(p._txn.producer_epoch)
            assert epochs == ([1, 2, 3] if tv == 2 else [0, 0, 0])
            verifications = b.broker.txn_verifier.count
            # Version 2: the leader added each partition (3 transactions); version 1 verified
            # nothing (the client added the partitions itself, the batches were checked).
            assert verifications == 3
        finally:
            p.close()
        c = Consumer(bootstrap_servers=b.bootstrap_servers, isolation_level="read_committed",
                     auto_offset_reset="earliest", enable_auto_commit=False)
        try:
            c.assign([(TOPIC, 0), (TOPIC, 1)])
            seen = []
            deadline = time.monotonic() + 10
            while len(seen) < 2 and time.monotonic() < deadline:
                seen += [r.value for r in c.poll(0.5)]
            assert sorted(seen) == [b"v0", b"v2"]
        finally:
            c.close()


def test_coordinator_errors_become_what_each_kind_of_client_handles():
    """KIP-890: retriable coordinator errors become NOT_ENOUGH_REPLICAS for produce (every
    client retries it) and COORDINATOR_NOT_AVAILABLE for TxnOffsetCommit; a transaction that
    cannot take the partition is INVALID_TXN_STATE for older clients and TRANSACTION_ABORTABLE
    for clients of version 2, which abort and go on."""
    from oncelog.errors import AbortableError, TransactionAbortableError, error_for_code
    from oncelog.server.txn_verification import offset_commit_error, produce_error

    for busy in (ErrorCode.concurrent_transactions, ErrorCode.coordinator_load_in_progress,
                 ErrorCode.coordinator_not_available, ErrorCode.not_coordinator):
        assert produce_error(busy, False)[0] == produce_error(busy, True)[0] == \
            ErrorCode.not_enough_replicas
        assert offset_commit_error(busy) == ErrorCode.coordinator_not_available
    assert produce_error(ErrorCode.invalid_txn_state, False)[0] == ErrorCode.invalid_txn_state
    assert produce_error(ErrorCode.invalid_txn_state, True)[0] == ErrorCode.transaction_abortable
    assert produce_error(ErrorCode.producer_fenced, True)[0] == ErrorCode.invalid_producer_epoch
    assert produce_error(ErrorCode.invalid_producer_id_mapping, True)[0] == \
        ErrorCode.invalid_producer_id_mapping
    assert issubclass(error_for_code(120), AbortableError)
    assert error_for_code(120) is TransactionAbortableError
