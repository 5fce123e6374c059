"""Our transactional producer when the broker stops answering (SIGSTOP): a timed-out
init_transactions can be called again; a batch lost to delivery.timeout.ms during
commit_transaction makes the commit fail as abortable at once (the sender never waits for the
transaction manager's lock), and abort_transaction then recovers with a new epoch (KIP-360) so
the next transaction commits."""

from __future__ import annotations

import os
import signal
import time

import pytest
from support.transactions import read_committed

from oncelog import Admin, NewTopic, Producer, TransactionError
from oncelog.client import KafkaTimeoutError
from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow
TOPIC = "txn-client"


def test_timeouts_leave_the_producer_usable(tmp_path):
    with BrokerProcess(tmp_path / "data") as broker:
        bs = broker.bootstrap_servers
        with Admin(bootstrap_servers=bs) as admin:
            admin.create_topics([NewTopic(TOPIC, num_partitions=2)])
        assert broker.proc is not None
        with Producer(bootstrap_servers=bs, transactional_id="t-timeouts",
                      delivery_timeout_ms=1500, request_timeout_ms=1000, linger_ms=0) as p:
            os.kill(broker.proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(KafkaTimeoutError):
                    p.init_transactions(timeout=2)
            finally:
                os.kill(broker.proc.pid, signal.SIGCONT)
            p.init_transactions(timeout=30)  # again: works
            epoch = p._txn.producer_epoch

            p.begin_transaction()
            p.send(TOPIC, b"first", partition=0).result(10)
            os.kill(broker.proc.pid, signal.SIGSTOP)
            try:
                lost = p.send(TOPIC, b"lost", partition=0)
                start = time.monotonic()
                with pytest.raises(TransactionError):
                    p.commit_transaction(timeout=15)
                assert time.monotonic() - start < 10  # the delivery timeout, not the 15 s
                assert lost.exception() is not None
            finally:
                os.kill(broker.proc.pid, signal.SIGCONT)
            p.abort_transaction(timeout=30)
            assert p._txn.producer_epoch == epoch + 1  # KIP-360: bumped, not fenced
            p.begin_transaction()
            p.send(TOPIC, b"after", partition=1)
            p.commit_transaction(timeout=30)
        assert sorted(read_committed(bs, TOPIC)) == [b"after"]
