"""Spec 000's "Data Flow", step by step over the raw wire, each step's effect checked through
the broker's public RPCs (DescribeTransactions, DescribeProducers, ListOffsets, Fetch,
OffsetFetch): 1 FindCoordinator, 2 InitProducerId, 3 (the client begins), 4.1
AddPartitionsToTxn, 4.2 Produce, 4.3 AddOffsetsToTxn, 4.4 TxnOffsetCommit, 5.1 EndTxn, 5.2
WriteTxnMarkers (the coordinator's), 5.3 the final CompleteCommit/CompleteAbort."""

from __future__ import annotations

import time

import pytest
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    fetch_request,
    idempotent_batch,
    list_offsets_request,
    produce,
)

from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import decode_batch, iter_batches
from oncelog.records.batch import parse_control_record
from oncelog.server.embedded import EmbeddedBroker
from oncelog.server.topics import coordinator_partition

TOPIC, GROUP = "flow", "flow-group"
OFFSETS_PARTITIONS = 5
UNSTABLE_OFFSET_COMMIT = 88


@pytest.fixture
def conn():
    with EmbeddedBroker(config={"transaction.state.log.num.partitions": "3",
                                "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS)}) as b, \
            RawConnection(b.bootstrap_servers) as c:
        assert c.request(create_topics_request(TOPIC, 2)).topics[0].error_code == 0
        yield c


def req(api: ApiKey, version: int, cls: str, **fields):
    mod = request_module(api, version)
    return mod, make(getattr(mod, cls), **fields)


def call(conn, api: ApiKey, version: int, cls: str, **fields):
    _mod, r = req(api, version, cls, **fields)
    return conn.request(r)


def retry(fn, *, until, timeout=10.0):
    """Call ``fn`` until ``until(result)``: the coordinator answers CONCURRENT_TRANSACTIONS or
    COORDINATOR_LOAD_IN_PROGRESS while it is busy, as clients expect to retry."""
    deadline = time.monotonic() + timeout
    while True:
        result = fn()
        if until(result):
            return result
        assert time.monotonic() < deadline, result
        time.sleep(0.02)


def describe(conn, txn_id):
    r = call(conn, ApiKey.DESCRIBE_TRANSACTIONS, 0, "DescribeTransactionsRequest",
             transactional_ids=(txn_id,))
    (state,) = r.transaction_states
    assert state.error_code == 0, state
    topics = {(t.topic, p) for t in state.topics for p in t.partitions}
    return state.transaction_state, state.producer_id, state.producer_epoch, topics


def producers(conn, partition):
    mod, r = req(ApiKey.DESCRIBE_PRODUCERS, 0, "DescribeProducersRequest", topics=())
    r = make(mod.DescribeProducersRequest,
             topics=(make(mod.TopicRequest, name=TOPIC, partition_indexes=(partition,)),))
    (p,) = conn.request(r).topics[0].partitions
    return {s.producer_id: s.current_txn_start_offset for s in p.active_producers}


def read_committed_end(conn, partition):
    r = conn.request(list_offsets_request(TOPIC, partition, -1, isolation_level=1))
    return r.topics[0].partitions[0].offset


def offset_fetch(conn, require_stable):
    mod = request_module(ApiKey.OFFSET_FETCH, 7)
    r = conn.request(make(mod.OffsetFetchRequest, group_id=GROUP, require_stable=require_stable,
                          topics=(make(mod.OffsetFetchRequestTopic, name=TOPIC,
                                       partition_indexes=(0,)),)))
    if r.error_code:
        return r.error_code, None
    p = r.topics[0].partitions[0]
    return p.error_code, p.committed_offset


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_every_step_of_the_data_flow(conn, commit):
    txn_id = f"flow-{commit}"
    # 1. FindCoordinator: this broker, and the transaction log exists.
    r = call(conn, ApiKey.FIND_COORDINATOR, 3, "FindCoordinatorRequest", key=txn_id,
             key_type=1)
    assert r.error_code == 0 and r.node_id == 1
    # 2. InitProducerId: a producer id, epoch 0, an Empty transaction.
    r = retry(lambda: call(conn, ApiKey.INIT_PRODUCER_ID, 4, "InitProducerIdRequest",
                           transactional_id=txn_id, transaction_timeout=60_000,
                           producer_id=-1, producer_epoch=-1),
              until=lambda r: r.error_code == 0)
    pid, epoch = r.producer_id, r.producer_epoch
    assert epoch == 0 and describe(conn, txn_id) == ("Empty", pid, 0, set())
    # 3. beginTransaction is local to the producer: nothing changes on the broker.
    # 4.1 AddPartitionsToTxn: the transaction is Ongoing, with both partitions.
    mod = request_module(ApiKey.ADD_PARTITIONS_TO_TXN, 3)
    r = conn.request(make(mod.AddPartitionsToTxnRequest, v3_and_below_transactional_id=txn_id,
                          v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                          v3_and_below_topics=(make(mod.AddPartitionsToTxnTopic, name=TOPIC,
                                                    partitions=(0, 1)),)))
    assert [p.partition_error_code for t in r.results_by_topic_v3_and_below
            for p in t.results_by_partition] == [0, 0]
    assert describe(conn, txn_id) == ("Ongoing", pid, 0, {(TOPIC, 0), (TOPIC, 1)})
    # 4.2 Produce: the partitions hold the data; the LSO stays at the transaction's start.
    for partition in (0, 1):
        assert produce(conn, TOPIC, partition, idempotent_batch(
            pid, epoch, 0, [b"p%d-a" % partition, b"p%d-b" % partition],
            is_transactional=True)).error_code == 0
        assert producers(conn, partition) == {pid: 0}
        assert read_committed_end(conn, partition) == 0
    # 4.3 AddOffsetsToTxn: the group's __consumer_offsets partition joins the transaction.
    r = call(conn, ApiKey.ADD_OFFSETS_TO_TXN, 3, "AddOffsetsToTxnRequest",
             transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, group_id=GROUP)
    assert r.error_code == 0
    offsets_tp = ("__consumer_offsets", coordinator_partition(GROUP, OFFSETS_PARTITIONS))
    assert offsets_tp in describe(conn, txn_id)[3]
    # 4.4 TxnOffsetCommit: pending, so invisible, and unstable for require_stable.
    mod = request_module(ApiKey.TXN_OFFSET_COMMIT, 3)
    r = conn.request(make(
        mod.TxnOffsetCommitRequest, transactional_id=txn_id, group_id=GROUP, producer_id=pid,
        producer_epoch=epoch, generation_id=-1, member_id="", group_instance_id=None,
        topics=(make(mod.TxnOffsetCommitRequestTopic, name=TOPIC, partitions=(
            make(mod.TxnOffsetCommitRequestPartition, partition_index=0, committed_offset=42,
                 committed_leader_epoch=-1, committed_metadata=""),)),)))
    assert r.topics[0].partitions[0].error_code == 0
    assert offset_fetch(conn, require_stable=True)[0] == UNSTABLE_OFFSET_COMMIT
    assert offset_fetch(conn, require_stable=False) == (0, -1)
    # 5.1 EndTxn: PrepareCommit / PrepareAbort is written; the answer comes back.
    r = call(conn, ApiKey.END_TXN, 3, "EndTxnRequest", transactional_id=txn_id,
             producer_id=pid, producer_epoch=epoch, committed=commit)
    assert r.error_code == 0
    # 5.2 markers land on every partition, 5.3 the transaction completes.
    final = "CompleteCommit" if commit else "CompleteAbort"
    retry(lambda: describe(conn, txn_id), until=lambda d: d[0] == final)
    for partition in (0, 1):
        assert read_committed_end(conn, partition) == 3  # two records and the marker
        assert producers(conn, partition) == {pid: -1}
        pd = conn.request(fetch_request(TOPIC, partition, 0, isolation_level=1)
                          ).responses[0].partitions[0]
        data = pd.records
        batches = [decode_batch(data, pos) for pos, _ in iter_batches(data)]
        (h, (marker,)) = batches[-1]
        assert h.is_control and parse_control_record(marker)[0] == (1 if commit else 0)
        aborted = [(a.producer_id, a.first_offset) for a in pd.aborted_transactions]
        assert aborted == ([] if commit else [(pid, 0)])
    assert offset_fetch(conn, require_stable=True) == (0, 42 if commit else -1)
    # A retried EndTxn that already completed the same way succeeds; the other way does not.
    r = call(conn, ApiKey.END_TXN, 3, "EndTxnRequest", transactional_id=txn_id,
             producer_id=pid, producer_epoch=epoch, committed=commit)
    assert r.error_code == 0
    r = call(conn, ApiKey.END_TXN, 3, "EndTxnRequest", transactional_id=txn_id,
             producer_id=pid, producer_epoch=epoch, committed=not commit)
    assert r.error_code == 48  # INVALID_TXN_STATE
