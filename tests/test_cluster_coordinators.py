"""Cluster mode: the coordinators follow their partitions (spec 000 "Transaction Coordinator
Startup", "Discussion on Coordinator Failure During Transaction Completion"; spec 001 failure
scenarios 5-7). A 3-broker cluster (replication factor 3, min.insync.replicas 2) runs the
exactly-once purchases app (consume-transform-produce, our client and confluent-kafka's) while
the transaction coordinator, the group coordinator and a partition leader are SIGKILLed in turn
and started again: read_committed, every purchase has exactly one invoice and one shipment."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from support.purchases_app import App
from support.transactions import read_committed
from support.waiting import wait_until
from support.zookeeper import require_zookeeper

from oncelog import Admin, NewTopic, Producer
from oncelog.examples.purchases import GROUP, INVOICES, PURCHASES, SHIPMENTS, purchase
from oncelog.harness.local_cluster import LocalCluster
from oncelog.server.topics import CONSUMER_OFFSETS, TRANSACTION_STATE, coordinator_partition

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

# Enough that each kill lands mid-stream with work left after the last (2500 purchases), no more:
# past the last kill the run is only steady copying. They are written a quarter at a time, the
# next quarter once the killed broker is back, so the app cannot run ahead of the kills however
# long a restart takes (on a loaded machine it copied everything before the second kill).
PURCHASE_COUNT = 6000
QUARTER = PURCHASE_COUNT // 4
PARTITIONS = 3
SETTINGS = {"transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000",
            "zookeeper.session.timeout.ms": "2000", "replica.lag.time.max.ms": "2000",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}
TXN_ID = "purchases-app-1"  # the app's default transactional id


def _new_cluster(tmp_path: Path, relays: bool = False) -> LocalCluster:
    require_zookeeper()
    return LocalCluster(tmp_path / "cluster", 3, broker_settings=SETTINGS, die_with_parent=True,
                        zookeeper_fsync=False, relays=relays)


@pytest.fixture
def cluster(tmp_path: Path):
    with _new_cluster(tmp_path) as c:
        yield c


def _create_topics(bootstrap: str) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(t, PARTITIONS, replication_factor=3,
                                      config={"min.insync.replicas": "2"})
                             for t in (PURCHASES, INVOICES, SHIPMENTS)])


def _seed(bootstrap: str, purchases: range) -> None:
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=20) as p:
        for n in purchases:
            p.send(PURCHASES, purchase(n), key=str(n).encode())
        p.flush()


def _purchase_ids(bootstrap: str, topic: str) -> Counter:
    import json

    return Counter(json.loads(v)["purchase"]
                   for v in read_committed(bootstrap, topic, PARTITIONS))


def _coordinator(cluster: LocalCluster, topic: str, key: str) -> int:
    return cluster.leader_of(topic, coordinator_partition(key, 3))


def _topic_and_txn_log(cluster: LocalCluster, partitions: int, replication_factor: int,
                       txn_id: str) -> tuple[str, int]:
    """A new topic, and the transaction log created, with ``txn_id``'s partition of it fully
    in sync; returns the topic's name and that partition's index."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, partitions, replication_factor=replication_factor)])
    with Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="warm-up") as p:
        p.init_transactions(30)  # the transaction log exists from here on
    index = coordinator_partition(txn_id, 3)
    cluster.wait_for_isr(TRANSACTION_STATE, index, 3, 30)
    return topic, index


@pytest.mark.parametrize("client", ["oncelog", "confluent"])
def test_purchases_app_exactly_once_while_coordinators_and_a_leader_are_killed(cluster, client):
    bootstrap = cluster.bootstrap_servers
    _create_topics(bootstrap)
    _seed(bootstrap, range(QUARTER))
    seeded = QUARTER
    # Stopped below once every purchase has its invoice and shipment, not by waiting for it
    # to idle: a restart may keep it without input for a while.
    app = App(bootstrap, client, idle_exit=120)
    killed = []
    # Each kill lands mid-stream (at these counts of committed purchases, with purchases left
    # to copy); the app rides it out on the two brokers left (min.insync.replicas 2), the
    # broker comes back, the next quarter is written, the next kill.
    for at, what in ((500, "transaction coordinator"), (2000, "group coordinator"),
                     (3500, "purchases-0 leader")):
        app.wait_committed_more_than(at)
        if what == "transaction coordinator":
            victim = _coordinator(cluster, TRANSACTION_STATE, TXN_ID)
        elif what == "group coordinator":
            victim = _coordinator(cluster, CONSUMER_OFFSETS, GROUP)
        else:
            victim = cluster.leader_of(PURCHASES, 0)
        cluster.kill(victim)
        killed.append((what, victim, app.committed, seeded))
        cluster.start_broker(victim)
        _seed(bootstrap, range(seeded, seeded + QUARTER))
        seeded += QUARTER
    expected = Counter(range(PURCHASE_COUNT))
    deadline = time.monotonic() + 300
    while any(expected - _purchase_ids(bootstrap, t) for t in (INVOICES, SHIPMENTS)):
        assert app.proc.poll() is None, "app exited:\n" + "\n".join(app.lines[-30:])
        assert time.monotonic() < deadline, "\n".join(app.lines[-30:])
        app.read_output()
        time.sleep(2)
    app.kill()  # all copied: whatever it has open now is aborted
    assert [committed < written for _, _, committed, written in killed] == [True] * 3, killed
    for topic in (INVOICES, SHIPMENTS):
        got = _purchase_ids(bootstrap, topic)
        missing = expected - got
        twice = {k: v for k, v in got.items() if v > 1}
        assert not missing and not twice, (topic, len(missing), len(twice), killed)


def test_transaction_coordinator_moves_and_prepared_commit_rolls_forward(cluster):
    """A transaction whose coordinator dies right after EndTxn answered: the new coordinator
    (the partition's new leader) finds PrepareCommit in the replicated log and completes it;
    the producer goes on with its next transaction at the new coordinator."""
    bootstrap = cluster.bootstrap_servers
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 3, replication_factor=3,
                                      config={"min.insync.replicas": "2"})])
    txn_id = "mover"
    p = Producer(bootstrap_servers=bootstrap, transactional_id=txn_id, acks="all")
    try:
        p.init_transactions()
        committed = []
        for batch in range(6):
            p.begin_transaction()
            values = [f"{batch}-{i}" for i in range(20)]
            for v in values:
                p.send(topic, v.encode(), key=v.encode())
            if batch == 4:
                p.abort_transaction()
            else:
                p.commit_transaction()
                committed += values
            if batch == 2:
                old = _coordinator(cluster, TRANSACTION_STATE, txn_id)
                cluster.kill(old)
                # The admin client finds the coordinator again while it moves (the dead
                # broker still leads the partition until its ZooKeeper session expires).
                with Admin(bootstrap_servers=bootstrap, default_api_timeout_ms=30_000) as a:
                    described = a.describe_transactions([txn_id])[txn_id]
                assert described.producer_id >= 0 and described.state in (
                    "CompleteCommit", "PrepareCommit", "Empty"), described
        new = _coordinator(cluster, TRANSACTION_STATE, txn_id)
        assert new != old
    finally:
        p.close()
    got = [v.decode() if isinstance(v, bytes) else v
           for v in read_committed(bootstrap, topic, 3)]
    assert sorted(got) == sorted(committed)


def test_a_client_that_hangs_up_mid_write_leaves_no_hanging_transaction(cluster):
    """InitProducerId reaches the coordinator, whose transaction log write then waits for a
    paused follower; the client hangs up meanwhile (its request is cancelled). The write must
    still finish and settle the transactional id: before the fix its pending transition stayed
    set for ever, and every later request was answered CONCURRENT_TRANSACTIONS."""
    from support.raw_wire import RawConnection

    from oncelog.protocol import ApiKey, encode_request, make, request_module

    bootstrap = cluster.bootstrap_servers
    txn_id = "hangs-up"
    topic, index = _topic_and_txn_log(cluster, 1, 3, txn_id)
    described = cluster.describe(TRANSACTION_STATE)[index]
    follower = next(r for r in described.replicas if r != described.leader)
    mod = request_module(ApiKey.INIT_PRODUCER_ID, 4)
    request = make(mod.InitProducerIdRequest, transactional_id=txn_id,
                   transaction_timeout=60_000, producer_id=-1, producer_epoch=-1)
    cluster.pause(follower)
    try:
        conn = RawConnection(cluster.brokers[described.leader].address)
        conn.send(encode_request(1, "hangs-up", request))
        time.sleep(0.5)  # the write waits for the paused follower
        conn.close()
        time.sleep(0.5)
    finally:
        cluster.resume(follower)
    with Producer(bootstrap_servers=bootstrap, transactional_id=txn_id, max_block_ms=20_000,
                  acks="all") as p:
        p.init_transactions(20)
        p.begin_transaction()
        p.send(topic, b"x")
        p.commit_transaction(20)


def test_a_completion_the_log_refused_is_written_once_the_isr_is_back(tmp_path: Path):
    """spec 000 step 5.3 with the transaction log below its min ISR at the last moment: EndTxn
    is answered (PrepareCommit replicated), the markers wait for the data partition's leader
    (killed), the coordinator's broker is cut off the network (its followers drop out of the
    ISR), the leader comes back and takes the markers, and the CompleteCommit write is refused
    (NOT_ENOUGH_REPLICAS). Once the coordinator is reconnected it must write it again: before
    the fix the transaction stayed PrepareCommit for ever (InitProducerId answered
    CONCURRENT_TRANSACTIONS, the transactional id unusable), as the cut fault test found."""
    with _new_cluster(tmp_path, relays=True) as cluster:
        bootstrap = cluster.bootstrap_servers
        txn_id = "completes-later"
        topic, index = _topic_and_txn_log(cluster, 3, 1, txn_id)
        coordinator = cluster.leader_of(TRANSACTION_STATE, index)
        partition, leader = next((p, info.leader) for p, info in cluster.describe(topic).items()
                                 if info.leader != coordinator)
        values = [f"v{i}".encode() for i in range(5)]
        p = Producer(bootstrap_servers=bootstrap, transactional_id=txn_id, acks="all",
                     max_block_ms=30_000)
        committed: list[BaseException | None] = []

        def commit() -> None:
            try:
                p.commit_transaction(90)  # answered once the transaction is complete
                committed.append(None)
            except BaseException as exc:  # noqa: BLE001 (reported by the test)
                committed.append(exc)

        committer = threading.Thread(target=commit, daemon=True)
        admin = Admin(bootstrap_servers=bootstrap, default_api_timeout_ms=30_000)
        try:
            p.init_transactions(30)
            p.begin_transaction()
            for v in values:
                p.send(topic, v, partition=partition)
            p.flush(30)
            cluster.kill(leader)  # the markers for its partition wait for it
            committer.start()
            wait_until(lambda: admin.describe_transactions([txn_id])[txn_id].state
                       == "PrepareCommit", 30, "PrepareCommit written")
            coordinator_log = cluster.brokers[coordinator].log_path
            refused = f"transaction log write for '{txn_id}'"
            seen = coordinator_log.read_text(errors="replace").count(refused)
            cluster.cut(coordinator)
            cluster.wait_for_isr(TRANSACTION_STATE, index, 1, 30)
            cluster.start_broker(leader)  # takes the markers; CompleteCommit is refused
            wait_until(lambda: coordinator_log.read_text(errors="replace").count(refused) > seen,
                       30, "the CompleteCommit write refused")
            cluster.heal(coordinator)
            wait_until(lambda: admin.describe_transactions([txn_id])[txn_id].state
                       == "CompleteCommit", 30, "the transaction completed")
            committer.join(60)
            assert committed == [None]
        finally:
            admin.close()
            p.close(5)
        with Producer(bootstrap_servers=bootstrap, transactional_id=txn_id, acks="all",
                      max_block_ms=20_000) as again:
            again.init_transactions(20)  # the transactional id is usable again
            assert sorted(read_committed(bootstrap, topic, 3)) == sorted(values)


def test_markers_wait_for_min_insync_replicas_and_the_transaction_stays_prepared(tmp_path: Path):
    """A marker is appended as any acks=all write is (Kafka's WriteTxnMarkers appends with
    requiredAcks -1, and Partition.appendRecordsToLeader checks min.insync.replicas whatever the
    origin): with the data partition's ISR below its min.insync.replicas the leader refuses it
    (NOT_ENOUGH_REPLICAS), the coordinator sends it again (Kafka's
    TransactionMarkerRequestCompletionHandler retries that error) and the transaction stays
    PrepareCommit, committed to no reader, until the ISR is back; then it completes."""
    with _new_cluster(tmp_path) as cluster:
        bootstrap = cluster.bootstrap_servers
        txn_id = "markers-min-isr"
        topic = f"t-{uuid.uuid4().hex[:8]}"
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics([NewTopic(topic, 1, replication_factor=2,
                                          config={"min.insync.replicas": "2"})])
        with Producer(bootstrap_servers=bootstrap, transactional_id="warm-up") as warm:
            warm.init_transactions(30)  # the transaction log exists from here on
        index = coordinator_partition(txn_id, 3)
        cluster.wait_for_isr(TRANSACTION_STATE, index, 3, 30)
        coordinator = cluster.leader_of(TRANSACTION_STATE, index)
        info = cluster.wait_for_isr(topic, 0, 2, 30)
        # The replica that goes: never the coordinator (its log keeps two of three in sync).
        gone = next(n for n in sorted(info.replicas, key=lambda n: n == info.leader)
                    if n != coordinator)
        values = [f"v{i}".encode() for i in range(3)]
        p = Producer(bootstrap_servers=bootstrap, transactional_id=txn_id, acks="all",
                     max_block_ms=30_000)
        committed: list[BaseException | None] = []

        def commit() -> None:
            try:
                p.commit_transaction(90)
                committed.append(None)
            except BaseException as exc:  # noqa: BLE001 (reported by the test)
                committed.append(exc)

        committer = threading.Thread(target=commit, daemon=True)
        admin = Admin(bootstrap_servers=bootstrap, default_api_timeout_ms=30_000)
        try:
            p.init_transactions(30)
            p.begin_transaction()
            for v in values:
                p.send(topic, v, partition=0)
            p.flush(30)
            cluster.kill(gone)
            leader = cluster.wait_for_isr(topic, 0, 1, 30).leader
            leader_log = cluster.brokers[leader].log_path
            committer.start()
            refused = f"on {topic}-0 refused"
            wait_until(lambda: refused in leader_log.read_text(errors="replace"), 30,
                       "the marker refused below min.insync.replicas")
            line = next(x for x in leader_log.read_text(errors="replace").splitlines()
                        if refused in x)
            assert "min.insync.replicas is 2" in line, line
            assert admin.describe_transactions([txn_id])[txn_id].state == "PrepareCommit"
            assert read_committed(bootstrap, topic, 1) == []  # the LSO waits for the marker
            cluster.start_broker(gone)
            cluster.wait_for_isr(topic, 0, 2, 30)
            wait_until(lambda: admin.describe_transactions([txn_id])[txn_id].state
                       == "CompleteCommit", 30, "the transaction completed")
            committer.join(60)
            assert committed == [None]
            assert sorted(read_committed(bootstrap, topic, 1)) == values
        finally:
            admin.close()
            p.close(5)
