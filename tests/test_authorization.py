"""Requests that used to get past the ACLs (issue 16): each sent by a user who lacks the right,
answered with Kafka's *_AUTHORIZATION_FAILED and nothing leaked or changed; each beside a user
who has the right. Failed logins are slowed and logged with the user and the peer."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import pytest
from support.raw_wire import RawConnection, create_topics_request, error_codes, fetch_request
from support.security import USERS, Op, R, allow, grant, raw_login, sasl_config
from support.waiting import wait_until

from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch
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
             (RESOURCE_BROKER, "1")]
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


def test_alter_configs_needs_alter_configs(broker):
    """AlterConfigs on the topic changes its overrides; on the cluster, the brokers'."""
    mod = request_module(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1)

    def alter(conn, kind, name, key):
        return conn.request(make(mod.IncrementalAlterConfigsRequest, validate_only=False,
                                 resources=(make(mod.AlterConfigsResource, resource_type=kind,
                                                 resource_name=name, configs=(make(
                                                     mod.AlterableConfig, name=key,
                                                     config_operation=0, value="3600000"),)),
                                            ))).responses[0].error_code

    with raw_login(broker, "alice") as alice:
        assert alter(alice, RESOURCE_TOPIC, "visible", "retention.ms") == \
            TOPIC_AUTHORIZATION_FAILED
        assert alter(alice, RESOURCE_BROKER, "1", "log.retention.ms") == \
            CLUSTER_AUTHORIZATION_FAILED
    grant(broker, allow("User:alice", R.TOPIC, "visible", Op.ALTER_CONFIGS),
          allow("User:alice", R.CLUSTER, "kafka-cluster", Op.ALTER_CONFIGS))
    with raw_login(broker, "alice") as alice:
        assert alter(alice, RESOURCE_TOPIC, "visible", "retention.ms") == 0
        assert alter(alice, RESOURCE_BROKER, "1", "log.retention.ms") == 0
        (topic,) = describe_configs(alice, [(RESOURCE_TOPIC, "visible")])
    assert {c.name: c.value for c in topic.configs}["retention.ms"] == "3600000"


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


# -- every other API, as a user with no ACL at all ----------------------------------------------

TXN_ID_AUTHORIZATION_FAILED = 53


def _requests():
    """(name, request, the error Kafka answers) for a user without any ACL.
    (OffsetForLeaderEpoch is offered in cluster mode only; DescribeConfigs, DescribeProducers,
    LeaveGroup and OffsetFetch have tests of their own above.)"""
    def m(api, version):
        return request_module(api, version)

    r = {}
    p = m(ApiKey.PRODUCE, 9)
    r["Produce"] = (make(p.ProduceRequest, transactional_id=None, acks=-1, timeout=5000,
                         topic_data=(make(p.TopicProduceData, name="secret", partition_data=(
                             make(p.PartitionProduceData, index=0,
                                  records=build_batch([(None, b"x", [], now())])),)),)),
                    TOPIC_AUTHORIZATION_FAILED)
    r["Fetch"] = (fetch_request("secret", 0, 0), TOPIC_AUTHORIZATION_FAILED)
    lo = m(ApiKey.LIST_OFFSETS, 7)
    r["ListOffsets"] = (make(lo.ListOffsetsRequest, replica_id=-1, isolation_level=0, topics=(
        make(lo.ListOffsetsTopic, name="secret", partitions=(
            make(lo.ListOffsetsPartition, partition_index=0, current_leader_epoch=-1,
                 timestamp=-1),)),)), TOPIC_AUTHORIZATION_FAILED)
    md = m(ApiKey.METADATA, 12)
    r["Metadata"] = (make(md.MetadataRequest, allow_auto_topic_creation=True,
                          include_topic_authorized_operations=False,
                          topics=(make(md.MetadataRequestTopic, topic_id=None, name="secret"),)),
                     TOPIC_AUTHORIZATION_FAILED)
    fc = m(ApiKey.FIND_COORDINATOR, 3)
    r["FindCoordinator"] = (make(fc.FindCoordinatorRequest, key="g", key_type=0),
                            GROUP_AUTHORIZATION_FAILED)
    jg = m(ApiKey.JOIN_GROUP, 5)
    r["JoinGroup"] = (make(jg.JoinGroupRequest, group_id="g", session_timeout=10_000,
                           rebalance_timeout=10_000, member_id="", group_instance_id=None,
                           protocol_type="consumer", protocols=(
                               make(jg.JoinGroupRequestProtocol, name="range", metadata=b""),)),
                      GROUP_AUTHORIZATION_FAILED)
    r["Heartbeat"] = (make(m(ApiKey.HEARTBEAT, 4).HeartbeatRequest, group_id="g",
                           generation_id=1, member_id="m", group_instance_id=None),
                      GROUP_AUTHORIZATION_FAILED)
    r["SyncGroup"] = (make(m(ApiKey.SYNC_GROUP, 5).SyncGroupRequest, group_id="g",
                           generation_id=1, member_id="m", group_instance_id=None,
                           protocol_type="consumer", protocol_name="range", assignments=()),
                      GROUP_AUTHORIZATION_FAILED)
    r["DescribeGroups"] = (make(m(ApiKey.DESCRIBE_GROUPS, 5).DescribeGroupsRequest,
                                groups=("g",), include_authorized_operations=False),
                           GROUP_AUTHORIZATION_FAILED)
    ct = m(ApiKey.CREATE_TOPICS, 5)
    r["CreateTopics"] = (make(ct.CreateTopicsRequest, timeout=5000, validate_only=False,
                              topics=(make(ct.CreatableTopic, name="bobs", num_partitions=1,
                                           replication_factor=1, assignments=(),
                                           configs=()),)), TOPIC_AUTHORIZATION_FAILED)
    r["DeleteTopics"] = (make(m(ApiKey.DELETE_TOPICS, 5).DeleteTopicsRequest,
                              topic_names=("secret",), timeout=5000), TOPIC_AUTHORIZATION_FAILED)
    r["InitProducerId (transactional)"] = (make(
        m(ApiKey.INIT_PRODUCER_ID, 4).InitProducerIdRequest, transactional_id="t",
        transaction_timeout=60_000, producer_id=-1, producer_epoch=-1),
        TXN_ID_AUTHORIZATION_FAILED)
    r["InitProducerId (idempotent)"] = (make(
        m(ApiKey.INIT_PRODUCER_ID, 4).InitProducerIdRequest, transactional_id=None,
        transaction_timeout=60_000, producer_id=-1, producer_epoch=-1),
        CLUSTER_AUTHORIZATION_FAILED)
    ap = m(ApiKey.ADD_PARTITIONS_TO_TXN, 3)
    r["AddPartitionsToTxn"] = (make(
        ap.AddPartitionsToTxnRequest, v3_and_below_transactional_id="t",
        v3_and_below_producer_id=1, v3_and_below_producer_epoch=0, v3_and_below_topics=(
            make(ap.AddPartitionsToTxnTopic, name="visible", partitions=(0,)),)),
        TXN_ID_AUTHORIZATION_FAILED)
    r["AddOffsetsToTxn"] = (make(m(ApiKey.ADD_OFFSETS_TO_TXN, 3).AddOffsetsToTxnRequest,
                                 transactional_id="t", producer_id=1, producer_epoch=0,
                                 group_id="g"), TXN_ID_AUTHORIZATION_FAILED)
    r["EndTxn"] = (make(m(ApiKey.END_TXN, 3).EndTxnRequest, transactional_id="t",
                        producer_id=1, producer_epoch=0, committed=True),
                   TXN_ID_AUTHORIZATION_FAILED)
    wm = m(ApiKey.WRITE_TXN_MARKERS, 1)
    r["WriteTxnMarkers"] = (make(wm.WriteTxnMarkersRequest, markers=(make(
        wm.WritableTxnMarker, producer_id=1, producer_epoch=0, transaction_result=True,
        coordinator_epoch=0, topics=(make(wm.WritableTxnMarkerTopic, name="visible",
                                          partition_indexes=(0,)),)),)),
        CLUSTER_AUTHORIZATION_FAILED)
    to = m(ApiKey.TXN_OFFSET_COMMIT, 3)
    r["TxnOffsetCommit"] = (make(to.TxnOffsetCommitRequest, transactional_id="t", group_id="g",
                                 producer_id=1, producer_epoch=0, generation_id=-1,
                                 member_id="", group_instance_id=None, topics=(
                                     make(to.TxnOffsetCommitRequestTopic, name="visible",
                                          partitions=(make(
                                              to.TxnOffsetCommitRequestPartition,
                                              partition_index=0, committed_offset=1,
                                              committed_leader_epoch=-1,
                                              committed_metadata=""),)),)),
                            TXN_ID_AUTHORIZATION_FAILED)
    r["DescribeAcls"] = (make(m(ApiKey.DESCRIBE_ACLS, 2).DescribeAclsRequest,
                              resource_type_filter=1, resource_name_filter=None,
                              pattern_type_filter=1, principal_filter=None, host_filter=None,
                              operation=1, permission_type=1), CLUSTER_AUTHORIZATION_FAILED)
    ca = m(ApiKey.CREATE_ACLS, 2)
    r["CreateAcls"] = (make(ca.CreateAclsRequest, creations=(make(
        ca.AclCreation, resource_type=2, resource_name="secret", resource_pattern_type=3,
        principal="User:bob", host="*", operation=2, permission_type=3),)),
        CLUSTER_AUTHORIZATION_FAILED)
    da = m(ApiKey.DELETE_ACLS, 2)
    r["DeleteAcls"] = (make(da.DeleteAclsRequest, filters=(make(
        da.DeleteAclsFilter, resource_type_filter=1, resource_name_filter=None,
        pattern_type_filter=1, principal_filter=None, host_filter=None, operation=1,
        permission_type=1),)), CLUSTER_AUTHORIZATION_FAILED)
    r["DeleteGroups"] = (make(m(ApiKey.DELETE_GROUPS, 2).DeleteGroupsRequest,
                              groups_names=("shared",)), GROUP_AUTHORIZATION_FAILED)
    od = m(ApiKey.OFFSET_DELETE, 0)
    r["OffsetDelete"] = (make(od.OffsetDeleteRequest, group_id="shared", topics=(make(
        od.OffsetDeleteRequestTopic, name="secret", partitions=(make(
            od.OffsetDeleteRequestPartition, partition_index=0),)),)), GROUP_AUTHORIZATION_FAILED)
    r["DescribeUserScramCredentials"] = (make(
        m(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0).DescribeUserScramCredentialsRequest,
        users=None), CLUSTER_AUTHORIZATION_FAILED)
    us = m(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0)
    r["AlterUserScramCredentials"] = (make(us.AlterUserScramCredentialsRequest, deletions=(
        make(us.ScramCredentialDeletion, name="alice", mechanism=1),), upsertions=(make(
            us.ScramCredentialUpsertion, name="mallory", mechanism=2, iterations=4096,
            salt=b"s" * 16, salted_password=b"p" * 64),)), CLUSTER_AUTHORIZATION_FAILED)
    ac = m(ApiKey.ALTER_CONFIGS, 2)
    r["AlterConfigs (topic)"] = (make(ac.AlterConfigsRequest, validate_only=False, resources=(
        make(ac.AlterConfigsResource, resource_type=RESOURCE_TOPIC, resource_name="secret",
             configs=(make(ac.AlterableConfig, name="retention.ms", value="1"),)),)),
        TOPIC_AUTHORIZATION_FAILED)
    r["AlterConfigs (broker)"] = (make(ac.AlterConfigsRequest, validate_only=False, resources=(
        make(ac.AlterConfigsResource, resource_type=RESOURCE_BROKER, resource_name="",
             configs=(make(ac.AlterableConfig, name="log.retention.ms", value="1"),)),)),
        CLUSTER_AUTHORIZATION_FAILED)
    ic = m(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1)
    r["IncrementalAlterConfigs"] = (make(
        ic.IncrementalAlterConfigsRequest, validate_only=False, resources=(
            make(ic.AlterConfigsResource, resource_type=RESOURCE_TOPIC, resource_name="secret",
                 configs=(make(ic.AlterableConfig, name="retention.ms", config_operation=0,
                               value="1"),)),)), TOPIC_AUTHORIZATION_FAILED)
    r["DescribeTransactions"] = (make(
        m(ApiKey.DESCRIBE_TRANSACTIONS, 0).DescribeTransactionsRequest,
        transactional_ids=("t",)), TXN_ID_AUTHORIZATION_FAILED)
    cp = m(ApiKey.CREATE_PARTITIONS, 3)
    r["CreatePartitions"] = (make(cp.CreatePartitionsRequest, topics=(make(
        cp.CreatePartitionsTopic, name="secret", count=4, assignments=None),),
        timeout=5000, validate_only=False), TOPIC_AUTHORIZATION_FAILED)
    dr = m(ApiKey.DELETE_RECORDS, 2)
    r["DeleteRecords"] = (make(dr.DeleteRecordsRequest, topics=(make(
        dr.DeleteRecordsTopic, name="secret", partitions=(make(
            dr.DeleteRecordsPartition, partition_index=0, offset=-1),)),), timeout=5000),
        TOPIC_AUTHORIZATION_FAILED)
    return r


def now() -> int:
    return int(time.time() * 1000)


REQUESTS = _requests()


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_every_api_refuses_a_user_without_acls(broker, name):
    request, expected = REQUESTS[name]
    with raw_login(broker, "mallory") as mallory:
        codes = {c for c in error_codes(mallory.request(request)) if c != 0}
    assert codes == {expected}, f"{name}: {codes}"
    with raw_login(broker, "admin") as admin:  # nothing was created, deleted or leaked
        md = request_module(ApiKey.METADATA, 12)
        topics = admin.request(make(md.MetadataRequest, topics=None,
                                    allow_auto_topic_creation=False,
                                    include_topic_authorized_operations=False)).topics
        assert {"secret", "visible"} <= {t.name for t in topics} and "bobs" not in \
            {t.name for t in topics}


def test_list_apis_show_a_user_without_acls_nothing(broker):
    with raw_login(broker, "mallory") as mallory:
        groups = mallory.request(make(request_module(ApiKey.LIST_GROUPS, 4).ListGroupsRequest,
                                      states_filter=())).groups
        txns = mallory.request(make(
            request_module(ApiKey.LIST_TRANSACTIONS, 0).ListTransactionsRequest,
            state_filters=(), producer_id_filters=())).transaction_states
        md = request_module(ApiKey.METADATA, 12)
        topics = mallory.request(make(md.MetadataRequest, topics=None,
                                      allow_auto_topic_creation=False,
                                      include_topic_authorized_operations=False)).topics
    assert (groups, txns, topics) == ((), (), ())
