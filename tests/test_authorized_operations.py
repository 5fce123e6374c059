"""Authorized operations (KIP-430) in Metadata, DescribeCluster and DescribeGroups: omitted
(Int.MinValue) unless asked; asked, every operation the resource type supports without an
authorizer (as Kafka), and with ACLs those the principal is allowed. Through confluent-kafka's
AdminClient (describe_cluster / describe_topics / describe_consumer_groups with
include_authorized_operations=True) and the wire."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient
from support.raw_wire import RawConnection
from support.security import USERS, Op, R, allow, creds, grant, raw_login, sasl_config

from oncelog import Admin
from oncelog.client import NewTopic
from oncelog.protocol import ApiKey, make, request_module
from oncelog.server.embedded import EmbeddedBroker

TOPIC_OPS = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
             AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
             AclOperation.ALTER_CONFIGS}
GROUP_OPS = {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE,
             AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
CLUSTER_OPS = {AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
               AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
               AclOperation.DESCRIBE}
OMITTED = -(2**31)


def bits(ops) -> int:
    return sum(1 << op.value for op in ops)


def describe_all(admin: AdminClient, group: str = "nobody-group"):
    cluster = admin.describe_cluster(include_authorized_operations=True).result()
    topics = admin.describe_topics(TopicCollection(["ops-topic"]),
                                   include_authorized_operations=True)
    groups = admin.describe_consumer_groups([group], include_authorized_operations=True)
    return (set(cluster.authorized_operations or ()),
            set(topics["ops-topic"].result().authorized_operations or ()),
            set(groups[group].result().authorized_operations or ()))


@pytest.fixture
def plain_broker(tmp_path):
    with EmbeddedBroker(data_dir=tmp_path / "data",
                        config={"offsets.topic.num.partitions": "2"}) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("ops-topic")])
        yield b


def test_without_an_authorizer_every_supported_operation(plain_broker):
    admin = AdminClient({"bootstrap.servers": plain_broker.bootstrap_servers})
    assert describe_all(admin) == (CLUSTER_OPS, TOPIC_OPS, GROUP_OPS)
    # Not asked: omitted.
    assert admin.describe_cluster().result().authorized_operations is None
    assert admin.describe_topics(TopicCollection(["ops-topic"]))["ops-topic"].result() \
        .authorized_operations is None


def test_our_admin_without_an_authorizer(plain_broker):
    with Admin(bootstrap_servers=plain_broker.bootstrap_servers) as admin:
        assert admin.describe_cluster().authorized_operations is None
        assert {op.name for op in admin.describe_cluster(
            include_authorized_operations=True).authorized_operations} == {
            op.name for op in CLUSTER_OPS}
        assert admin.describe_topics(["ops-topic"])["ops-topic"].authorized_operations is None
        described = admin.describe_topics(["ops-topic"], include_authorized_operations=True)
        assert {op.name for op in described["ops-topic"].authorized_operations} == {
            op.name for op in TOPIC_OPS}


def test_on_the_wire_the_bit_fields_and_the_default(plain_broker):
    with RawConnection(plain_broker.bootstrap_servers) as conn:
        md = request_module(ApiKey.METADATA, 10)
        r = conn.request(make(md.MetadataRequest, topics=(make(
            md.MetadataRequestTopic, name="ops-topic", topic_id=None),),
            allow_auto_topic_creation=False, include_cluster_authorized_operations=True,
            include_topic_authorized_operations=True))
        assert r.cluster_authorized_operations == bits(CLUSTER_OPS)
        assert r.topics[0].topic_authorized_operations == bits(TOPIC_OPS)
        r = conn.request(make(md.MetadataRequest, topics=None, allow_auto_topic_creation=False,
                              include_cluster_authorized_operations=False,
                              include_topic_authorized_operations=False))
        assert r.cluster_authorized_operations == OMITTED
        assert {t.topic_authorized_operations for t in r.topics} == {OMITTED}
        dc = request_module(ApiKey.DESCRIBE_CLUSTER, 1)
        r = conn.request(make(dc.DescribeClusterRequest,
                              include_cluster_authorized_operations=False, endpoint_type=1))
        assert r.cluster_authorized_operations == OMITTED


def test_with_acls_the_operations_the_principal_is_allowed(tmp_path):
    with EmbeddedBroker(data_dir=tmp_path / "data", config=sasl_config(tmp_path)) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                   sasl_mechanism="PLAIN", sasl_plain_username="admin",
                   sasl_plain_password=USERS["admin"]) as admin:
            admin.create_topics([NewTopic("ops-topic")])

        def client(user):
            return AdminClient({"bootstrap.servers": b.bootstrap_servers,
                                "security.protocol": "SASL_PLAINTEXT",
                                "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
                                "sasl.password": USERS[user]})

        # A super user may do everything.
        assert describe_all(client("admin"), "alices-group") == (
            CLUSTER_OPS, TOPIC_OPS, GROUP_OPS)
        grant(b, allow("User:alice", R.TOPIC, "ops-topic", Op.READ),
              allow("User:alice", R.GROUP, "alices-group", Op.READ),
              allow("User:alice", R.CLUSTER, "kafka-cluster", Op.DESCRIBE),
              allow("User:alice", R.CLUSTER, "kafka-cluster", Op.IDEMPOTENT_WRITE))
        assert describe_all(client("alice"), "alices-group") == (
            {AclOperation.DESCRIBE, AclOperation.IDEMPOTENT_WRITE},
            {AclOperation.READ, AclOperation.DESCRIBE},  # Read implies Describe
            {AclOperation.READ, AclOperation.DESCRIBE})
        # Our describe_topics reads the configs too: DescribeConfigs on the topic.
        grant(b, allow("User:alice", R.TOPIC, "ops-topic", Op.DESCRIBE_CONFIGS))
        with Admin(bootstrap_servers=b.bootstrap_servers, **creds("alice")) as ours:
            assert ours.describe_cluster(True).authorized_operations == {
                Op.DESCRIBE, Op.IDEMPOTENT_WRITE}
            assert ours.describe_topics(["ops-topic"], True)["ops-topic"] \
                .authorized_operations == {Op.READ, Op.DESCRIBE, Op.DESCRIBE_CONFIGS}
        # Without Describe on the cluster: 0, as Kafka.
        with raw_login(b, "bob") as bob:
            dc = request_module(ApiKey.DESCRIBE_CLUSTER, 1)
            r = bob.request(make(dc.DescribeClusterRequest,
                                 include_cluster_authorized_operations=True, endpoint_type=1))
            assert r.cluster_authorized_operations == 0
            md = request_module(ApiKey.METADATA, 10)
            r = bob.request(make(md.MetadataRequest, topics=(make(
                md.MetadataRequestTopic, name="ops-topic", topic_id=None),),
                allow_auto_topic_creation=False, include_cluster_authorized_operations=True,
                include_topic_authorized_operations=True))
            assert r.cluster_authorized_operations == 0
            # A topic bob may not describe: refused, its operations omitted.
            assert (r.topics[0].error_code, r.topics[0].topic_authorized_operations) == (
                29, OMITTED)
