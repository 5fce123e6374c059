"""A producer's send_batch adds every partition of the call to its transaction in one
AddPartitionsToTxn (TransactionManager.maybe_add_partitions), as the Java client adds all new
partitions of a drain at once: the manager against the coordinator core, in memory."""

from __future__ import annotations

from support.inmemory import InMemoryBroker, TxnManagerPair

from oncelog.client.types import TopicPartition
from oncelog.protocol import ApiKey

TXN = "pair-txn"


def adds(broker: InMemoryBroker) -> int:
    return [e[0] for e in broker.exchanges].count(ApiKey.ADD_PARTITIONS_TO_TXN)


def test_many_partitions_join_in_one_request_and_known_ones_in_none():
    broker = InMemoryBroker(transaction_version=1)
    pair = TxnManagerPair(broker)
    m = pair.manager
    pair.run(m.initialize(pair.deadline()))
    m.begin_transaction()
    pair.run(m.maybe_add_partition(TopicPartition("a", 0), pair.deadline()))
    assert adds(broker) == 1
    tps = [TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("a", 2),
           TopicPartition("b", 0)]
    pair.run(m.maybe_add_partitions(tps, pair.deadline()))
    assert adds(broker) == 2  # one request for the three new ones
    assert broker.core.describe(TXN).partitions == {("a", 0), ("a", 1), ("a", 2), ("b", 0)}
    assert m.partitions == set(tps)
    assert m.maybe_add_partitions(tps, pair.deadline()) is None  # all in already
    assert adds(broker) == 2


def test_transaction_version_2_adds_them_without_a_request():
    broker = InMemoryBroker(transaction_version=2)
    pair = TxnManagerPair(broker)
    m = pair.manager
    pair.run(m.initialize(pair.deadline()))
    m.begin_transaction()
    tps = [TopicPartition("a", p) for p in range(5)]
    assert m.maybe_add_partitions(tps, pair.deadline()) is None
    assert m.partitions == set(tps) and adds(broker) == 0
