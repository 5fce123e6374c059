"""Log compaction in cluster mode: every replica cleans its own log (as in Kafka), a follower
that was away catches up from a leader whose log has gaps where its cleaner removed batches,
and read_committed reads the latest committed value per key before and after the leader is
killed (issue 18, section 4)."""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from support.compaction import confluent_read_committed

from oncelog.harness.local_cluster import LocalCluster
from oncelog.harness.zookeeper import ZooKeeperServer
from oncelog.log.cleaner_manager import CHECKPOINT_FILE
from oncelog.records import iter_batches
from oncelog.records.batch import BatchHeader

pytest.importorskip("kazoo")  # the brokers need it
pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SETTINGS = {"zookeeper.session.timeout.ms": 2000, "replica.lag.time.max.ms": 2000,
            "log.cleaner.backoff.ms": 100}
CONFIG = {"cleanup.policy": "compact", "segment.bytes": "8192", "min.insync.replicas": "2",
          "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "500"}
DEADLINE_S = 60.0


def _wait(cond, what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _write(bootstrap: str, topic: str, model: dict, rng: random.Random, rounds: int,
           tag: str) -> None:
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"c-{tag}",
                    "linger.ms": 1})
    txn.init_transactions(30)
    for i in range(rounds):
        records = [(f"k{rng.randrange(40)}".encode(), f"{tag}-{i}-{j}".encode() + b"p" * 200)
                   for j in range(rng.randrange(1, 6))]
        txn.begin_transaction()
        for key, value in records:
            txn.produce(topic, key=key, value=value, partition=0)
        if rng.random() < 0.7:
            txn.commit_transaction(30)
            model.update(records)
        else:
            txn.abort_transaction(30)
    txn.flush(10)


def _cleaned(cluster: LocalCluster, n: int, topic: str) -> int:
    try:
        return int((cluster.brokers[n].data_dir / f"{topic}-0" / CHECKPOINT_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return -1


def _batches(cluster: LocalCluster, n: int, topic: str) -> list[BatchHeader]:
    """The headers of a replica's batches, read from its segment files."""
    out: list[BatchHeader] = []
    for path in sorted((cluster.brokers[n].data_dir / f"{topic}-0").glob("*.log")):
        data = path.read_bytes()
        out.extend(h for _pos, h in iter_batches(data))
    return out


def _first_at(batches: list[BatchHeader], offset: int) -> int:
    """The base offset of the first batch that holds ``offset`` or comes after it."""
    return min((h.base_offset for h in batches if h.last_offset >= offset), default=-1)


def _read(bootstrap: str, topic: str) -> dict:
    out: dict = {}
    for key, value in confluent_read_committed(bootstrap, topic, 1):
        out[key] = value
    return out


def test_every_replica_cleans_its_own_log_and_a_returning_follower_takes_the_gaps(
        zookeeper_server: ZooKeeperServer, tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", 3,
                           zookeeper=f"{zookeeper_server.connect_string}/c-{uuid.uuid4().hex[:8]}",
                           broker_settings=SETTINGS, die_with_parent=True)
    cluster.start()
    try:
        topic = "compacted"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        admin.create_topics([NewTopic(topic, 1, 3, config=CONFIG)])[topic].result(30)
        cluster.wait_for_isr(topic, 0, 3, DEADLINE_S)
        rng = random.Random(5)
        model: dict = {}
        _write(cluster.bootstrap_servers, topic, model, rng, 80, "a")
        for n in cluster.brokers:
            _wait(lambda n=n: _cleaned(cluster, n, topic) > 0, f"broker {n} cleaning")
        assert _read(cluster.bootstrap_servers, topic) == model
        # A follower away while the others write and clean: it comes back to gaps.
        leader = cluster.leader_of(topic, 0)
        away = next(n for n in cluster.brokers if n != leader)
        cluster.stop_broker(away)
        before = _cleaned(cluster, leader, topic)
        _write(cluster.bootstrap_servers, topic, model, rng, 120, "b")
        _wait(lambda: _cleaned(cluster, leader, topic) > before, "the leader cleaning again")
        # Where the follower will fetch from, the leader's cleaner removed the batch.
        away_end = max(h.next_offset for h in _batches(cluster, away, topic))
        _wait(lambda: _first_at(_batches(cluster, leader, topic), away_end) > away_end,
              "a gap at the follower's log end")
        cluster.start_broker(away)
        cluster.wait_for_isr(topic, 0, 3, DEADLINE_S)
        # The leader dies: the returned follower may lead now, with what it fetched.
        cluster.kill(leader)
        cluster.wait_for_leader(topic, 0, not_on=leader)
        _write(cluster.bootstrap_servers, topic, model, rng, 30, "c")
        assert _read(cluster.bootstrap_servers, topic) == model
        cluster.start_broker(leader)
        cluster.wait_for_isr(topic, 0, 3, DEADLINE_S)
        for n in cluster.brokers:
            if n != leader:
                _wait(lambda n=n: _cleaned(cluster, n, topic) > 0, f"broker {n} cleaning")
    finally:
        cluster.stop()
