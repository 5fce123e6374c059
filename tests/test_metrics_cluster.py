"""The metrics page of a cluster's brokers through a broker's death: Kafka's
UnderReplicatedPartitions on the leaders, OfflinePartitionsCount and ActiveControllerCount on
the controller, ReplicationBytesOutPerSec of the followers' fetches. Two broker processes on
Debian's ZooKeeper (one per module, a chroot per test), sessions of 2 s."""

from __future__ import annotations

import uuid

import pytest
from support.metrics import families, metrics_url, value
from support.waiting import wait_until

from oncelog import Admin, NewTopic, Producer
from oncelog.harness.local_cluster import LocalCluster

pytest.importorskip("kazoo")  # the brokers need it

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SETTINGS = {"zookeeper.session.timeout.ms": 2000, "replica.lag.time.max.ms": 2000,
            "metrics.port": 0}


def _sum(urls, name: str) -> float:
    return sum(value(families(u), name) for u in urls)


def test_under_replicated_and_offline_partitions_after_a_broker_dies(zookeeper_server,
                                                                      tmp_path):
    with LocalCluster(tmp_path / "cluster", 2, broker_settings=SETTINGS,
                      zookeeper=f"{zookeeper_server.connect_string}/m-{uuid.uuid4().hex[:8]}",
                      die_with_parent=True) as cluster:
        urls = {n: metrics_url(b) for n, b in cluster.brokers.items()}
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("both", 2, 2), NewTopic("lone", 4, 1)])
        for p in range(2):
            cluster.wait_for_isr("both", p, 2)
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all") as producer:
            for i in range(20):
                producer.send("both", b"r" * 100, partition=i % 2)
            producer.flush()
        on_two = sum(1 for info in cluster.describe("lone").values() if info.leader == 2)
        assert 0 < on_two < 4  # the controller spreads new partitions over the brokers
        pages = list(urls.values())
        assert _sum(pages, "oncelog_under_replicated_partitions") == 0
        assert _sum(pages, "oncelog_offline_partitions") == 0
        assert _sum(pages, "oncelog_active_controller") == 1
        # each partition of "both" is led by one broker and followed by the other
        wait_until(lambda: all(value(families(u), "oncelog_replication_bytes_out_total",
                                     topic="both") > 0 for u in pages), 10,
                   "both brokers serving a follower's fetches")
        assert _sum(pages, "oncelog_leader_partitions") == 6

        cluster.kill(2)
        page = urls[1]

        def settled():
            fams = families(page)
            return fams if (value(fams, "oncelog_active_controller") == 1
                            and value(fams, "oncelog_under_replicated_partitions") == 2
                            and value(fams, "oncelog_offline_partitions") == on_two) else None

        fams = wait_until(settled, 30, "broker 1 reporting the partitions broker 2 left")
        assert value(fams, "oncelog_leader_partitions") == 2 + 4 - on_two
        assert value(fams, "oncelog_under_min_isr_partitions") == 0  # min.insync.replicas 1
