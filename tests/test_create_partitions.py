"""CreatePartitions (API 37) against a broker process: through confluent-kafka's AdminClient, our
Admin and ``oncelog topics add-partitions``; Kafka's refusals; producers and consumers use the
new partitions after their next Metadata; the count survives a restart."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from support.cli import oncelog
from support.interop import confluent_create_topic

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog import NewPartitions as OurNewPartitions
from oncelog.errors import (
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    UnknownTopicOrPartitionError,
)
from oncelog.harness.broker_process import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("partitions") / "data") as b:
        yield b


def _partitions(bootstrap: str, topic: str) -> int:
    with Admin(bootstrap_servers=bootstrap) as admin:
        return len(admin.describe_topics([topic])[topic].partitions)


def _node_id(bootstrap: str) -> int:
    with Admin(bootstrap_servers=bootstrap) as admin:
        (node,) = admin.describe_cluster().nodes
        return node


def _error(futures: dict, topic: str) -> CKError:
    with pytest.raises(KafkaException) as info:
        futures[topic].result(timeout=30)
    return info.value.args[0]


@pytest.mark.slow  # a group join (the initial rebalance delay)
def test_confluent_admin_grows_a_topic_and_clients_use_the_new_partitions(broker):
    bootstrap = broker.bootstrap_servers
    confluent_create_topic(bootstrap, "grow", 1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions("grow", 3)], operation_timeout=10)["grow"].result(30)
    assert _partitions(bootstrap, "grow") == 3
    # librdkafka's producer learns the new partitions from Metadata and writes to the last.
    producer = CKProducer({"bootstrap.servers": bootstrap, "topic.metadata.refresh.interval.ms":
                           1000})
    producer.produce("grow", value=b"in-2", partition=2)
    assert producer.flush(30) == 0
    consumer = CKConsumer({"bootstrap.servers": bootstrap, "group.id": "grow-readers",
                           "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe(["grow"])
        got = None
        for _ in range(100):
            msg = consumer.poll(0.3)
            if msg is not None and not msg.error():
                got = msg
                break
        assert got is not None and (got.partition(), got.value()) == (2, b"in-2")
    finally:
        consumer.close()
    # Our producer and consumer too.
    with Producer(bootstrap_servers=bootstrap) as ours:
        ours.send("grow", b"ours-1", partition=1).result(timeout=30)
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("grow", 1)])
        records = []
        for _ in range(50):
            records += c.poll(0.2)
            if records:
                break
        assert [r.value for r in records] == [b"ours-1"]


def test_kafkas_refusals(broker):
    bootstrap = broker.bootstrap_servers
    confluent_create_topic(bootstrap, "refuse", 2)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    same = admin.create_partitions([NewPartitions("refuse", 2)], operation_timeout=10)
    err = _error(same, "refuse")
    assert err.code() == CKError.INVALID_PARTITIONS
    assert "already has 2 partition(s)" in err.str()
    fewer = admin.create_partitions([NewPartitions("refuse", 1)], operation_timeout=10)
    assert _error(fewer, "refuse").code() == CKError.INVALID_PARTITIONS
    unknown = admin.create_partitions([NewPartitions("no-such-topic", 4)], operation_timeout=10)
    assert _error(unknown, "no-such-topic").code() == CKError.UNKNOWN_TOPIC_OR_PART
    too_few = admin.create_partitions([NewPartitions("refuse", 4, replica_assignment=[[0]])],
                                      operation_timeout=10)
    err = _error(too_few, "refuse")
    assert err.code() == CKError.INVALID_REPLICA_ASSIGNMENT
    assert "Attempted to add 2 additional partition(s), but only 1" in err.str()
    bad_broker = admin.create_partitions([NewPartitions("refuse", 3, replica_assignment=[[7]])],
                                         operation_timeout=10)
    err = _error(bad_broker, "refuse")
    assert err.code() == CKError.INVALID_REPLICA_ASSIGNMENT and "broker 7" in err.str()
    two_replicas = admin.create_partitions(
        [NewPartitions("refuse", 3, replica_assignment=[[1, 1]])], operation_timeout=10)
    assert _error(two_replicas, "refuse").code() == CKError.INVALID_REPLICA_ASSIGNMENT
    # validate_only checks and changes nothing.
    admin.create_partitions([NewPartitions("refuse", 5)], validate_only=True,
                            operation_timeout=10)["refuse"].result(30)
    assert _partitions(bootstrap, "refuse") == 2
    # A manual assignment naming this broker is taken.
    node = _node_id(bootstrap)
    admin.create_partitions([NewPartitions("refuse", 3, replica_assignment=[[node]])],
                            operation_timeout=10)["refuse"].result(30)
    assert _partitions(bootstrap, "refuse") == 3


def test_internal_topics_keep_their_partition_count(broker):
    """The coordinators map an id to a partition by the count: growing __consumer_offsets
    would move every group's coordinator and lose its offsets."""
    bootstrap = broker.bootstrap_servers
    confluent_create_topic(bootstrap, "for-offsets", 1)
    consumer = CKConsumer({"bootstrap.servers": bootstrap, "group.id": "makes-offsets"})
    try:  # a commit creates __consumer_offsets
        consumer.commit(offsets=[CKTopicPartition("for-offsets", 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_partitions([NewPartitions("__consumer_offsets", 100)],
                                      operation_timeout=10)
    assert _error(futures, "__consumer_offsets").code() == CKError.TOPIC_EXCEPTION


def test_our_admin_and_the_cli(broker):
    bootstrap = broker.bootstrap_servers
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic("ours", 1)])
        admin.create_partitions({"ours": 2})
        assert _partitions(bootstrap, "ours") == 2
        admin.create_partitions({"ours": OurNewPartitions(3, [[_node_id(bootstrap)]])})
        assert _partitions(bootstrap, "ours") == 3
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"ours": 3})
        with pytest.raises(InvalidReplicaAssignmentError):
            admin.create_partitions({"ours": OurNewPartitions(4, [[5]])})
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.create_partitions({"nothing-here": 2})
        admin.create_partitions({"ours": 9}, validate_only=True)
        assert _partitions(bootstrap, "ours") == 3
    out = oncelog("topics", "add-partitions", "--bootstrap-server", bootstrap, "--topic", "ours",
                  "--partitions", "5")
    assert "now has 5 partitions" in out.stdout
    oncelog("topics", "alter", "--bootstrap-server", bootstrap, "--topic", "ours",
            "--partitions", "6", "--replica-assignment", str(_node_id(bootstrap)))
    assert _partitions(bootstrap, "ours") == 6
    failed = oncelog("topics", "add-partitions", "--bootstrap-server", bootstrap, "--topic",
                     "ours", "--partitions", "2", check=False)
    assert failed.returncode == 1 and "INVALID_PARTITIONS" in failed.stderr
    described = oncelog("topics", "describe", "--bootstrap-server", bootstrap, "--topic", "ours")
    assert "PartitionCount: 6" in described.stdout


def test_the_new_count_survives_a_restart(tmp_path):
    with BrokerProcess(tmp_path / "data") as b:
        confluent_create_topic(b.bootstrap_servers, "kept", 1)
        with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
            admin.create_partitions({"kept": 4})
        with Producer(bootstrap_servers=b.bootstrap_servers) as p:
            p.send("kept", b"three", partition=3).result(timeout=30)
        b.restart()
        assert _partitions(b.bootstrap_servers, "kept") == 4
        with Consumer(bootstrap_servers=b.bootstrap_servers, auto_offset_reset="earliest") as c:
            c.assign([TopicPartition("kept", 3)])
            records = []
            for _ in range(50):
                records += c.poll(0.2)
                if records:
                    break
            assert [r.value for r in records] == [b"three"]


@pytest.mark.slow  # a group join (the initial rebalance delay)
def test_a_subscribed_group_is_assigned_the_new_partitions(broker):
    """Kafka's leader rejoins when its metadata shows other partition counts than its
    assignment was made with (at the next metadata refresh, metadata.max.age.ms)."""
    bootstrap = broker.bootstrap_servers
    confluent_create_topic(bootstrap, "grow-group", 1)
    with Consumer(bootstrap_servers=bootstrap, group_id="grow-group-readers",
                  auto_offset_reset="earliest", metadata_max_age_ms=500) as c:
        c.subscribe(["grow-group"])
        for _ in range(50):
            c.poll(0.1)
            if c.assignment():
                break
        assert c.assignment() == {TopicPartition("grow-group", 0)}
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_partitions({"grow-group": 2})
        with Producer(bootstrap_servers=bootstrap) as p:
            p.send("grow-group", b"new", partition=1).result(timeout=30)
        records: list = []
        for _ in range(100):
            records += c.poll(0.1)
            if records:
                break
        assert [(r.partition, r.value) for r in records] == [(1, b"new")]
        assert c.assignment() == {TopicPartition("grow-group", 0), TopicPartition("grow-group", 1)}
