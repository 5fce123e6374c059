"""kafka-topics.sh's health filters and ``cluster info`` on a 3-broker cluster with a broker
stopped: ``--under-replicated-partitions`` (fewer in-sync replicas than replicas),
``--at-min-isr-partitions`` (exactly min.insync.replicas), ``--unavailable-partitions`` (no live
leader), and ``cluster info`` listing the brokers that are registered."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.cli import oncelog
from support.zookeeper import require_zookeeper

from oncelog import Admin, NewTopic
from oncelog.harness.local_cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def test_health_filters_and_cluster_info_with_a_broker_down(tmp_path: Path):
    require_zookeeper()
    with LocalCluster(tmp_path / "cluster", 3, die_with_parent=True,
                      zookeeper_fsync=False) as cluster:
        bs = ["--bootstrap-server", cluster.bootstrap_servers]
        info = json.loads(oncelog("cluster", "info", *bs, "--output", "json",
                                  "--no-api-versions").stdout)
        assert [b["id"] for b in info["brokers"]] == [1, 2, 3]
        assert info["controller_id"] in (1, 2, 3) and "api_versions" not in info["brokers"][0]
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("kf-rf3", 1, replication_factor=3,
                                          config={"min.insync.replicas": "2"}),
                                 NewTopic("kf-rf1", 3, replication_factor=1)])
        cluster.wait_for_isr("kf-rf3", 0, 3)
        alone = [p for p, d in cluster.describe("kf-rf1").items() if list(d.replicas) == [3]]
        assert alone  # three partitions, one replica each, spread over three brokers
        topics = ["--topic", "kf-rf3", "--topic", "kf-rf1"]
        for flag in ("--under-replicated-partitions", "--unavailable-partitions"):  # all well
            assert oncelog("topics", "--describe", *bs, *topics, flag).stdout == "", flag
        # kf-rf3: 3 in sync, min 2 (kf-rf1's partitions are at their minimum, 1, throughout)
        assert oncelog("topics", "--describe", *bs, "--topic", "kf-rf3",
                       "--at-min-isr-partitions").stdout == ""

        cluster.stop_broker(3)
        cluster.wait_for_isr("kf-rf3", 0, 2)
        deadline = time.monotonic() + 30
        while [b["id"] for b in json.loads(oncelog(
                "cluster", "info", *bs, "--output", "json", "--no-api-versions").stdout
                )["brokers"]] != [1, 2]:
            assert time.monotonic() < deadline, "broker 3 still listed"
            time.sleep(0.5)
        under = oncelog("topics", "--describe", *bs, *topics,
                        "--under-replicated-partitions").stdout.splitlines()
        assert [line.split("\t")[1:3] for line in under] == [
            ["Topic: kf-rf3", "Partition: 0"]]
        assert "\tReplicas: " in under[0] and "\tIsr: " in under[0]
        at_min = oncelog("topics", "--describe", *bs, "--topic", "kf-rf3",
                         "--at-min-isr-partitions").stdout.splitlines()
        assert [line.split("\t")[1:3] for line in at_min] == [["Topic: kf-rf3", "Partition: 0"]]
        unavailable = oncelog("topics", "--describe", *bs, *topics,
                              "--unavailable-partitions").stdout.splitlines()
        assert [line.split("\t")[1:3] for line in unavailable] == [
            ["Topic: kf-rf1", f"Partition: {p}"] for p in sorted(alone)]
