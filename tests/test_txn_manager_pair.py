"""The client's transaction manager against the broker's transaction coordinator core, in
memory (tests/support/inmemory.py): no sockets, no threads, no sleeps. Each test calls the
manager's sans-IO API (what the producer's blocking calls are made of), lets the pair carry the
requests, and checks both sides: the manager's state and the coordinator's."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode
from support.inmemory import InMemoryBroker, TxnManagerPair

from oncelog.client.errors import KafkaTimeoutError, TransactionError
from oncelog.client.producer.transaction_manager import PreparedTxnState, TxnState
from oncelog.client.types import TopicPartition
from oncelog.errors import ConcurrentTransactionsError, ProducerFencedError
from oncelog.protocol import ApiKey
from oncelog.txn.state import TransactionState

T = TxnState
TXN = "pair-txn"


def _init(pair: TxnManagerPair) -> None:
    pair.run(pair.manager.initialize(pair.deadline()))


def _add(pair: TxnManagerPair, *tps: tuple[str, int]) -> None:
    """Add partitions as the producer does before a partition's first batch; with transaction
    version 2 the partition leader adds them when the batch arrives."""
    m = pair.manager
    for topic, p in tps:
        pair.run(m.maybe_add_partition(TopicPartition(topic, p), pair.deadline()))
        if pair.transaction_v2:
            assert pair.broker.produce(TXN, m.producer_id, m.producer_epoch, (topic, p)) is None


def _end(pair: TxnManagerPair, commit: bool) -> None:
    pair.run(pair.manager.begin_end(commit, pair.manager.state, pair.deadline()))


def _coordinator_state(broker: InMemoryBroker, txn_id: str = TXN) -> TransactionState:
    m = broker.core.describe(txn_id)
    assert m is not None
    return m.state


@pytest.mark.parametrize("tv", [1, 2])
def test_init_begin_add_commit(tv):
    broker = InMemoryBroker(transaction_version=tv)
    pair = TxnManagerPair(broker)
    m = pair.manager
    _init(pair)
    assert m.state == T.READY and m.producer_id >= 0 and m.producer_epoch == 0
    assert pair.producer == (m.producer_id, 0)  # the sender stamps its batches with these
    assert pair.transaction_v2 == (tv == 2)

    m.begin_transaction()
    _add(pair, ("t", 0), ("t", 1), ("t", 0))
    assert _coordinator_state(broker) == TransactionState.ONGOING
    assert broker.core.describe(TXN).partitions == {("t", 0), ("t", 1)}
    if tv == 1:  # one AddPartitionsToTxn per new partition, none for one already in
        assert [e[0] for e in broker.exchanges].count(ApiKey.ADD_PARTITIONS_TO_TXN) == 2
    else:
        assert ApiKey.ADD_PARTITIONS_TO_TXN not in [e[0] for e in broker.exchanges]

    pid = m.producer_id
    _end(pair, commit=True)
    assert m.state == T.READY
    assert _coordinator_state(broker) == TransactionState.COMPLETE_COMMIT
    (markers,) = broker.markers
    assert markers.commit and markers.partitions == {("t", 0), ("t", 1)}
    # KIP-890: transaction version 2 bumps the epoch with every EndTxn; version 1 does not.
    assert (m.producer_id, m.producer_epoch) == (pid, 1 if tv == 2 else 0)
    assert pair.producer == (m.producer_id, m.producer_epoch)


@pytest.mark.parametrize("tv", [1, 2])
def test_abort_and_a_next_transaction(tv):
    broker = InMemoryBroker(transaction_version=tv)
    pair = TxnManagerPair(broker)
    m = pair.manager
    _init(pair)
    m.begin_transaction()
    _add(pair, ("t", 0))
    _end(pair, commit=False)
    assert m.state == T.READY
    assert _coordinator_state(broker) == TransactionState.COMPLETE_ABORT
    assert [mk.commit for mk in broker.markers] == [False]

    m.begin_transaction()
    _add(pair, ("t", 2))
    _end(pair, commit=True)
    assert [(mk.commit, set(mk.partitions)) for mk in broker.markers] == \
        [(False, {("t", 0)}), (True, {("t", 2)})]


def test_a_transaction_that_touched_nothing_ends_without_a_request():
    broker = InMemoryBroker(transaction_version=1)
    pair = TxnManagerPair(broker)
    _init(pair)
    pair.manager.begin_transaction()
    before = len(broker.exchanges)
    _end(pair, commit=True)
    assert pair.manager.state == T.READY and len(broker.exchanges) == before


def test_offsets_join_the_transaction():
    broker = InMemoryBroker(transaction_version=1)
    pair = TxnManagerPair(broker)
    m = pair.manager
    _init(pair)
    m.begin_transaction()
    pair.run(m.add_offsets({TopicPartition("in", 0): 42}, "the-group", pair.deadline()))
    apis = [e[0] for e in broker.exchanges]
    # AddOffsetsToTxn to the transaction's coordinator, then the group's coordinator is
    # found, then TxnOffsetCommit to it.
    assert apis[-3:] == [ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.FIND_COORDINATOR,
                         ApiKey.TXN_OFFSET_COMMIT]
    assert broker.txn_offsets == [("the-group", m.producer_id, {("in", 0): 42})]
    _end(pair, commit=True)
    assert broker.markers[-1].partitions == {("__consumer_offsets", 0)}


def test_a_second_manager_with_the_same_id_fences_the_first():
    broker = InMemoryBroker(transaction_version=1)
    first, second = TxnManagerPair(broker), TxnManagerPair(broker)
    _init(first)
    first.manager.begin_transaction()
    _add(first, ("t", 0))
    epoch = first.manager.producer_epoch

    # The coordinator aborts the first one's open transaction with a bumped epoch and answers
    # CONCURRENT_TRANSACTIONS until that is done; the second retries, then gets the next epoch.
    _init(second)
    assert second.manager.state == T.READY
    assert second.manager.producer_id == first.manager.producer_id
    assert second.manager.producer_epoch == epoch + 2
    errors = [e[2] for e in broker.exchanges if e[0] == ApiKey.INIT_PRODUCER_ID]
    assert errors[1:] == [ErrorCode.concurrent_transactions, None]
    assert [mk.commit for mk in broker.markers] == [False]

    # The first one is a zombie now: fenced for good, every later call says so.
    with pytest.raises(ProducerFencedError):
        first.run(first.manager.maybe_add_partition(TopicPartition("t", 1), first.deadline()))
    assert first.manager.state == T.FATAL_ERROR
    with pytest.raises(ProducerFencedError):
        first.manager.begin_end(True, T.IN_TRANSACTION, first.deadline())
    with pytest.raises(ProducerFencedError):
        first.manager.begin_transaction()

    second.manager.begin_transaction()
    _add(second, ("t", 1))
    _end(second, commit=True)
    assert _coordinator_state(broker) == TransactionState.COMPLETE_COMMIT


@pytest.mark.parametrize("tv", [1, 2])
def test_concurrent_transactions_is_retried_after_a_backoff(tv):
    # The markers of a commit take 0.3 s to be written: until then the coordinator answers
    # the next transaction's requests with CONCURRENT_TRANSACTIONS.
    broker = InMemoryBroker(transaction_version=tv, marker_delay_s=0.3)
    pair = TxnManagerPair(broker, retry_backoff_ms=100, retry_backoff_max_ms=1000)
    m = pair.manager
    _init(pair)
    m.begin_transaction()
    _add(pair, ("t", 0))
    _end(pair, commit=True)  # answered once PrepareCommit is written
    assert _coordinator_state(broker) == TransactionState.PREPARE_COMMIT
    started = broker.now

    m.begin_transaction()
    pair.run(m.add_offsets({TopicPartition("in", 0): 7}, "g", pair.deadline()))
    busy = [e for e in broker.exchanges if e[2] == ErrorCode.concurrent_transactions]
    assert busy, "the coordinator was still busy with the last transaction"
    # Backed off, not hammered: 0.3 s of markers took only a handful of attempts.
    assert 1 <= len(busy) <= 4
    assert broker.now - started >= 0.3
    assert broker.markers[0].commit
    assert broker.txn_offsets[-1][2] == {("in", 0): 7}
    _end(pair, commit=True)
    broker.advance(0.3)  # its markers too take their time
    assert _coordinator_state(broker) == TransactionState.COMPLETE_COMMIT


def test_a_coordinator_busy_past_the_deadline_times_out_and_the_call_can_be_made_again():
    broker = InMemoryBroker(transaction_version=1, marker_delay_s=60)
    pair = TxnManagerPair(broker)
    m = pair.manager
    _init(pair)
    m.begin_transaction()
    _add(pair, ("t", 0))
    _end(pair, commit=True)
    m.begin_transaction()
    with pytest.raises(KafkaTimeoutError, match="did not complete in time"):
        pair.run(m.maybe_add_partition(TopicPartition("t", 1), pair.deadline(5)))
    assert m.state == T.IN_TRANSACTION  # nothing broke: the partition can be asked for again
    broker.advance(60)  # the markers are written
    _add(pair, ("t", 1))
    assert broker.core.describe(TXN).partitions == {("t", 1)}


def test_a_lost_batch_makes_the_abort_bump_the_epoch():
    """KIP-360 with transaction version 1: after a batch's sequence is lost, the abort is
    followed by InitProducerId with the current producer id and epoch, which bumps it."""
    broker = InMemoryBroker(transaction_version=1)
    pair = TxnManagerPair(broker)
    m = pair.manager
    _init(pair)
    m.begin_transaction()
    _add(pair, ("t", 0))
    pid, epoch = m.producer_id, m.producer_epoch
    m.sequence_lost(ConcurrentTransactionsError("a batch expired"))
    m.send_failed(ConcurrentTransactionsError("a batch expired"))
    with pytest.raises(TransactionError):
        m.begin_end(True, T.IN_TRANSACTION, pair.deadline())
    _end(pair, commit=False)
    assert m.state == T.READY and (m.producer_id, m.producer_epoch) == (pid, epoch + 1)
    assert pair.producer == (pid, epoch + 1)
    assert [e[0] for e in broker.exchanges][-2:] == [ApiKey.END_TXN, ApiKey.INIT_PRODUCER_ID]


def test_two_phase_commit_keeps_a_prepared_transaction_for_the_next_incarnation():
    broker = InMemoryBroker(transaction_version=2, two_phase_commit=True)
    first = TxnManagerPair(broker, transaction_two_phase_commit_enable=True)
    _init(first)
    first.manager.begin_transaction()
    _add(first, ("t", 0))
    prepared = first.manager.prepare(None)
    assert first.manager.state == T.PREPARED

    # A restart: the next incarnation keeps the prepared transaction and completes it.
    second = TxnManagerPair(broker, transaction_two_phase_commit_enable=True)
    second.run(second.manager.initialize(second.deadline(), keep_prepared_txn=True))
    assert second.manager.state == T.PREPARED
    assert second.manager.prepared == prepared == PreparedTxnState(str(prepared))
    _end(second, commit=True)
    assert second.manager.state == T.READY
    assert _coordinator_state(broker) == TransactionState.COMPLETE_COMMIT
    assert [(mk.commit, set(mk.partitions)) for mk in broker.markers] == [(True, {("t", 0)})]


def test_the_next_transaction_after_a_kept_one_waits_for_its_markers():
    """The kept transaction's markers carry its own epoch, the new incarnation holds a newer
    one: a write of the next transaction that arrives while they go out is told to retry
    (CONCURRENT_TRANSACTIONS), not fenced."""
    broker = InMemoryBroker(transaction_version=2, two_phase_commit=True, marker_delay_s=0.2)
    first = TxnManagerPair(broker, transaction_two_phase_commit_enable=True)
    _init(first)
    first.manager.begin_transaction()
    _add(first, ("t", 0))
    first.manager.prepare(None)
    second = TxnManagerPair(broker, transaction_two_phase_commit_enable=True)
    second.run(second.manager.initialize(second.deadline(), keep_prepared_txn=True))
    m = second.manager
    _end(second, commit=True)
    assert _coordinator_state(broker) == TransactionState.PREPARE_COMMIT
    m.begin_transaction()
    second.run(m.maybe_add_partition(TopicPartition("t", 1), second.deadline()))
    pid, epoch = m.producer_id, m.producer_epoch
    assert broker.produce(TXN, pid, epoch, ("t", 1)) == ErrorCode.concurrent_transactions
    broker.advance(0.2)  # the markers are written
    assert broker.produce(TXN, pid, epoch, ("t", 1)) is None
    _end(second, commit=True)
    broker.advance(0.2)
    assert [(mk.commit, set(mk.partitions)) for mk in broker.markers] == \
        [(True, {("t", 0)}), (True, {("t", 1)})]
