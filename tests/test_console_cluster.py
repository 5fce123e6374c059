"""The web console of a ZooKeeper cluster's brokers (two broker processes, each started with
``--console-port``): the Brokers page lists the live brokers, the controller and every
partition's leader, replicas and ISR; each broker shows the offsets of the replicas it hosts."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from support.console import ConsoleBrokerProcess, get, rows
from support.waiting import wait_until

from oncelog import Admin, NewTopic, Producer
from oncelog.harness.zookeeper import ZooKeeperServer

pytest.importorskip("kazoo")  # the brokers need it

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SETTINGS = {"zookeeper.session.timeout.ms": "2000", "replica.lag.time.max.ms": "2000",
            "offsets.topic.replication.factor": "2", "offsets.topic.num.partitions": "2",
            "transaction.state.log.replication.factor": "2",
            "transaction.state.log.num.partitions": "2"}


def page(url: str) -> str:
    status, _h, body = get(url)
    assert status == 200, body
    return body


def test_brokers_page_shows_the_cluster_and_its_leaders(zookeeper_server: ZooKeeperServer,
                                                        tmp_path: Path):
    connect = f"{zookeeper_server.connect_string}/t-{uuid.uuid4().hex[:10]}"
    with ConsoleBrokerProcess(tmp_path / "b1", settings=SETTINGS, node_id=1,
                              zookeeper=connect, die_with_parent=True) as b1, \
            ConsoleBrokerProcess(tmp_path / "b2", settings=SETTINGS, node_id=2,
                                 zookeeper=connect, die_with_parent=True) as b2:
        with Admin(bootstrap_servers=b1.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("replicated", 2, replication_factor=2)])

        def settled(url: str) -> str | None:
            body = page(url + "/brokers")
            led = [rows(body, topic="replicated", partition=p) for p in (0, 1)]
            ok = rows(body, node_id=1) and rows(body, node_id=2) and all(
                r and r[0]["data-leader"] in ("1", "2") and
                sorted(r[0]["data-isr"].split(",")) == ["1", "2"] for r in led)
            return body if ok else None

        body = wait_until(lambda: settled(b1.console_url), 30, "both brokers and an ISR of 2")
        assert "controller" in body and "this broker" in body
        wait_until(lambda: settled(b2.console_url), 30, "broker 2's view")
        with Producer(bootstrap_servers=b1.bootstrap_servers, acks="all") as p:
            for i in range(6):
                p.send("replicated", value=f"r{i}", partition=i % 2)
        for b in (b1, b2):  # each hosts a replica of both partitions
            wait_until(lambda b=b: all(
                (r := rows(page(b.console_url + "/topics"), topic="replicated", partition=p))
                and r[0].get("data-hw") == "3" for p in (0, 1)), 30, "the replicas' HW")
