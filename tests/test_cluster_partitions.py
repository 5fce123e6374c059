"""CreatePartitions and DeleteRecords in cluster mode (3 broker processes on ZooKeeper).

CreatePartitions is the controller's (NOT_CONTROLLER elsewhere, as Kafka's ZooKeeper mode): it
places the new replicas as topic creation does, continuing the topic's placement, writes the
assignment znode, elects their leaders, and the brokers open them. DeleteRecords moves the
leader's log start offset, answers once the followers have followed (each learns it from its
fetch responses), and a follower that was away while the leader deleted past its log end
starts again at the leader's log start."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from support.raw_wire import RawConnection
from support.waiting import wait_until

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.cluster.election import assign_replicas
from oncelog.harness.local_cluster import LocalCluster
from oncelog.harness.zookeeper import ZooKeeperServer
from oncelog.protocol import ApiKey, make, request_module

pytest.importorskip("kazoo")  # the brokers need it

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SETTINGS = {"zookeeper.session.timeout.ms": 2000, "replica.lag.time.max.ms": 2000}
DEADLINE_S = 30.0
NOT_CONTROLLER = 41


@pytest.fixture
def cluster(zookeeper_server: ZooKeeperServer, tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "cluster", 3,
                     zookeeper=f"{zookeeper_server.connect_string}/t-{uuid.uuid4().hex[:10]}",
                     broker_settings=SETTINGS, die_with_parent=True)
    with c:
        c.start()
        yield c


def _create(cluster: LocalCluster, partitions: int, rf: int, **configs: Any) -> str:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, partitions, replication_factor=rf,
                                      config={k.replace("_", "."): str(v)
                                              for k, v in configs.items()})])
    for p in range(partitions):
        cluster.wait_for_isr(topic, p, rf, DEADLINE_S)
    return topic


def _controller(cluster: LocalCluster) -> int:
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        return admin.describe_cluster().controller_id


def test_the_controller_places_and_elects_the_new_partitions(cluster):
    topic = _create(cluster, 2, 2)
    before = cluster.describe(topic)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_partitions([NewPartitions(topic, 5)], operation_timeout=30)[topic].result(60)
    for p in range(5):
        cluster.wait_for_isr(topic, p, 2, DEADLINE_S)
    after = cluster.describe(topic)
    assert {p: after[p].replicas for p in (0, 1)} == {p: before[p].replicas for p in (0, 1)}
    # Kafka's placement, continued from the topic's first partition.
    brokers = sorted(cluster.brokers)
    start = brokers.index(before[0].replicas[0])
    expected = assign_replicas(3, 2, brokers, start_index=start, start_shift=start,
                               start_partition=2)
    assert {p: list(after[p].replicas) for p in (2, 3, 4)} == expected
    # Each replica is hosted by the broker the assignment names, and only there.
    for p in (2, 3, 4):
        hosts = {n for n in cluster.brokers
                 if (cluster.brokers[n].data_dir / f"{topic}-{p}").is_dir()}
        assert hosts == set(after[p].replicas)
    # Clients use them.
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all") as producer:
        producer.send(topic, b"in-4", partition=4).result(timeout=DEADLINE_S)
    with Consumer(bootstrap_servers=cluster.bootstrap_servers,
                  auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, 4)])
        got: list = []
        wait_until(lambda: got.extend(c.poll(0.2)) or got, DEADLINE_S, "the record")
        assert [r.value for r in got] == [b"in-4"]
    # Only the controller takes it, as in Kafka's ZooKeeper mode.
    other = next(n for n in cluster.brokers if n != _controller(cluster))
    mod = request_module(ApiKey.CREATE_PARTITIONS, 3)
    with RawConnection(cluster.brokers[other].address) as conn:
        response = conn.request(make(mod.CreatePartitionsRequest, topics=(make(
            mod.CreatePartitionsTopic, name=topic, count=6, assignments=None),),
            timeout=5000, validate_only=False))
    assert [r.error_code for r in response.results] == [NOT_CONTROLLER]
    assert len(cluster.describe(topic)) == 5


def _log_start(cluster: LocalCluster, n: int, topic: str) -> int | None:
    path = cluster.brokers[n].data_dir / f"{topic}-0" / "log-start-offset"
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def _produce(cluster: LocalCluster, topic: str, n: int, acks: Any = "all") -> None:
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks=acks) as producer:
        for i in range(n):
            producer.send(topic, f"v{i}".encode(), partition=0).result(timeout=DEADLINE_S)


def test_delete_records_moves_the_followers_log_start_too(cluster):
    topic = _create(cluster, 1, 3, min_insync_replicas=2)
    _produce(cluster, topic, 20)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    tp = CKTopicPartition(topic, 0, 12)
    deleted = admin.delete_records([tp], operation_timeout=30)[tp].result(60)
    # Answered once every live replica's log starts there (the low watermark).
    assert deleted.low_watermark == 12
    assert {n: _log_start(cluster, n, topic) for n in cluster.brokers} == \
        dict.fromkeys(cluster.brokers, 12)
    # A follower away while the leader deletes past its log end starts again at the leader's
    # log start when it comes back, and rejoins the ISR.
    leader = cluster.leader_of(topic, 0)
    follower = next(n for n in cluster.brokers if n != leader)
    cluster.stop_broker(follower)
    _produce(cluster, topic, 10)  # offsets 20-29, which the follower never saw
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as ours:
        assert ours.delete_records({TopicPartition(topic, 0): 25}) == \
            {TopicPartition(topic, 0): 25}
    cluster.start_broker(follower)
    cluster.wait_for_isr(topic, 0, 3, DEADLINE_S)
    assert _log_start(cluster, follower, topic) == 25
    # With the old leader gone, the new one (either follower) serves from 25 on.
    cluster.stop_broker(leader)
    wait_until(lambda: cluster.leader_of(topic, 0) not in (-1, leader), DEADLINE_S,
               "a new leader")
    with Consumer(bootstrap_servers=cluster.bootstrap_servers,
                  auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, 0)])
        got: list = []
        wait_until(lambda: got.extend(c.poll(0.2)) or len(got) >= 5, DEADLINE_S, "records")
        assert [r.offset for r in got] == list(range(25, 30))

