"""Spec 003's late messages, reproduced with the fault proxy and checked by the history checker.

A transactional Produce of transaction T1 is held by the proxy until the writer has given up
on it and aborted T1; then it is released, either after the abort (nothing else going on) or
after the next transaction T2 has added the partition. What the broker does with the late batch
depends on the protocol:

| broker                                   | writer       | late after abort | late inside T2  |
| transaction.version=1, verification off  | old protocol | hanging (stuck)  | aborted + lost  |
| defaults (TV2, verification on)          | old protocol | refused          | aborted + lost  |
| defaults                                 | TV2          | fenced           | fenced          |

The last column of the second row is KIP-890's own limit: "for older clients, we may include a
record from the previous transaction if the new transaction has started and we receive a late
message. This issue can only be avoided with the new clients through the epoch bump."
"""

from __future__ import annotations

import pytest

from oncelog import Admin, NewTopic, Producer
from oncelog.errors import KafkaError
from oncelog.protocol import ApiKey
from oncelog.server.config import BROKER_DEFAULTS
from oncelog.server.embedded import EmbeddedBroker
from oncelog.verify.checker import check
from oncelog.verify.history import History, Txn, Write
from oncelog.verify.proxy import FaultProxy
from oncelog.verify.raw_writer import RawTxnWriter
from oncelog.verify.workload import WorkloadConfig, read_all

pytestmark = pytest.mark.skipif(
    "transaction.version" not in BROKER_DEFAULTS
    or "transaction.partition.verification.enable" not in BROKER_DEFAULTS,
    reason="the broker has no transaction.version / transaction.partition.verification.enable")

OLD = {"transaction.version": "1", "transaction.partition.verification.enable": "false"}
BASE = {"transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2"}
TOPIC = "late"


@pytest.fixture(params=["old-broker", "default-broker"])
def setup(request):
    settings = dict(BASE, **(OLD if request.param == "old-broker" else {}))
    with EmbeddedBroker(config=settings) as broker, \
            FaultProxy(broker.bootstrap_servers, seed=1) as proxy:
        with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(TOPIC, num_partitions=1)])
        yield request.param, broker, proxy


def record(history: History, w: RawTxnWriter, n: int, values: list[str], send: str,
           outcome: str) -> None:
    for v in values:
        history.add(Write("w", n, v, TOPIC, 0, send, w.transactional_id))  # type: ignore[arg-type]
    history.add(Txn("w", n, outcome, w.transactional_id))  # type: ignore[arg-type]


def late_batch(proxy: FaultProxy, protocol: str, into_next_txn: bool, broker) -> dict[str, int]:
    """T0 commits; T1's batch is held past its abort; it is released after the abort or inside
    T2 (which then sends its own batch and commits). Returns the checker's counts."""
    history = History()
    w = RawTxnWriter(proxy.bootstrap_servers, "late-writer", protocol, request_timeout=0.5)
    try:
        w.init()
        w.begin()
        record(history, w, 0, ["t0"], w.send(TOPIC, 0, ["t0"]), w.end(True))
        w.begin()
        proxy.hold_next(ApiKey.PRODUCE)
        sent = w.send(TOPIC, 0, ["t1"])
        assert sent == "unknown"  # given up: the proxy still holds it
        record(history, w, 1, ["t1"], sent, w.end(True))  # commit asked, aborts: a send failed
        w.begin()
        if into_next_txn:
            assert w.add_partition(TOPIC, 0)
        assert proxy.release_held() == 1
        proxy.wait_idle()
        if into_next_txn:
            record(history, w, 2, ["t2"], w.send(TOPIC, 0, ["t2"]), w.end(True))
    finally:
        w.close()
    assert [op.outcome for op in history.ops if isinstance(op, Txn)][:2] == \
        ["committed", "aborted"]
    read_all(broker.bootstrap_servers, WorkloadConfig(topic=TOPIC, partitions=1,
                                                      read_timeout=3), history, "r")
    return {k: v for k, v in check(history).counts.items() if v}


def test_late_batch_after_the_abort(setup):
    kind, broker, proxy = setup
    counts = late_batch(proxy, "old", into_next_txn=False, broker=broker)
    if kind == "old-broker":
        # accepted: it opens a transaction nobody will end, and read_committed stops there
        assert counts == {"stuck_read": 1}
    else:
        assert counts == {}  # verification: INVALID_TXN_STATE


def test_late_batch_inside_the_next_transaction_with_the_old_protocol(setup):
    _kind, broker, proxy = setup
    counts = late_batch(proxy, "old", into_next_txn=True, broker=broker)
    # T1's record commits with T2, and T2's own batch (same sequence) is taken for a duplicate
    # of it: both brokers, since the partition is in T2 when the late batch comes
    assert counts == {"aborted_read": 1, "lost_write": 1}


@pytest.mark.parametrize("into_next_txn", [False, True])
def test_transaction_version_2_fences_the_late_batch(into_next_txn):
    with EmbeddedBroker(config=BASE) as broker, \
            FaultProxy(broker.bootstrap_servers) as proxy:
        with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(TOPIC, num_partitions=1)])
        counts = late_batch(proxy, "tv2", into_next_txn, broker)
    assert counts == {}


def test_our_client_after_a_lost_batch(setup):
    """Our producer bumps its epoch after the lost batch (KIP-360), but the late batch still
    carries the old epoch, which is the partition's: only the broker can refuse it."""
    kind, broker, proxy = setup
    history = History()
    with Producer(bootstrap_servers=proxy.bootstrap_servers, transactional_id="late-ours",
                  request_timeout_ms=500, delivery_timeout_ms=1000, linger_ms=0) as p:
        p.init_transactions(10)
        p.begin_transaction()
        proxy.hold_next(ApiKey.PRODUCE, count=1000)  # the batch and all its retries
        future = p.send(TOPIC, b"ours-1", partition=0)
        proxy.wait_held()
        with pytest.raises(KafkaError):
            p.commit_transaction(10)
        p.abort_transaction(10)
        assert future.exception() is not None
        proxy.stop_holding()
        history.add(Write("ours", 1, "ours-1", TOPIC, 0, "unknown"))
        history.add(Txn("ours", 1, "aborted"))
        assert proxy.release_held() >= 1
        proxy.wait_idle()
    read_all(broker.bootstrap_servers, WorkloadConfig(topic=TOPIC, partitions=1,
                                                      read_timeout=3), history, "r")
    counts = {k: v for k, v in check(history).counts.items() if v}
    assert counts == ({"stuck_read": 1} if kind == "old-broker" else {})


def test_a_refusal_that_wrote_nothing_is_retried_only_when_asked():
    """send_retry_s: a send refused with a retriable code (here UNKNOWN_TOPIC_OR_PARTITION, the
    topic not there yet) is sent again until it is taken; without it the first answer is the
    outcome, as the fault workloads record it."""
    import threading
    import time

    settings = dict(BASE, **{"auto.create.topics.enable": "false"})
    with EmbeddedBroker(config=settings) as broker:
        once = RawTxnWriter(broker.bootstrap_servers, "once", "tv2")
        patient = RawTxnWriter(broker.bootstrap_servers, "patient", "tv2", send_retry_s=30.0)
        try:
            once.init()
            patient.init()
            once.begin()
            assert once.send("later", 0, ["a"]) == "failed"
            assert once.last_error == 3  # UNKNOWN_TOPIC_OR_PARTITION

            def create() -> None:
                time.sleep(0.5)
                with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
                    admin.create_topics([NewTopic("later", num_partitions=1)])

            creator = threading.Thread(target=create)
            creator.start()
            patient.begin()
            assert patient.send("later", 0, ["b"]) == "ok"
            assert patient.end(True) == "committed"
            creator.join()
        finally:
            once.close()
            patient.close()
