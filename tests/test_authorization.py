"""Requests that used to get past the ACLs (issue 16): each sent by a user who lacks the right,
answered with Kafka's *_AUTHORIZATION_FAILED and nothing leaked or changed; each beside a user
who has the right. Failed logins are slowed and logged with the user and the peer."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import pytest
from conftest import wait_until
from raw_wire import RawConnection, create_topics_request, fetch_request
from test_security_wire import USERS, Op, R, allow, grant, raw_login, sasl_config

from oncelog.protocol import ApiKey, make, request_module
from oncelog.server.embedded import EmbeddedBroker

TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED = 29, 30
CLUSTER_AUTHORIZATION_FAILED, UNKNOWN_MEMBER_ID = 31, 25
SASL_AUTHENTICATION_FAILED = 58
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("authz")
    config = dict(sasl_config(tmp), **{"connection.failed.authentication.delay.ms": "300"})
    with EmbeddedBroker(data_dir=tmp / "data", config=config) as b:
        with raw_login(b, "admin") as admin:
            for name in ("secret", "visible"):
                assert admin.request(create_topics_request(name)).topics[0].error_code == 0
        yield b


def test_leave_group_needs_read_on_the_group(broker):
    """Any user could remove another user's static member from its group."""
    mod = request_module(ApiKey.LEAVE_GROUP, 4)
    request = make(mod.LeaveGroupRequest, group_id="alices-group", members=(
        make(mod.MemberIdentity, member_id="", group_instance_id="alices-instance",
             reason=None),))
    with raw_login(broker, "bob") as bob:
        assert bob.request(request).error_code == GROUP_AUTHORIZATION_FAILED
    grant(broker, allow("User:alice", R.GROUP, "alices-group", Op.READ))
    with raw_login(broker, "alice") as alice:
        response = alice.request(request)
        assert response.error_code == 0
        assert [m.error_code for m in response.members] == [UNKNOWN_MEMBER_ID]


def describe_configs(conn, resources):
    mod = request_module(ApiKey.DESCRIBE_CONFIGS, 4)
    return conn.request(make(mod.DescribeConfigsRequest, include_synonyms=False,
                             include_documentation=False, resources=tuple(
                                 make(mod.DescribeConfigsResource, resource_type=t,
                                      resource_name=n, configuration_keys=None)
                                 for t, n in resources))).results


def test_describe_configs_needs_describe_configs(broker):
    """Topic settings, topic existence and every broker setting (super.users, the users file)
    were shown to any user."""
    asked = [(RESOURCE_TOPIC, "secret"), (RESOURCE_TOPIC, "no-such-topic"),
             (RESOURCE_BROKER, "")]
    with raw_login(broker, "bob") as bob:
        results = describe_configs(bob, asked)
    assert [(r.error_code, r.configs) for r in results] == [
        (TOPIC_AUTHORIZATION_FAILED, ()), (TOPIC_AUTHORIZATION_FAILED, ()),
        (CLUSTER_AUTHORIZATION_FAILED, ())]
    grant(broker, allow("User:alice", R.TOPIC, "secret", Op.ALTER_CONFIGS),  # implies it
          allow("User:alice", R.CLUSTER, "kafka-cluster", Op.DESCRIBE_CONFIGS))
    with raw_login(broker, "alice") as alice:
        results = describe_configs(alice, asked)
    assert [r.error_code for r in results] == [0, TOPIC_AUTHORIZATION_FAILED, 0]
    assert any(c.name == "super.users" for c in results[2].configs)


def test_offset_fetch_hides_topics_the_caller_cannot_describe(broker):
    commit = request_module(ApiKey.OFFSET_COMMIT, 8)
    with raw_login(broker, "admin") as admin:
        response = admin.request(make(
            commit.OffsetCommitRequest, group_id="shared", generation_id_or_member_epoch=-1,
            member_id="", group_instance_id=None, topics=tuple(
                make(commit.OffsetCommitRequestTopic, name=name, partitions=(
                    make(commit.OffsetCommitRequestPartition, partition_index=0,
                         committed_offset=7, committed_leader_epoch=-1,
                         committed_metadata=""),))
                for name in ("secret", "visible"))))
        assert {p.error_code for t in response.topics for p in t.partitions} == {0}
    grant(broker, allow("User:alice", R.GROUP, "shared", Op.DESCRIBE),
          allow("User:alice", R.TOPIC, "visible", Op.DESCRIBE))
    fetch = request_module(ApiKey.OFFSET_FETCH, 7)

    def offsets(topics):
        with raw_login(broker, "alice") as alice:
            r = alice.request(make(fetch.OffsetFetchRequest, group_id="shared",
                                   topics=topics, require_stable=False))
        assert r.error_code == 0
        return sorted((t.name, p.committed_offset, p.error_code)
                      for t in r.topics for p in t.partitions)

    assert offsets(None) == [("visible", 7, 0)]  # all topics: the secret one left out
    named = tuple(make(fetch.OffsetFetchRequestTopic, name=n, partition_indexes=(0,))
                  for n in ("secret", "visible"))
    assert offsets(named) == [("secret", -1, TOPIC_AUTHORIZATION_FAILED), ("visible", 7, 0)]


def test_describe_producers_needs_read_on_the_topic(broker):
    mod = request_module(ApiKey.DESCRIBE_PRODUCERS, 0)
    request = make(mod.DescribeProducersRequest, topics=(
        make(mod.TopicRequest, name="secret", partition_indexes=(0,)),))
    with raw_login(broker, "bob") as bob:
        part = bob.request(request).topics[0].partitions[0]
    assert part.error_code == TOPIC_AUTHORIZATION_FAILED  # it was UNKNOWN_TOPIC_OR_PARTITION


def failed_login(broker, user="alice") -> int:
    with RawConnection(broker.bootstrap_servers) as conn:
        conn.request(make(request_module(ApiKey.SASL_HANDSHAKE, 1).SaslHandshakeRequest,
                          mechanism="PLAIN"))
        return conn.request(make(
            request_module(ApiKey.SASL_AUTHENTICATE, 2).SaslAuthenticateRequest,
            auth_bytes=f"\0{user}\0not-{USERS[user]}".encode())).error_code


def test_a_failed_login_is_answered_late_and_logged_with_user_and_peer(broker, caplog):
    caplog.set_level(logging.WARNING, "oncelog.security")
    started = time.monotonic()
    assert [failed_login(broker) for _ in range(3)] == [SASL_AUTHENTICATION_FAILED] * 3
    assert time.monotonic() - started >= 3 * 0.3  # connection.failed.authentication.delay.ms
    lines = [r.getMessage() for r in caplog.records if "failed authentication" in r.message]
    assert len(lines) == 3 and all("'alice'" in line and "127.0.0.1:" in line
                                   for line in lines), lines


def test_a_delayed_login_failure_holds_up_no_other_connection(broker, caplog):
    caplog.set_level(logging.WARNING, "oncelog.security")
    done: list[float] = []
    guesser = threading.Thread(target=lambda: (failed_login(broker, "bob"),
                                               done.append(time.monotonic())))
    guesser.start()
    wait_until(lambda: any("'bob'" in r.getMessage() for r in caplog.records), 10,
               "the failed login logged (its delay starts then)")
    with raw_login(broker, "admin") as admin:
        admin.request(make(request_module(ApiKey.API_VERSIONS, 3).ApiVersionsRequest,
                           client_software_name="t", client_software_version="1"))
        answered = time.monotonic()
    guesser.join(10)
    assert done and answered < done[0]  # served while the guess waited out its delay


def test_a_follower_fetch_needs_cluster_action(broker):
    """A fetch claiming a replica id reads past the high watermark in a cluster and moves the
    ISR: Kafka answers TOPIC_AUTHORIZATION_FAILED without ClusterAction."""
    grant(broker, allow("User:alice", R.TOPIC, "visible", Op.READ))
    request = dataclasses.replace(fetch_request("visible", 0, 0), replica_id=1)
    with raw_login(broker, "alice") as alice:
        part = alice.request(request).responses[0].partitions[0]
        assert (part.error_code, part.records) == (TOPIC_AUTHORIZATION_FAILED, None)
        assert alice.request(fetch_request("visible", 0, 0)).responses[0].partitions[0] \
            .error_code == 0  # as a consumer it may read


def test_list_groups_shows_every_group_to_describe_on_the_cluster(broker):
    join = request_module(ApiKey.JOIN_GROUP, 5)
    with raw_login(broker, "admin") as admin:
        admin.request(make(join.JoinGroupRequest, group_id="listed", session_timeout=10_000,
                           rebalance_timeout=10_000, member_id="", group_instance_id=None,
                           protocol_type="consumer", protocols=(
                               make(join.JoinGroupRequestProtocol, name="range",
                                    metadata=b""),)), )
    listing = make(request_module(ApiKey.LIST_GROUPS, 4).ListGroupsRequest, states_filter=())
    with raw_login(broker, "bob") as bob:
        assert "listed" not in [g.group_id for g in bob.request(listing).groups]
    grant(broker, allow("User:bob", R.CLUSTER, "kafka-cluster", Op.DESCRIBE))
    with raw_login(broker, "bob") as bob:
        assert "listed" in [g.group_id for g in bob.request(listing).groups]
