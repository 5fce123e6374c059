"""Admin: create, list, describe and delete topics; broker errors as oncelog.errors classes.

Against the EmbeddedBroker: librdkafka's mock cluster has no CreateTopics/DeleteTopics/
DescribeConfigs.
"""

from __future__ import annotations

import pytest

from oncelog import Admin, NewTopic, Producer
from oncelog.client import KafkaTimeoutError
from oncelog.errors import (
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)


@pytest.fixture
def admin(embedded_broker):
    with Admin(bootstrap_servers=embedded_broker.bootstrap_servers) as a:
        yield a


def test_describe_cluster_names_the_broker_and_the_cluster(admin, embedded_broker):
    """Kafka's describeCluster: the live brokers, the controller and the cluster id (what the
    local-cluster harness waits on to see every broker registered)."""
    described = admin.describe_cluster()
    host, port = embedded_broker.bootstrap_servers.rsplit(":", 1)
    assert [(n.host, n.port) for n in described.nodes.values()] == [(host, int(port))]
    assert described.controller_id in described.nodes
    assert described.cluster_id


def test_create_list_describe_delete(admin):
    admin.create_topics([NewTopic("orders", num_partitions=3, replication_factor=1,
                                  config={"retention.ms": "3600000"}),
                         NewTopic("audit")])
    assert {"orders", "audit"} <= set(admin.list_topics())
    described = admin.describe_topics(["orders", "audit"])
    orders = described["orders"]
    assert orders.name == "orders" and orders.internal is False
    assert [p.partition for p in orders.partitions] == [0, 1, 2]
    assert all(p.leader >= 0 and p.replicas == (p.leader,) for p in orders.partitions)
    assert orders.config["retention.ms"] == "3600000"
    assert len(described["audit"].partitions) == 1
    admin.delete_topics(["orders"])
    assert "orders" not in admin.list_topics()
    assert "audit" in admin.list_topics()


def test_creating_an_existing_topic_raises_topic_already_exists(admin):
    admin.create_topics([NewTopic("twice")])
    with pytest.raises(TopicAlreadyExistsError, match="twice"):
        admin.create_topics([NewTopic("twice")])


def test_the_other_topics_of_a_request_are_still_created(admin):
    admin.create_topics([NewTopic("first")])
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([NewTopic("first"), NewTopic("second")])
    assert {"first", "second"} <= set(admin.list_topics())


def test_an_invalid_topic_name_raises_invalid_topic(admin):
    with pytest.raises(InvalidTopicError):
        admin.create_topics([NewTopic("no/slashes")])


def test_validate_only_creates_nothing(admin):
    admin.create_topics([NewTopic("dry-run", num_partitions=2)], validate_only=True)
    assert "dry-run" not in admin.list_topics()


def test_unknown_topics_raise_unknown_topic_or_partition(admin):
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topics(["never-created"])
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_topics(["never-created"])


def test_list_topics_sees_topics_a_producer_created(embedded_broker, admin):
    with Producer(bootstrap_servers=embedded_broker.bootstrap_servers) as producer:
        producer.send("auto-created", b"v").result(10)
    assert "auto-created" in admin.list_topics()


def test_admin_calls_time_out_when_no_broker_answers():
    with Admin(bootstrap_servers="127.0.0.1:1", default_api_timeout_ms=300,
               reconnect_backoff_ms=10) as a, pytest.raises(KafkaTimeoutError):
        a.list_topics()


def test_an_api_the_broker_lacks_is_unsupported_version(mock_cluster):
    with Admin(bootstrap_servers=mock_cluster.bootstrap_servers) as a:
        assert isinstance(a.list_topics(), list)
        with pytest.raises(UnsupportedVersionError, match="CREATE_TOPICS"):
            a.create_topics([NewTopic("t")])
