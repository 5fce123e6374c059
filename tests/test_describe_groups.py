"""Describing consumer groups (Kafka's Admin.describeConsumerGroups, DescribeGroups v5):
a group of two confluent-kafka consumers described by our Admin, by confluent-kafka's
AdminClient and by ``oncelog consumer-groups --describe`` (Kafka's offsets, members and state
views); authorized operations (KIP-430) without and with ACLs; a group nobody knows (Dead) and
one the caller may not describe. Against a broker process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient
from support.security import USERS, Op, R, allow, creds, grant, sasl_config

from oncelog import Admin
from oncelog.client import NewTopic, TopicPartition
from oncelog.errors import GroupAuthorizationFailedError
from oncelog.harness.broker_process import BrokerProcess

try:
    from confluent_kafka import ConsumerGroupState
except ImportError:  # older confluent-kafka
    from confluent_kafka.admin import ConsumerGroupState  # type: ignore

pytestmark = pytest.mark.slow  # a broker process and a rebalance of two consumers

TOPIC, GROUP, PARTITIONS = "dg", "two", 4
GROUP_OPS = {Op.READ, Op.DESCRIBE, Op.DELETE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS}
PRODUCED, COMMITTED = 3, 1  # records per partition; the offset each consumer commits


def cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oncelog.cli.main", "consumer-groups",
                           "--bootstrap-server", bootstrap, "--describe", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def join_both(consumers, timeout: float = 30.0) -> None:
    """Poll both consumers until each holds partitions and together all of them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.1)
        owned = [c.assignment() for c in consumers]
        if all(owned) and sum(len(o) for o in owned) == PARTITIONS:
            return
    raise AssertionError(f"the group did not settle: {[c.assignment() for c in consumers]}")


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    """Group "two": two consumers sharing the 4 partitions of "dg" (3 records each), each
    having committed offset 1 of its partitions: lag 2 everywhere."""
    with BrokerProcess(tmp_path_factory.mktemp("dg") / "data", settings={
            "group.initial.rebalance.delay.ms": "0",
            "offsets.topic.num.partitions": "2"}) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS)])
        producer = Producer({"bootstrap.servers": b.bootstrap_servers})
        for p in range(PARTITIONS):
            for i in range(PRODUCED):
                producer.produce(TOPIC, value=b"v%d" % i, partition=p)
        assert producer.flush(30) == 0
        consumers = [Consumer({"bootstrap.servers": b.bootstrap_servers, "group.id": GROUP,
                               "client.id": f"member-{i}", "enable.auto.commit": False,
                               "session.timeout.ms": 10000})
                     for i in range(2)]
        try:
            for c in consumers:
                c.subscribe([TOPIC])
            join_both(consumers)
            for c in consumers:
                c.commit(offsets=[CkTopicPartition(TOPIC, tp.partition, COMMITTED)
                                  for tp in c.assignment()], asynchronous=False)
            yield b, consumers
        finally:
            for c in consumers:
                c.close()


def assignments(consumers) -> dict[str, frozenset[TopicPartition]]:
    """client id -> the partitions the consumer holds, as it sees them."""
    return {f"member-{i}": frozenset(TopicPartition(tp.topic, tp.partition)
                                     for tp in c.assignment())
            for i, c in enumerate(consumers)}


def test_our_admin_describes_a_stable_group(group):
    b, consumers = group
    with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
        d = admin.describe_consumer_groups([GROUP])[GROUP]
    assert (d.group_id, d.state, d.is_simple_consumer_group) == (GROUP, "Stable", False)
    assert d.partition_assignor == "range"  # librdkafka's first choice, range,roundrobin
    assert (d.coordinator.host, d.coordinator.port) == (b.host, b.port)
    assert d.authorized_operations is None  # not asked
    assert {m.client_id: m.assignment for m in d.members} == assignments(consumers)
    assert all(m.group_instance_id is None and m.member_id.startswith(m.client_id)
               and m.host.strip("/") == "127.0.0.1" for m in d.members)


def test_confluent_admin_sees_the_same_group(group):
    b, _ = group
    admin = AdminClient({"bootstrap.servers": b.bootstrap_servers})
    d = admin.describe_consumer_groups([GROUP])[GROUP].result(timeout=30)
    with Admin(bootstrap_servers=b.bootstrap_servers) as ours:
        mine = ours.describe_consumer_groups([GROUP])[GROUP]
    assert d.state == ConsumerGroupState.STABLE and d.partition_assignor == "range"
    assert {m.member_id: {TopicPartition(tp.topic, tp.partition)
                          for tp in m.assignment.topic_partitions} for m in d.members} == {
        m.member_id: set(m.assignment) for m in mine.members}
    assert d.coordinator.id == mine.coordinator.node_id


def test_authorized_operations_without_an_authorizer(group):
    b, _ = group
    with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
        described = admin.describe_consumer_groups([GROUP, "nobody"],
                                                   include_authorized_operations=True)
    assert described[GROUP].authorized_operations == GROUP_OPS
    assert described["nobody"].authorized_operations == GROUP_OPS


def test_an_unknown_group_is_dead(group):
    b, _ = group
    with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
        described = admin.describe_consumer_groups(["nobody", GROUP, "nobody"])
    assert list(described) == ["nobody", GROUP]  # one answer per group, in the order asked
    dead = described["nobody"]
    assert (dead.state, dead.members, dead.partition_assignor) == ("Dead", (), "")
    confluent = AdminClient({"bootstrap.servers": b.bootstrap_servers})  # kept: its futures
    d = confluent.describe_consumer_groups(["nobody"])["nobody"].result(timeout=30)
    assert d.state == ConsumerGroupState.DEAD and d.members == []


def test_list_offsets_and_committed_offsets(group):
    b, _ = group
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
        assert admin.list_consumer_group_offsets(GROUP) == dict.fromkeys(tps, COMMITTED)
        assert admin.list_consumer_group_offsets("nobody", tps[:1]) == {tps[0]: None}
        assert {tp: r.offset for tp, r in admin.list_offsets(
            dict.fromkeys(tps, -1)).items()} == dict.fromkeys(tps, PRODUCED)
        assert {tp: r.offset for tp, r in admin.list_offsets(
            dict.fromkeys(tps, -2)).items()} == dict.fromkeys(tps, 0)


def test_the_cli_prints_kafkas_offsets_view_with_lag(group):
    b, consumers = group
    out = cli(b.bootstrap_servers, "--group", GROUP)
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.splitlines() if line.strip()]
    assert lines[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET",
                        "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]
    with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
        members = {m.client_id: m for m in admin.describe_consumer_groups([GROUP])[GROUP]
                   .members}
    owner = {tp.partition: client for client, tps in assignments(consumers).items()
             for tp in tps}
    rows = {int(r[2]): r for r in lines[1:]}
    assert sorted(rows) == list(range(PARTITIONS))
    for p, r in rows.items():
        m = members[owner[p]]
        assert r == [GROUP, TOPIC, str(p), str(COMMITTED), str(PRODUCED),
                     str(PRODUCED - COMMITTED), m.member_id, m.host, m.client_id]


def test_the_cli_members_and_state_views(group):
    b, consumers = group
    out = cli(b.bootstrap_servers, "--group", GROUP, "--members", "--verbose")
    assert out.returncode == 0, out.stderr
    lines = [line.split(None, 5) for line in out.stdout.splitlines() if line.strip()]
    assert lines[0] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS",
                        "ASSIGNMENT"]
    expected = {client: (str(len(tps)), f"{TOPIC}({','.join(str(tp.partition) for tp in sorted(tps))})")
                for client, tps in assignments(consumers).items()}
    assert {r[3]: (r[4], r[5]) for r in lines[1:]} == expected
    out = cli(b.bootstrap_servers, "--group", GROUP, "--state")
    assert out.returncode == 0, out.stderr
    lines = [line.split() for line in out.stdout.splitlines() if line.strip()]
    assert lines == [["GROUP", "COORDINATOR", "(ID)", "ASSIGNMENT-STRATEGY", "STATE",
                      "#MEMBERS"],
                     [GROUP, f"{b.host}:{b.port}", f"({lines[1][2].strip('()')})", "range",
                      "Stable", "2"]]


def test_the_cli_on_an_unknown_group(group):
    b, _ = group
    out = cli(b.bootstrap_servers, "--group", "nobody")
    assert (out.returncode, out.stdout.strip()) == (0, "")  # as Kafka: an error line only
    assert "Error: Consumer group 'nobody' does not exist." in out.stderr


def test_acls_decide_the_operations_and_a_denied_group_raises(tmp_path):
    with BrokerProcess(tmp_path / "data", settings=sasl_config(tmp_path)) as b:
        grant(b, allow("User:alice", R.GROUP, "alices-group", Op.READ),
              allow("User:alice", R.GROUP, "alices-group", Op.DELETE))
        with Admin(bootstrap_servers=b.bootstrap_servers, **creds("admin")) as admin:
            assert admin.describe_consumer_groups(["alices-group"], True)[
                "alices-group"].authorized_operations == GROUP_OPS  # a super user
        with Admin(bootstrap_servers=b.bootstrap_servers, **creds("alice")) as alice:
            d = alice.describe_consumer_groups(["alices-group"], True)["alices-group"]
            assert d.authorized_operations == {Op.READ, Op.DESCRIBE, Op.DELETE}
            assert alice.describe_consumer_groups(["alices-group"])[
                "alices-group"].authorized_operations is None
            with pytest.raises(GroupAuthorizationFailedError):
                alice.describe_consumer_groups(["alices-group", "bobs-group"])
        confluent = AdminClient({"bootstrap.servers": b.bootstrap_servers,
                                 "security.protocol": "SASL_PLAINTEXT",
                                 "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
                                 "sasl.password": USERS["alice"]})
        future = confluent.describe_consumer_groups(["bobs-group"])["bobs-group"]
        with pytest.raises(Exception, match="GROUP_AUTHORIZATION_FAILED|[Aa]uthoriz"):
            future.result(timeout=30)
        out = cli(b.bootstrap_servers, "--group", "bobs-group", "--user", "alice",
                  "--password", USERS["alice"])
        assert out.returncode == 1
        assert "GROUP_AUTHORIZATION_FAILED" in out.stderr


def test_the_cli_on_a_group_with_offsets_and_no_members(group):
    b, _ = group
    c = Consumer({"bootstrap.servers": b.bootstrap_servers, "group.id": "offsets-only"})
    try:
        c.commit(offsets=[CkTopicPartition(TOPIC, 0, 2)], asynchronous=False)
    finally:
        c.close()
    with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
        d = admin.describe_consumer_groups(["offsets-only"])["offsets-only"]
    assert (d.state, d.members, d.is_simple_consumer_group) == ("Empty", (), True)
    out = cli(b.bootstrap_servers, "--group", "offsets-only")
    assert out.returncode == 0, out.stderr
    assert [line.split() for line in out.stdout.splitlines() if line.strip()][1:] == [
        ["offsets-only", TOPIC, "0", "2", str(PRODUCED), str(PRODUCED - 2), "-", "-", "-"]]
    assert "Consumer group 'offsets-only' has no active members." in out.stderr
    out = cli(b.bootstrap_servers, "--group", "offsets-only", "--members")
    assert out.stdout.split() == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
