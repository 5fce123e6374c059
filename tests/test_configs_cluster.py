"""Config changes in a ZooKeeper cluster of three brokers: a topic's overrides and the brokers'
dynamic default, altered through one broker, reach every broker (``/config/topics``,
``/config/brokers/<default>`` and the ``/config/changes`` notifications, as Kafka's ZooKeeper
mode), take effect on every replica, and outlive a broker's restart."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kazoo.client import KazooClient
from support.raw_wire import RawConnection
from support.waiting import wait_until

from oncelog import Admin, NewTopic
from oncelog.client.admin.admin_configs import AlterConfigOp
from oncelog.client.admin.admin_configs import ConfigResource as Resource
from oncelog.client.admin.admin_configs import ConfigSource as Source
from oncelog.harness.local_cluster import LocalCluster
from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import iter_batches

pytest.importorskip("kazoo")

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SETTINGS = {"zookeeper.session.timeout.ms": 2000, "replica.lag.time.max.ms": 2000}


@pytest.fixture
def cluster_and_zookeeper(zookeeper_server, tmp_path):
    chroot = f"/t-{uuid.uuid4().hex[:10]}"
    connect = zookeeper_server.connect_string + chroot
    c = LocalCluster(tmp_path / "cluster", 3, zookeeper=connect, broker_settings=SETTINGS,
                     die_with_parent=True)
    with c.start():
        yield c, connect


def topic_configs_at(address: str, topic: str) -> dict[str, tuple[str, int]]:
    """DescribeConfigs of the topic asked of one broker: name -> (value, source)."""
    mod = request_module(ApiKey.DESCRIBE_CONFIGS, 4)
    with RawConnection(address) as conn:
        (result,) = conn.request(make(
            mod.DescribeConfigsRequest, include_synonyms=False, include_documentation=False,
            resources=(make(mod.DescribeConfigsResource, resource_type=2, resource_name=topic,
                            configuration_keys=None),))).results
    return {c.name: (c.value, int(c.config_source)) for c in result.configs}


def test_an_alter_through_one_broker_reaches_every_broker(cluster_and_zookeeper):
    cluster, connect = cluster_and_zookeeper
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap_servers=cluster.addresses[1]) as admin:
        admin.create_topics([NewTopic(topic, 1, replication_factor=3)])
        cluster.wait_for_isr(topic, 0, 3, 30)
        admin.incremental_alter_configs({Resource.topic(topic): [
            AlterConfigOp("compression.type", "lz4"),
            AlterConfigOp("cleanup.policy", "compact,delete"),
            AlterConfigOp("retention.ms", "86400000")]})
        admin.alter_configs({Resource.broker_default(): {"log.retention.bytes": "5000000"}})

    for node, address in cluster.addresses.items():
        # The topic's change and the brokers' default are two notifications: wait for both.
        wait_until(lambda a=address: (
            topic_configs_at(a, topic)["compression.type"] == ("lz4", Source.DYNAMIC_TOPIC_CONFIG)
            and topic_configs_at(a, topic)["retention.bytes"] ==
            ("5000000", Source.DYNAMIC_DEFAULT_BROKER_CONFIG)), 30,
            f"broker {node} to see the changes")
        got = topic_configs_at(address, topic)
        assert got["cleanup.policy"] == ("compact,delete", Source.DYNAMIC_TOPIC_CONFIG)
        meta = json.loads(Path(cluster.brokers[node].data_dir, ".topics",
                               f"{topic}.json").read_text())
        assert meta["configs"]["retention.ms"] == "86400000"  # kept by every replica

    # Every replica stores what the leader recompressed.
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                  "compression.type": "none"})
    failed = []
    for i in range(50):  # keyed: the topic is compacted now, which refuses keyless records
        p.produce(topic, b"value-%d" % i * 10, key=b"k-%d" % i,
                  on_delivery=lambda err, _m: err is not None and failed.append(err))
    assert p.flush(30) == 0 and not failed, failed[:3]

    def codecs(node: int) -> set[int]:
        found: set[int] = set()
        for path in Path(cluster.brokers[node].data_dir, f"{topic}-0").glob("*.log"):
            found |= {h.attributes & 7 for _pos, h in iter_batches(path.read_bytes())}
        return found

    for node in cluster.addresses:
        wait_until(lambda n=node: codecs(n) == {3}, 30, f"broker {node}'s replica")

    # The configs live in ZooKeeper as Kafka keeps them, with change notifications.
    zk = KazooClient(hosts=connect)
    zk.start()
    try:
        data, _ = zk.get(f"/config/topics/{topic}")
        assert json.loads(data)["config"]["compression.type"] == "lz4"
        data, _ = zk.get("/config/brokers/<default>")
        assert json.loads(data) == {"version": 1, "config": {"log.retention.bytes": "5000000"}}
        paths = set()
        for child in zk.get_children("/config/changes"):
            assert child.startswith("config_change_")
            paths.add(json.loads(zk.get(f"/config/changes/{child}")[0])["entity_path"])
        assert {f"topics/{topic}", "brokers/<default>"} <= paths
    finally:
        zk.stop()
        zk.close()

    # A restarted broker takes them up again from ZooKeeper.
    cluster.stop_broker(3)
    cluster.start_broker(3)
    got = topic_configs_at(cluster.addresses[3], topic)
    assert got["compression.type"][0] == "lz4" and got["retention.bytes"][0] == "5000000"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.alter_configs({Resource.broker(3): {"log.retention.bytes": "7000000"}})
        described = admin.describe_configs([Resource.broker(n) for n in (1, 2, 3)])
    assert described[Resource.broker(3)]["log.retention.bytes"].source == \
        Source.DYNAMIC_BROKER_CONFIG
    assert described[Resource.broker(1)]["log.retention.bytes"].value == "5000000"
