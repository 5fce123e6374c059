"""KIP-939 two-phase commit through our client: a prepared transaction survives the death of its
producer (SIGKILL), is kept by the next incarnation (init_transactions(keep_prepared_txn=True)),
and is committed or aborted by complete_transaction according to the state the caller stored;
it never times out, fences every earlier incarnation, and an operator can force-terminate it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from support.raw_wire import RawConnection, create_topics_request, list_offsets_request

from oncelog import Admin, Consumer, PreparedTxnState, Producer
from oncelog.client.errors import IllegalStateError, TransactionError
from oncelog.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionalIdAuthorizationFailedError,
)
from oncelog.server.embedded import EmbeddedBroker

TOPIC = "two-phase"
ENABLED = {"transaction.two.phase.commit.enable": "true",
           "transaction.state.log.num.partitions": "2",
           "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100"}


@pytest.fixture
def broker():
    with EmbeddedBroker(config=ENABLED) as b:
        with RawConnection(b.bootstrap_servers) as conn:
            assert conn.request(create_topics_request(TOPIC, 2)).topics[0].error_code == 0
        yield b


def producer(b, txn_id, **kw):
    return Producer(bootstrap_servers=b.bootstrap_servers, transactional_id=txn_id,
                    transaction_two_phase_commit_enable=True, linger_ms=0, **kw)


def offsets(b, partition=0):
    with RawConnection(b.bootstrap_servers) as conn:
        hw = conn.request(list_offsets_request(TOPIC, partition, -1)).topics[0]
        lso = conn.request(list_offsets_request(TOPIC, partition, -1, isolation_level=1)).topics[0]
    return hw.partitions[0].offset, lso.partitions[0].offset


def committed_values(b, expect, timeout=10.0):
    c = Consumer(bootstrap_servers=b.bootstrap_servers, isolation_level="read_committed",
                 auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        c.assign([(TOPIC, 0), (TOPIC, 1)])
        seen: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(seen) < expect and time.monotonic() < deadline:
            seen += [r.value for r in c.poll(0.2)]
        seen += [r.value for r in c.poll(0.3)]
        return sorted(seen)
    finally:
        c.close()


PREPARE_AND_DIE = textwrap.dedent("""
    import sys, time
    from oncelog import Producer
    p = Producer(bootstrap_servers=sys.argv[1], transactional_id=sys.argv[2],
                 transaction_two_phase_commit_enable=True, linger_ms=0)
    p.init_transactions(10)
    p.begin_transaction()
    for i in range(10):
        p.send(sys.argv[3], f"r{i}".encode(), partition=i % 2)
    state = p.prepare_transaction(10)
    print(state, flush=True)
    time.sleep(600)
""")


def prepare_in_a_process_then_kill(b, txn_id) -> PreparedTxnState:
    proc = subprocess.Popen([sys.executable, "-c", PREPARE_AND_DIE, b.bootstrap_servers, txn_id,
                             TOPIC], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line, "the producer died before preparing"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    return PreparedTxnState(line)


@pytest.mark.slow
@pytest.mark.parametrize("decision", ["commit", "abort"])
def test_a_prepared_transaction_outlives_its_producer_and_is_completed(broker, decision):
    stored = prepare_in_a_process_then_kill(broker, f"dual-{decision}")
    hw, lso = offsets(broker)
    assert hw == 5 and lso == 0  # prepared: written, invisible, holding read_committed back
    p = producer(broker, f"dual-{decision}")
    try:
        p.init_transactions(10, keep_prepared_txn=True)
        with pytest.raises(IllegalStateError):
            p.send(TOPIC, b"more")  # a kept transaction takes nothing more
        with pytest.raises(IllegalStateError):
            p.begin_transaction()
        # The database says it committed (the same state), or never got there (another one).
        p.complete_transaction(stored if decision == "commit" else PreparedTxnState(), 10)
        # The producer goes on with the next transaction.
        p.begin_transaction()
        p.send(TOPIC, b"next", partition=0)
        p.commit_transaction(10)
    finally:
        p.close()
    expected = sorted([f"r{i}".encode() for i in range(10)] if decision == "commit" else [])
    assert committed_values(broker, len(expected) + 1) == sorted(expected + [b"next"])
    assert offsets(broker, 1)[0] == offsets(broker, 1)[1]


def test_each_incarnation_fences_the_previous_and_the_transaction_stays(broker):
    p0 = producer(broker, "loop")
    p0.init_transactions(10)
    p0.begin_transaction()
    p0.send(TOPIC, b"kept", partition=0)
    state = p0.prepare_transaction(10)
    incarnations = [producer(broker, "loop") for _ in range(3)]
    try:
        for p in incarnations:
            p.init_transactions(10, keep_prepared_txn=True)
        for old in [p0] + incarnations[:-1]:
            with pytest.raises(ProducerFencedError):
                old.commit_transaction(10)
        incarnations[-1].complete_transaction(state, 10)
    finally:
        for p in [p0] + incarnations:
            p.close()
    assert committed_values(broker, 1) == [b"kept"]


def test_two_phase_transactions_never_time_out_but_others_do(broker):
    slow = producer(broker, "2pc-slow")
    plain = Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="plain",
                     transaction_timeout_ms=500, linger_ms=0)
    try:
        for p in (slow, plain):
            p.init_transactions(10)
            p.begin_transaction()
            p.send(TOPIC, b"open", partition=1)
            p.flush(10)
        slow.prepare_transaction(10)
        time.sleep(1.5)
        with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
            d = admin.describe_transactions(["2pc-slow", "plain"])
        assert d["plain"].state == "CompleteAbort"  # timed out, aborted, fenced
        assert d["2pc-slow"].state == "Ongoing" and d["2pc-slow"].timeout_ms == 2**31 - 1  # as Kafka
        assert max(core.longest_open_ms(int(time.time() * 1000))
                   for core in broker.broker.txn_coordinator.all_cores()) >= 1500
        slow.commit_transaction(10)
    finally:
        slow.close()
        plain.close()


def test_an_operator_can_force_terminate_a_prepared_transaction(broker, tmp_path):
    p = producer(broker, "abandoned")
    try:
        p.init_transactions(10)
        p.begin_transaction()
        p.send(TOPIC, b"stuck", partition=0)
        p.prepare_transaction(10)
        assert offsets(broker)[1] == 0
        out = subprocess.run([sys.executable, "-m", "oncelog.cli.main", "transactions",
                              "force-terminate", "--bootstrap-server", broker.bootstrap_servers,
                              "--transactional-id", "abandoned"],
                             check=False, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "Terminated" in out.stdout
        deadline = time.monotonic() + 10
        while offsets(broker)[1] != offsets(broker)[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        hw, lso = offsets(broker)
        assert lso == hw  # aborted: read_committed readers move on
        with pytest.raises(ProducerFencedError):
            p.commit_transaction(10)
    finally:
        p.close()
    assert committed_values(broker, 0, timeout=1) == []
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        admin.force_terminate_transaction("abandoned")  # nothing open: still fine
        assert admin.describe_transactions(["abandoned"])["abandoned"].state == "Empty"


def test_a_record_that_fails_in_send_cannot_be_prepared(broker):
    """KIP-939 phase one must not vouch for a transaction that lost a record: prepare raises
    (as commit does), abort recovers. Before, prepare and commit succeeded without it."""
    p = producer(broker, "lost-record")
    try:
        p.init_transactions(10)
        p.begin_transaction()
        p.send(TOPIC, b"kept-out", partition=0)
        assert p.send(TOPIC, b"lost", partition=7).exception(10) is not None
        with pytest.raises(TransactionError, match="partition 7"):
            p.prepare_transaction(10)
        p.abort_transaction(10)
        p.begin_transaction()
        p.send(TOPIC, b"next", partition=1)
        p.complete_transaction(p.prepare_transaction(10), 10)
    finally:
        p.close()
    assert committed_values(broker, 1) == [b"next"]


def test_two_phase_commit_is_refused_unless_the_broker_allows_it():
    with EmbeddedBroker() as b:
        p = producer(b, "not-allowed")
        try:
            with pytest.raises(TransactionalIdAuthorizationFailedError):
                p.init_transactions(10)
        finally:
            p.close()


def test_prepare_needs_two_phase_commit_and_the_timeout_cannot_be_set_with_it(broker):
    p = Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="plain-2")
    try:
        p.init_transactions(10)
        p.begin_transaction()
        with pytest.raises(InvalidTxnStateError):
            p.prepare_transaction(10)
        with pytest.raises(InvalidTxnStateError):
            p.complete_transaction(PreparedTxnState(), 10)
        p.abort_transaction(10)
    finally:
        p.close()
    with pytest.raises(ValueError, match="never time out"):
        producer(broker, "x", transaction_timeout_ms=1000)


def test_prepared_txn_state_round_trips_through_text():
    s = PreparedTxnState(producer_id=42, producer_epoch=7)
    assert str(s) == "42:7" and PreparedTxnState("42:7") == s and PreparedTxnState(str(s)) == s
    assert str(PreparedTxnState()) == "" and PreparedTxnState("") == PreparedTxnState()
    assert not PreparedTxnState().has_transaction
    for bad in ("42", "x:1", "1:99999", "-1:0"):
        with pytest.raises(ValueError):
            PreparedTxnState(bad)
