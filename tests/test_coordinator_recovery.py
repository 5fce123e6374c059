"""Spec 001 failure scenario 5 (transaction coordinator failure) on a single node: the broker
dies after the coordinator wrote PrepareCommit (or PrepareAbort) and before the markers and
CompleteCommit. After the restart the coordinator replays its log, rolls the transaction
forward, and read_committed consumers see it (or, aborted, never see it).

The markers follow PrepareCommit within microseconds, too soon to SIGKILL in between, so the
test builds that exact on-disk state: the transaction's data is written through a real broker,
which is then SIGKILLed, and the PrepareCommit record the coordinator would have written next is
appended to its __transaction_state partition with the coordinator's own record format and log
code, as the dead broker would have left it."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from support.transactions import read_committed

from oncelog import Admin, NewTopic, Producer, TopicPartition
from oncelog.harness.broker_process import BrokerProcess
from oncelog.log import LogConfig, PartitionLog
from oncelog.records import build_batch, split_batches
from oncelog.server.topics import TRANSACTION_STATE, coordinator_partition
from oncelog.txn.log_format import encode_key, encode_value
from oncelog.txn.state import TransactionState

pytestmark = pytest.mark.slow

TXN_PARTITIONS = 3
SETTINGS = {"transaction.state.log.num.partitions": str(TXN_PARTITIONS)}
TOPIC = "recovery"


def _append_prepare(data_dir: Path, txn_id: str, description, state: TransactionState) -> None:
    """What the coordinator appends for EndTxn (spec 000 step 5.1), here by hand."""
    from oncelog.txn.state import TransactionMetadata

    m = TransactionMetadata(txn_id, description.producer_id, description.producer_epoch,
                            description.timeout_ms, TransactionState.ONGOING,
                            frozenset(description.partitions), description.start_ms or 0,
                            int(time.time() * 1000))
    m = replace(m, state=state)
    now = int(time.time() * 1000)
    index = coordinator_partition(txn_id, TXN_PARTITIONS)
    plog = PartitionLog(data_dir / f"{TRANSACTION_STATE}-{index}", LogConfig(), now)
    batch = bytearray(build_batch([(encode_key(txn_id), encode_value(m), (), now)]))
    plog.append(batch, split_batches(batch), now)
    plog.close_unclean()  # as a crash would leave it


@pytest.mark.parametrize("state", [TransactionState.PREPARE_COMMIT,
                                   TransactionState.PREPARE_ABORT], ids=["commit", "abort"])
def test_a_prepared_transaction_is_rolled_forward_after_a_crash(tmp_path, state):
    data_dir = tmp_path / "data"
    with BrokerProcess(data_dir, settings=SETTINGS) as broker:
        bs = broker.bootstrap_servers
        with Admin(bootstrap_servers=bs) as admin:
            admin.create_topics([NewTopic(TOPIC, num_partitions=2)])
        producer = Producer(bootstrap_servers=bs, transactional_id="recover-me")
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(6):
            producer.send(TOPIC, b"r%d" % i, partition=i % 2)
        producer.flush()
        with Admin(bootstrap_servers=bs) as admin:
            description = admin.describe_transactions(["recover-me"])["recover-me"]
        assert description.state == "Ongoing" and len(description.partitions) == 2
        broker.kill()
        producer.close(timeout=0)
        _append_prepare(data_dir, "recover-me", description, state)
        broker.start()
        deadline = time.monotonic() + 30
        final = "CompleteCommit" if state == TransactionState.PREPARE_COMMIT else \
            "CompleteAbort"
        with Admin(bootstrap_servers=bs) as admin:
            while admin.describe_transactions(["recover-me"])["recover-me"].state != final:
                assert time.monotonic() < deadline
                time.sleep(0.05)  # the markers go out right after the restart's replay
            (p0,) = admin.describe_producers([TopicPartition(TOPIC, 0)])[
                TopicPartition(TOPIC, 0)]
            # The coordinator's epoch is its partition's leader epoch: 0 in the first run,
            # raised by the restart (the markers of the first run's coordinator are fenced).
            assert p0.current_txn_start_offset == -1 and p0.coordinator_epoch > 0
        expected = sorted(b"r%d" % i for i in range(6)) \
            if state == TransactionState.PREPARE_COMMIT else []
        assert sorted(read_committed(bs, TOPIC)) == expected
