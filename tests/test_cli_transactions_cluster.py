"""``oncelog transactions`` on a 3-broker cluster: the Coordinator column of ``list`` and the
CoordinatorId of ``describe`` name the leader of each transactional id's partition of
__transaction_state (Kafka's kafka-transactions.sh columns), and ``find-hanging --broker-id``
searches that broker's replicas."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.cli import oncelog
from support.raw_wire import RawConnection, idempotent_batch, init_producer_id_request, produce
from support.zookeeper import require_zookeeper

from oncelog import Admin, NewTopic, Producer
from oncelog.harness.local_cluster import LocalCluster
from oncelog.server.topics import TRANSACTION_STATE, coordinator_partition

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SETTINGS = {"transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "3"}


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("\t")][:-1]


def test_the_coordinator_columns_name_each_ids_coordinator(tmp_path: Path):
    require_zookeeper()
    with LocalCluster(tmp_path / "cluster", 3, broker_settings=SETTINGS, die_with_parent=True,
                      zookeeper_fsync=False) as cluster:
        bs = cluster.bootstrap_servers
        with Admin(bootstrap_servers=bs) as admin:
            admin.create_topics([NewTopic("ct", 3, replication_factor=1)])
        # ids whose partitions of the transaction log differ (so, once the log's leaders are
        # spread, coordinators too)
        ids = {coordinator_partition(f"c-{n}", 3): f"c-{n}" for n in range(40)}
        producers = []
        try:
            for txn_id in ids.values():
                p = Producer(bootstrap_servers=bs, transactional_id=txn_id)
                producers.append(p)
                p.init_transactions()
                p.begin_transaction()
                p.send("ct", b"x", partition=0).result()
            expected = {txn_id: cluster.leader_of(TRANSACTION_STATE, part)
                        for part, txn_id in ids.items()}
            assert len(set(expected.values())) > 1  # coordinators on more than one broker
            lines = oncelog("transactions", "list", "--bootstrap-server", bs,
                            "--state", "Ongoing").stdout.splitlines()
            assert cells(lines[0]) == ["TransactionalId", "Coordinator", "ProducerId",
                                       "TransactionState"]
            listed = {r[0]: int(r[1]) for r in map(cells, lines[1:])}
            assert listed == expected
            for txn_id, leader in expected.items():
                row = cells(oncelog("transactions", "describe", "--transactional-id", txn_id,
                                    "--bootstrap-server", bs).stdout.splitlines()[1])
                assert (row[0], row[1], row[4]) == (str(leader), txn_id, "Ongoing")
            # a hanging transaction in ct-1, searched for on its leader and elsewhere
            with Admin(bootstrap_servers=bs) as admin:
                leader = admin.describe_topics(["ct"])["ct"].partitions[1].leader
            old = int(time.time() * 1000) - 20 * 60_000
            with RawConnection(cluster.addresses[leader]) as conn:
                pid = conn.request(init_producer_id_request()).producer_id
                produce(conn, "ct", 1, idempotent_batch(pid, 0, 0, [b"h"], timestamp=old,
                                                        is_transactional=True))
            for broker_id in cluster.running():
                lines = oncelog("transactions", "find-hanging", "--broker-id", str(broker_id),
                                "--bootstrap-server", bs).stdout.splitlines()
                rows = [cells(line)[:3] for line in lines[1:]]
                assert rows == ([["ct", "1", str(pid)]] if broker_id == leader else []), \
                    (broker_id, leader, lines)
        finally:
            for p in producers:
                p.close(5)
