"""Fetch by topic id in cluster mode (KIP-516, KIP-951): three broker processes on a real
ZooKeeper, replication factor 3. The followers keep replicating with their own Fetch v12; a
client fetching by id from the leader gets every record, and one that asks a follower gets
NOT_LEADER_OR_FOLLOWER with the leader, its epoch and its endpoint (Fetch v16+)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from support.raw_wire import (
    BASE_TIMESTAMP,
    RawConnection,
    fetch_by_id_request,
    metadata_request,
    produce,
)

from oncelog import Admin, NewTopic
from oncelog.harness.local_cluster import LocalCluster
from oncelog.harness.zookeeper import ZooKeeperServer
from oncelog.records import build_batch, decode_batch, iter_batches

pytest.importorskip("kazoo")  # the brokers need it

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

NOT_LEADER_OR_FOLLOWER = 6


def test_fetch_by_id_from_the_leader_and_a_follower(zookeeper_server: ZooKeeperServer,
                                                     tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", 3,
                           zookeeper=f"{zookeeper_server.connect_string}/t-{uuid.uuid4().hex[:10]}",
                           broker_settings={"zookeeper.session.timeout.ms": 2000},
                           die_with_parent=True)
    with cluster.start():
        topic = f"ids-{uuid.uuid4().hex[:8]}"
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(topic, 1, replication_factor=3)])
        cluster.wait_for_isr(topic, 0, 3, 30)
        leader = cluster.leader_of(topic, 0)
        addresses = cluster.addresses
        with RawConnection(addresses[leader]) as conn:
            meta = conn.request(metadata_request([topic])).topics[0]
            tid, epoch = meta.topic_id, meta.partitions[0].leader_epoch
            batch = build_batch([(None, f"v{i}".encode(), [], BASE_TIMESTAMP + i)
                                 for i in range(10)])
            assert produce(conn, topic, 0, batch).error_code == 0  # acks=all: replicated
            pd = conn.request(fetch_by_id_request(tid, {0: 0})).responses[0].partitions[0]
        assert pd.error_code == 0 and pd.high_watermark == 10
        values = [r.value for pos, _h in iter_batches(pd.records)
                  for r in decode_batch(pd.records, pos)[1]]
        assert values == [f"v{i}".encode() for i in range(10)]
        follower = next(n for n in addresses if n != leader)
        with RawConnection(addresses[follower]) as conn:
            r = conn.request(fetch_by_id_request(tid, {0: 0}, version=16))
        pd = r.responses[0].partitions[0]
        assert pd.error_code == NOT_LEADER_OR_FOLLOWER and not pd.records
        assert (pd.current_leader.leader_id, pd.current_leader.leader_epoch) == (leader, epoch)
        assert [f"{n.host}:{n.port}" for n in r.node_endpoints] == [addresses[leader]]
        assert [n.node_id for n in r.node_endpoints] == [leader]
