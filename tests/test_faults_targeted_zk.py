"""Targeted faults between the brokers and ZooKeeper (issue 31), on a loopback cluster of three
broker processes where each broker reaches the others and the clients through a relay of its
own and ZooKeeper through another (``LocalCluster(relays=True, zookeeper_relays=True)``):

- a transaction coordinator that loses ZooKeeper mid-commit (while it writes PrepareCommit, and
  while it writes the markers): once healed the transaction ended all or nothing, and the
  producer, or its replacement with the same transactional.id, goes on;
- a partition leader isolated from the other brokers and ZooKeeper while acks=all producers
  (idempotent and transactional) write: no acknowledged write is lost once a new leader took
  over, no committed transaction lost, no aborted one read, none torn;
- two brokers that each believe they lead a partition (the old leader cut from ZooKeeper but
  reachable by clients, the new one elected): the old one acknowledges no acks=all write and
  serves nothing past the high watermark it can prove; after the heal nothing acknowledged is
  lost and the old leader serves no stale read.

The cluster is shared by the tests of this module; each heals what it cut.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.raw_wire import (
    RawConnection,
    fetch_all,
    fetch_request,
    metadata_request,
    produce_request,
)
from support.zookeeper import require_zookeeper

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.client.metadata import Cluster
from oncelog.harness.local_cluster import LocalCluster
from oncelog.records import build_batch
from oncelog.server.topics import TRANSACTION_STATE, coordinator_partition
from oncelog.verify.raw_writer import RawTxnWriter

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SESSION_MS = 2000
SETTINGS = {"zookeeper.session.timeout.ms": str(SESSION_MS), "replica.lag.time.max.ms": "2000",
            "transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "1",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}
TXN_PARTITIONS = 3
NONE, NOT_LEADER_OR_FOLLOWER, UNKNOWN_LEADER_EPOCH = 0, 6, 75
_names = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    require_zookeeper()
    with LocalCluster(tmp_path_factory.mktemp("targeted-zk") / "cluster", 3,
                      broker_settings=SETTINGS, die_with_parent=True, zookeeper_fsync=False,
                      relays=True, zookeeper_relays=True) as c:
        # the transaction log, before any test cuts anything
        with Producer(bootstrap_servers=c.bootstrap_servers, transactional_id="warm-up") as p:
            p.init_transactions(60)
        for i in range(TXN_PARTITIONS):
            c.wait_for_isr(TRANSACTION_STATE, i, 3, 60)
        yield c


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = condition()
        except (OSError, AssertionError):
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)


def direct(cluster: LocalCluster, n: int) -> str:
    """Broker ``n``'s own address (not its relay's): reachable while its relay is cut."""
    return cluster.brokers[n].address


def seen_by(cluster: LocalCluster, n: int, topic: str, partition: int) -> tuple[int, int, list]:
    """(leader, leader epoch, ISR) of the partition as broker ``n`` has it."""
    with RawConnection(direct(cluster, n), timeout=5) as conn:
        md = conn.request(metadata_request([topic]))
    (t,) = md.topics
    (p,) = [p for p in t.partitions if p.partition_index == partition]
    return int(p.leader_id), int(p.leader_epoch), sorted(int(i) for i in p.isr_nodes)


def new_leader(cluster: LocalCluster, topic: str, partition: int, old: int) -> tuple[int, int]:
    """Wait until every broker but ``old`` names the same leader other than ``old``:
    (leader, epoch)."""
    others = [n for n in cluster.brokers if n != old]

    def elected() -> tuple[int, int] | None:
        views = {seen_by(cluster, n, topic, partition)[:2] for n in others}
        if len(views) == 1:
            (view,) = views
            if view[0] not in (old, -1):
                return view
        return None

    return wait_until(elected, f"a new leader of {topic}-{partition} (not {old})")


def healed(cluster: LocalCluster, topic: str, partitions: range | list[int]) -> None:
    for p in partitions:
        wait_until(lambda p=p: all(len(seen_by(cluster, n, topic, p)[2]) == 3
                                   and len({seen_by(cluster, m, topic, p)[0]
                                            for m in cluster.brokers}) == 1
                                   for n in cluster.brokers),
                   f"{topic}-{p}: every broker back in the ISR, one leader", 60)


def create(cluster: LocalCluster, partitions: int = 1) -> str:
    name = f"zk{next(_names)}"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(name, partitions, replication_factor=3,
                                      config={"min.insync.replicas": "2"})])
    for p in range(partitions):
        cluster.wait_for_isr(name, p, 3, 60)
    return name


def read(bootstrap: str, topic: str, partition: int, committed: bool = False) -> list[str]:
    """Every value of the partition (read_committed: below the last stable offset), and check
    that the reader got to the end (nothing hangs the last stable offset)."""
    tp = TopicPartition(topic, partition)
    with Consumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted") as c:
        high = c.end_offsets([tp], timeout=30)[tp]
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                  isolation_level="read_committed" if committed else "read_uncommitted",
                  fetch_max_wait_ms=50) as c:
        c.assign([tp])
        c.seek_to_beginning()
        out: list[str] = []
        deadline = time.monotonic() + 30
        while c.position(tp) < high:
            assert time.monotonic() < deadline, f"stuck at {c.position(tp)} of {high}"
            out += [(r.value or b"").decode() for r in c.poll(0.2)]
        return out


def raw_produce(address: str, topic: str, partition: int, values: list[str],
                timeout_ms: int = 30_000) -> int:
    batch = build_batch([(None, v.encode(), [], int(time.time() * 1000)) for v in values])
    request = dataclasses.replace(produce_request(topic, partition, batch),
                                  timeout=datetime.timedelta(milliseconds=timeout_ms))
    with RawConnection(address, timeout=timeout_ms / 1000 + 10) as conn:
        response = conn.request(request)
    return int(response.responses[0].partition_responses[0].error_code)


# -- a coordinator that loses ZooKeeper mid-commit -----------------------------------------------


def find_ids(cluster: LocalCluster, topic: str, partitions: int,
             same_leader: bool) -> tuple[str, int, int, int]:
    """A transactional id and a partition of ``topic``: (id, partition, its coordinator, the
    partition's leader), the coordinator leading the partition or not."""
    leaders = {p: cluster.leader_of(topic, p) for p in range(partitions)}
    coordinators = {i: cluster.leader_of(TRANSACTION_STATE, i) for i in range(TXN_PARTITIONS)}
    for i in itertools.count():
        tid = f"mid-commit-{topic}-{i}"
        c = coordinators[coordinator_partition(tid, TXN_PARTITIONS)]
        for p, leader in leaders.items():
            if (leader == c) == same_leader:
                return tid, p, c, leader
    raise AssertionError("unreachable")


@pytest.mark.parametrize("cut", ["isolated", "zookeeper-only"])
def test_coordinator_cut_off_while_it_writes_prepare_commit(cluster, cut):
    """The coordinator (also the partition's leader) loses ZooKeeper around the EndTxn, so its
    PrepareCommit cannot reach the ISR: ``isolated``, cut off the brokers too just before the
    EndTxn; ``zookeeper-only``, still reachable by everyone, the EndTxn comes once a new
    coordinator was elected (two brokers each believe they coordinate the transactional id,
    the stale one's followers follow the new one). Once healed the transaction is aborted
    (whole), and a replacement producer with the same transactional.id commits the next
    one."""
    topic = create(cluster, 3)
    tid, p, c, _ = find_ids(cluster, topic, 3, same_leader=True)
    w = RawTxnWriter(direct(cluster, c), tid, "tv2", request_timeout=1.0,
                     coordinator_timeout=2.0, transaction_timeout_ms=60_000)
    txn_partition = coordinator_partition(tid, TXN_PARTITIONS)
    try:
        w.init()
        w.begin()
        assert w.send(topic, p, ["a1"]) == "ok" and w.send(topic, p, ["a2"]) == "ok"
        if cut == "isolated":
            cluster.isolate(c)
        else:
            cluster.cut_zookeeper(c)
        try:
            if cut == "zookeeper-only":
                new_leader(cluster, TRANSACTION_STATE, txn_partition, c)
            assert w.end(True) == "unknown"  # PrepareCommit never reaches the ISR
            new_leader(cluster, TRANSACTION_STATE, txn_partition, c)
            new_leader(cluster, topic, p, c)
        finally:
            cluster.reconnect(c)
    finally:
        w.close()
    healed(cluster, TRANSACTION_STATE, [txn_partition])
    healed(cluster, topic, [p])
    with Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=tid) as again:
        again.init_transactions(60)
        again.begin_transaction()
        again.send(topic, b"b1", partition=p).result(30)
        again.commit_transaction(60)
    got = read(cluster.bootstrap_servers, topic, p, committed=True)
    assert got in (["b1"], ["a1", "a2", "b1"])  # all or nothing
    assert got == ["b1"]  # the commit never became durable: aborted
    assert read(cluster.bootstrap_servers, topic, p) == ["a1", "a2", "b1"]


def test_coordinator_loses_zookeeper_while_it_writes_the_markers(cluster):
    """PrepareCommit is durable but the markers cannot reach the partition's leader (cut off
    the network); then the coordinator loses ZooKeeper. A new coordinator rolls the commit
    forward; the old one, stale, must not finish it differently. Once healed the transaction is
    committed (whole) and the same producer commits the next one."""
    topic = create(cluster, 3)
    tid, p, c, leader = find_ids(cluster, topic, 3, same_leader=False)
    txn_partition = coordinator_partition(tid, TXN_PARTITIONS)
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=tid,
                        request_timeout_ms=3000)
    try:
        producer.init_transactions(60)
        producer.begin_transaction()
        producer.send(topic, b"a1", partition=p).result(30)
        producer.send(topic, b"a2", partition=p).result(30)
        cluster.cut(leader)  # the markers cannot be written
        try:
            producer.commit_transaction(60)  # PrepareCommit durable: committed
            cluster.cut_zookeeper(c)
            try:
                new_leader(cluster, TRANSACTION_STATE, txn_partition, c)
            finally:
                cluster.heal(leader)
                cluster.heal_zookeeper(c)
        finally:
            cluster.heal(leader)
        healed(cluster, TRANSACTION_STATE, [txn_partition])
        healed(cluster, topic, [p])
        assert read(cluster.bootstrap_servers, topic, p, committed=True) == ["a1", "a2"]
        producer.begin_transaction()
        producer.send(topic, b"b1", partition=p).result(30)
        producer.commit_transaction(60)
    finally:
        producer.close()
    assert read(cluster.bootstrap_servers, topic, p, committed=True) == ["a1", "a2", "b1"]


# -- an isolated leader with acks=all producers -------------------------------------------------


def test_isolated_leader_loses_no_acknowledged_write(cluster):
    topic = create(cluster)
    leader = cluster.leader_of(topic, 0)
    acked: list[str] = []
    failed: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def write() -> None:
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=0,
                      request_timeout_ms=2000, delivery_timeout_ms=60_000) as p:
            pending = []
            for i in itertools.count():
                if stop.is_set():
                    break
                v = f"v{i}"
                pending.append((v, p.send(topic, v.encode(), partition=0)))
                while len(pending) > 8 or (stop.is_set() and pending):
                    v0, f0 = pending.pop(0)
                    try:
                        f0.result(90)
                        with lock:
                            acked.append(v0)
                    except Exception:  # noqa: BLE001 - not acknowledged
                        failed.append(v0)
            for v0, f0 in pending:
                try:
                    f0.result(90)
                    acked.append(v0)
                except Exception:  # noqa: BLE001
                    failed.append(v0)

    # and transactions of three records each to the same partition
    txns: dict[str, list[list[str]]] = {"committed": [], "aborted": [], "unknown": []}

    def write_txns() -> None:
        p = None
        try:
            for n in itertools.count():
                if stop.is_set():
                    break
                if p is None:
                    p = Producer(bootstrap_servers=cluster.bootstrap_servers,
                                 transactional_id=f"isolated-{topic}", linger_ms=0,
                                 request_timeout_ms=2000, transaction_timeout_ms=20_000)
                    p.init_transactions(60)
                values = [f"x{n}-{k}" for k in range(3)]
                try:
                    p.begin_transaction()
                    for v in values:
                        p.send(topic, v.encode(), partition=0)
                    p.commit_transaction(60)
                    txns["committed"].append(values)
                except Exception:  # noqa: BLE001 - abort, or start over when that fails
                    try:
                        p.abort_transaction(60)
                        txns["aborted"].append(values)
                    except Exception:  # noqa: BLE001 - outcome unknown; a new producer
                        txns["unknown"].append(values)
                        p.close()
                        p = None
        finally:
            if p is not None:
                p.close()

    thread = threading.Thread(target=write, daemon=True)
    txn_thread = threading.Thread(target=write_txns, daemon=True)
    thread.start()
    txn_thread.start()
    try:
        wait_until(lambda: len(acked) >= 30 and len(txns["committed"]) >= 5,
                   "30 writes acknowledged, 5 transactions committed")
        cluster.isolate(leader)
        try:
            with lock:
                before = len(acked)
            new_leader(cluster, topic, 0, leader)
            # a client that still reaches the isolated leader gets no acknowledgement
            assert raw_produce(direct(cluster, leader), topic, 0, ["stale"],
                               timeout_ms=3000) != NONE
            wait_until(lambda: len(acked) >= before + 30, "30 writes acknowledged by the new "
                       "leader")
        finally:
            cluster.reconnect(leader)
        healed(cluster, topic, [0])
        with lock:
            now = len(acked)
        done = len(txns["committed"])
        wait_until(lambda: len(acked) >= now + 10 and len(txns["committed"]) >= done + 3,
                   "writes acknowledged and transactions committed after the heal")
    finally:
        stop.set()
        thread.join(120)
        txn_thread.join(120)
    assert not thread.is_alive() and not txn_thread.is_alive()
    got = read(cluster.bootstrap_servers, topic, 0, committed=True)
    lost = set(acked) - set(got)
    assert not lost, f"{len(lost)} acknowledged writes lost: {sorted(lost)[:10]}"
    assert len(got) == len(set(got)), "duplicates"  # idempotent and transactional producers
    assert "stale" not in got  # the isolated leader's own write was truncated
    seen = set(got)
    for values in txns["committed"]:
        assert set(values) <= seen, f"committed transaction lost: {values}"
    for values in txns["aborted"]:
        assert not set(values) & seen, f"aborted transaction read: {values}"
    for values in txns["unknown"]:
        assert set(values) <= seen or not set(values) & seen, f"torn transaction: {values}"


# -- two brokers that each believe they lead ---------------------------------------------------


def test_old_leader_cut_from_zookeeper_acknowledges_nothing_and_reads_no_further(cluster):
    topic = create(cluster)
    old = cluster.leader_of(topic, 0)
    old_epoch = seen_by(cluster, old, topic, 0)[1]
    assert raw_produce(direct(cluster, old), topic, 0, ["a0", "a1", "a2"]) == NONE
    cluster.cut_zookeeper(old)
    try:
        leader, epoch = new_leader(cluster, topic, 0, old)
        assert epoch > old_epoch
        # two leaders: the old one, reachable, still believes it leads
        assert seen_by(cluster, old, topic, 0)[:2] == (old, old_epoch)
        # it acknowledges no acks=all write (its ISR cannot shrink without ZooKeeper)
        assert raw_produce(direct(cluster, old), topic, 0, ["stale"], timeout_ms=3000) != NONE
        with RawConnection(direct(cluster, old)) as conn:
            pd = conn.request(fetch_request(topic, 0, 0)).responses[0].partitions[0]
            assert int(pd.error_code) == NONE and pd.high_watermark == 3  # not past it
            assert [v for _o, _k, v, _h in fetch_all(conn, topic, 0)] == [b"a0", b"a1", b"a2"]
            # a reader that knows the new leader epoch is refused by the old leader
            fetch = fetch_request(topic, 0, 0)
            partition = dataclasses.replace(fetch.topics[0].partitions[0],
                                            current_leader_epoch=epoch)
            fetch = dataclasses.replace(fetch, topics=(dataclasses.replace(
                fetch.topics[0], partitions=(partition,)),))
            pd = conn.request(fetch).responses[0].partitions[0]
            assert int(pd.error_code) == UNKNOWN_LEADER_EPOCH
        # the new leader takes writes meanwhile
        assert raw_produce(direct(cluster, leader), topic, 0, ["b0", "b1"]) == NONE
        # a client that asks the old leader for metadata after the new one keeps the newer
        # leader epoch (KIP-320): it does not go back to the old leader
        tp = TopicPartition(topic, 0)
        view = Cluster()
        for n in (leader, old):
            with RawConnection(direct(cluster, n)) as conn:
                view = view.with_response(conn.request(metadata_request([topic])), [topic])
        assert (view.leader_for(tp), view.leader_epoch(tp)) == (leader, epoch)
    finally:
        cluster.heal_zookeeper(old)
    healed(cluster, topic, [0])
    wait_until(lambda: seen_by(cluster, old, topic, 0)[0] == leader, "the old leader follows")
    with RawConnection(direct(cluster, old)) as conn:  # no stale read from it
        pd = conn.request(fetch_request(topic, 0, 0)).responses[0].partitions[0]
        assert int(pd.error_code) == NOT_LEADER_OR_FOLLOWER
    # everything acknowledged, and the old leader's unacknowledged write gone (truncated)
    assert read(cluster.bootstrap_servers, topic, 0) == ["a0", "a1", "a2", "b0", "b1"]


def test_consumer_leaves_a_deposed_leader_and_never_reads_back(cluster):
    """Our consumer reads a partition whose leader is then cut off ZooKeeper and deposed, while
    it still serves (and names itself leader in its metadata). Within metadata.max.age.ms the
    consumer asks another broker (Kafka's leastLoadedNode prefers a broker not yet connected to
    a busy connection), takes the newer leader epoch and never goes back to the old leader
    (KIP-320): it reads what the new leader took, and no offset twice or out of order."""
    topic = create(cluster)
    old = cluster.leader_of(topic, 0)
    assert raw_produce(direct(cluster, old), topic, 0, ["a0", "a1", "a2"]) == NONE
    tp = TopicPartition(topic, 0)
    got: list[tuple[int, str]] = []

    def poll_until(count: int, what: str) -> None:
        def enough() -> bool:
            got.extend((r.offset, (r.value or b"").decode()) for r in consumer.poll(0.2))
            return len(got) >= count
        wait_until(enough, what)

    with Consumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest",
                  metadata_max_age_ms=500, fetch_max_wait_ms=100) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning()
        poll_until(3, "the first records read")
        cluster.cut_zookeeper(old)
        try:
            leader, _epoch = new_leader(cluster, topic, 0, old)
            assert raw_produce(direct(cluster, leader), topic, 0, ["b0", "b1"]) == NONE
            poll_until(5, "the new leader's records read while the old one is cut off")
        finally:
            cluster.heal_zookeeper(old)
        healed(cluster, topic, [0])
        assert raw_produce(direct(cluster, leader), topic, 0, ["c0"]) == NONE
        poll_until(6, "the records written after the heal read")
    assert got == list(enumerate(["a0", "a1", "a2", "b0", "b1", "c0"]))
