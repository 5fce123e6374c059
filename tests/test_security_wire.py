"""SASL and ACLs over the wire: our client, confluent-kafka and kafka-python authenticate with
PLAIN and SCRAM-SHA-256/512; wrong credentials fail clearly; nothing but the handshake is served
before authentication; ACLs (managed with our Admin, confluent's AdminClient or `oncelog acls`,
kept across restarts) decide, with the *_AUTHORIZATION_FAILED codes the specs name."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from support.raw_wire import RawConnection
from support.security import USERS, Op, R, allow, creds, grant, raw_login, sasl_config

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition, TransactionError
from oncelog.errors import (
    SaslAuthenticationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from oncelog.protocol import ApiKey, encode_request, make, request_module
from oncelog.security.acls import AclFilter, PatternType
from oncelog.server.embedded import EmbeddedBroker

TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED = 29, 30
TXN_ID_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED = 53, 31


@pytest.fixture
def broker(tmp_path):
    with EmbeddedBroker(data_dir=tmp_path / "data", config=sasl_config(tmp_path)) as b:
        yield b


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_our_client_authenticates_with_each_mechanism(broker, mechanism):
    with Producer(bootstrap_servers=broker.bootstrap_servers, **creds("admin", mechanism)) as p:
        p.send("sec", b"hello").result(10)
    with Consumer(bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                  **creds("admin", mechanism)) as c:
        c.assign([TopicPartition("sec", 0)])
        deadline = time.monotonic() + 10
        seen = []
        while not seen and time.monotonic() < deadline:
            seen = c.poll(0.5)
        assert [r.value for r in seen] == [b"hello"]


def test_wrong_credentials_fail_clearly_and_the_broker_goes_on(broker):
    for mechanism in ("PLAIN", "SCRAM-SHA-512"):
        bad = dict(creds("alice", mechanism), sasl_plain_password="wrong")
        started = time.monotonic()
        with pytest.raises(SaslAuthenticationFailedError, match="Invalid username or password"):
            with Admin(bootstrap_servers=broker.bootstrap_servers, **bad) as admin:
                admin.list_topics()
        assert time.monotonic() - started < 10
    with Admin(bootstrap_servers=broker.bootstrap_servers, **creds("admin")) as admin:
        admin.list_topics()


def test_nothing_but_the_handshake_before_authentication(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        # ApiVersions is allowed ...
        conn.request(make(request_module(ApiKey.API_VERSIONS, 3).ApiVersionsRequest,
                          client_software_name="t", client_software_version="1"))
        # ... Metadata is not: the connection is closed.
        conn.send(encode_request(conn.next_correlation_id(), "t", make(
            request_module(ApiKey.METADATA, 12).MetadataRequest, topics=None,
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)))
        assert conn.closed_by_broker()
    with RawConnection(broker.bootstrap_servers) as conn:
        r = conn.request(make(request_module(ApiKey.SASL_HANDSHAKE, 1).SaslHandshakeRequest,
                              mechanism="GSSAPI"))
        assert r.error_code == 33 and set(r.mechanisms) == {"PLAIN", "SCRAM-SHA-256",
                                                              "SCRAM-SHA-512"}
        assert conn.closed_by_broker()
    # SaslHandshake v0: bare tokens follow.
    with RawConnection(broker.bootstrap_servers) as conn:
        r = conn.request(make(request_module(ApiKey.SASL_HANDSHAKE, 0).SaslHandshakeRequest,
                              mechanism="PLAIN"))
        assert r.error_code == 0
        token = b"\0bob\0bob-pw"
        conn.send(len(token).to_bytes(4, "big") + token)
        assert conn.read_frame() == b""
        r = conn.request(make(request_module(ApiKey.API_VERSIONS, 3).ApiVersionsRequest,
                              client_software_name="t", client_software_version="1"))
        assert r.error_code == 0


def test_acls_decide_produce_and_consume(broker):
    with Producer(bootstrap_servers=broker.bootstrap_servers, max_block_ms=3000,
                  enable_idempotence=False, acks=1, **creds("alice")) as p:
        with pytest.raises(TopicAuthorizationFailedError):
            p.send("orders", b"x").result(10)
    grant(broker, allow("User:alice", R.TOPIC, "orders", Op.WRITE),
          allow("User:alice", R.TOPIC, "orders", Op.CREATE))
    with Producer(bootstrap_servers=broker.bootstrap_servers, **creds("alice")) as p:
        p.send("orders", b"x").result(10)  # idempotent: Write on a topic implies IdempotentWrite
    with Consumer(bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                  **creds("bob")) as c:
        c.assign([TopicPartition("orders", 0)])
        with pytest.raises(TopicAuthorizationFailedError):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                c.poll(0.2)


def test_transactional_ids_need_write_and_two_phase_commit_needs_its_own_acl(broker):
    grant(broker, allow("User:alice", R.TOPIC, "tx", Op.WRITE),
          allow("User:alice", R.TOPIC, "tx", Op.CREATE))
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="alice-tx",
                  **creds("alice")) as p:
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            p.init_transactions(10)
    grant(broker, allow("User:alice", R.TRANSACTIONAL_ID, "alice-tx", Op.WRITE))
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="alice-tx",
                  **creds("alice")) as p:
        p.init_transactions(10)
        p.begin_transaction()
        p.send("tx", b"in a transaction")
        p.commit_transaction(10)
    # enable2Pc needs TwoPhaseCommit as well as Write (KIP-939).
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="alice-tx",
                  transaction_two_phase_commit_enable=True, **creds("alice")) as p:
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            p.init_transactions(10)
    grant(broker, allow("User:alice", R.TRANSACTIONAL_ID, "alice-tx", Op.TWO_PHASE_COMMIT))
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="alice-tx",
                  transaction_two_phase_commit_enable=True, **creds("alice")) as p:
        p.init_transactions(10)


def test_coordinator_and_marker_apis_check_their_resources(broker):
    grant(broker, allow("User:alice", R.TRANSACTIONAL_ID, "t-a", Op.WRITE))
    with raw_login(broker, "alice") as conn:
        # InitProducerId, then AddOffsetsToTxn for a group alice may not Read.
        mod = request_module(ApiKey.INIT_PRODUCER_ID, 4)
        deadline = time.monotonic() + 10
        while True:
            r = conn.request(make(mod.InitProducerIdRequest, transactional_id="t-a",
                                  transaction_timeout=60000, producer_id=-1, producer_epoch=-1))
            if r.error_code == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.error_code == 0
        pid, epoch = r.producer_id, r.producer_epoch
        r = conn.request(make(request_module(ApiKey.ADD_OFFSETS_TO_TXN, 3).AddOffsetsToTxnRequest,
                              transactional_id="t-a", producer_id=pid, producer_epoch=epoch,
                              group_id="not-alices"))
        assert r.error_code == GROUP_AUTHORIZATION_FAILED
        # AddPartitionsToTxn for a topic alice may not Write.
        mod = request_module(ApiKey.ADD_PARTITIONS_TO_TXN, 3)
        r = conn.request(make(mod.AddPartitionsToTxnRequest, v3_and_below_transactional_id="t-a",
                              v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                              v3_and_below_topics=(make(mod.AddPartitionsToTxnTopic, name="x",
                                                        partitions=(0,)),)))
        code = r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
        assert code == TOPIC_AUTHORIZATION_FAILED
        # Another transactional id: denied.
        r = conn.request(make(request_module(ApiKey.END_TXN, 3).EndTxnRequest,
                              transactional_id="t-b", producer_id=pid, producer_epoch=epoch,
                              committed=True))
        assert r.error_code == TXN_ID_AUTHORIZATION_FAILED
        # Markers are for brokers only (ClusterAction).
        mod = request_module(ApiKey.WRITE_TXN_MARKERS, 1)
        r = conn.request(make(mod.WriteTxnMarkersRequest, markers=(make(
            mod.WritableTxnMarker, producer_id=pid, producer_epoch=epoch, transaction_result=True,
            coordinator_epoch=0, topics=(make(mod.WritableTxnMarkerTopic, name="x",
                                              partition_indexes=(0,)),)),)))
        assert r.markers[0].topics[0].partitions[0].error_code == CLUSTER_AUTHORIZATION_FAILED
        # InitProducerId v6 with enable2Pc: Write is not enough.
        mod = request_module(ApiKey.INIT_PRODUCER_ID, 6)
        r = conn.request(make(mod.InitProducerIdRequest, transactional_id="t-a",
                              transaction_timeout=60000, producer_id=-1, producer_epoch=-1,
                              enable2_pc=True, keep_prepared_txn=False))
        assert r.error_code == TXN_ID_AUTHORIZATION_FAILED
        # ACL management needs the cluster.
        r = conn.request(make(request_module(ApiKey.DESCRIBE_ACLS, 3).DescribeAclsRequest,
                              resource_type_filter=1, resource_name_filter=None,
                              pattern_type_filter=1, principal_filter=None, host_filter=None,
                              operation=1, permission_type=1))
        assert r.error_code == CLUSTER_AUTHORIZATION_FAILED


def test_send_offsets_needs_read_on_the_group(broker):
    with Admin(bootstrap_servers=broker.bootstrap_servers, **creds("admin")) as admin:
        admin.create_topics([NewTopic("in", 1)])  # offsets are committed for partitions that exist
    # Describe (to find its coordinator) but not Read on the group.
    grant(broker, allow("User:alice", R.TRANSACTIONAL_ID, "t-g", Op.WRITE),
          allow("User:alice", R.TOPIC, "in", Op.READ),
          allow("User:alice", R.GROUP, "alices-group", Op.DESCRIBE))
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="t-g",
                  **creds("alice")) as p:
        p.init_transactions(10)
        p.begin_transaction()
        with pytest.raises(TransactionError) as exc:
            p.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "alices-group", 10)
        assert "GroupAuthorizationFailedError" in str(exc.value) or "group" in str(exc.value)
        p.abort_transaction(10)
    grant(broker, allow("User:alice", R.GROUP, "alices-group", Op.READ))
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="t-g",
                  **creds("alice")) as p:
        p.init_transactions(10)
        p.begin_transaction()
        p.send_offsets_to_transaction({TopicPartition("in", 0): 5}, "alices-group", 10)
        p.commit_transaction(10)


@pytest.mark.slow
def test_confluent_and_kafka_python_with_sasl(broker):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import (
        AclBinding as CAclBinding,
    )
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
    )
    from confluent_kafka.admin import ResourceType as CResourceType
    kafka = pytest.importorskip("kafka")

    base = {"bootstrap.servers": broker.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT"}
    admin = AdminClient({**base, "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin",
                         "sasl.password": USERS["admin"]})
    bindings = [CAclBinding(CResourceType.TOPIC, "cf", ResourcePatternType.LITERAL, "User:bob",
                            "*", op, AclPermissionType.ALLOW)
                for op in (AclOperation.WRITE, AclOperation.READ, AclOperation.CREATE)]
    bindings.append(CAclBinding(CResourceType.TRANSACTIONAL_ID, "bob-tx",
                                ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.WRITE,
                                AclPermissionType.ALLOW))
    for f in admin.create_acls(bindings).values():
        assert f.result(10) is None
    described = admin.describe_acls(AclBindingFilter(
        CResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None, AclOperation.ANY,
        AclPermissionType.ANY)).result(10)
    assert len(described) == 4
    # confluent's transactional producer as bob (SCRAM-SHA-512).
    p = confluent_kafka.Producer({**base, "sasl.mechanism": "SCRAM-SHA-512",
                                  "sasl.username": "bob", "sasl.password": USERS["bob"],
                                  "transactional.id": "bob-tx"})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("cf", b"from confluent")
    p.commit_transaction(10)
    # A wrong password: librdkafka reports the authentication failure.
    errors = []
    bad = confluent_kafka.Producer({**base, "sasl.mechanism": "PLAIN", "sasl.username": "bob",
                                    "sasl.password": "wrong",
                                    "error_cb": lambda e: errors.append(e)})
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        bad.poll(0.2)
    assert errors and errors[0].code() == confluent_kafka.KafkaError._AUTHENTICATION
    # kafka-python as bob, SCRAM-SHA-256 and PLAIN: produce and read back.
    for mechanism in ("SCRAM-SHA-256", "PLAIN"):
        kp = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap_servers,
                                 security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                                 sasl_plain_username="bob", sasl_plain_password=USERS["bob"])
        kp.send("cf", f"from kafka-python {mechanism}".encode()).get(10)
        kp.close()
    kc = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap_servers,
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                             sasl_plain_username="bob", sasl_plain_password=USERS["bob"],
                             auto_offset_reset="earliest", consumer_timeout_ms=3000,
                             isolation_level="read_committed")
    kc.assign([kafka.TopicPartition("cf", 0)])
    values = sorted(m.value for m in kc)
    kc.close()
    assert values == [b"from confluent", b"from kafka-python PLAIN",
                      b"from kafka-python SCRAM-SHA-256"]
    # Delete through confluent's AdminClient.
    deleted = admin.delete_acls([AclBindingFilter(
        CResourceType.TOPIC, "cf", ResourcePatternType.LITERAL, None, None, AclOperation.ANY,
        AclPermissionType.ANY)])
    assert [len(f.result(10)) for f in deleted.values()] == [3]


def test_acls_survive_a_restart_and_the_cli_manages_them(tmp_path):
    cfg = sasl_config(tmp_path)
    b = EmbeddedBroker(data_dir=tmp_path / "data", config=cfg).start()
    try:
        base = [sys.executable, "-m", "oncelog.cli.main", "acls"]
        auth = ["--bootstrap-server", b.bootstrap_servers, "--user", "admin", "--password",
                USERS["admin"]]
        out = subprocess.run(base + ["add"] + auth + ["--allow-principal", "User:alice",
                                                      "--operation", "Write", "--operation",
                                                      "Describe", "--transactional-id", "app-",
                                                      "--resource-pattern-type", "prefixed"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "Added 2 ACL(s)" in out.stdout, out.stderr
        bad = subprocess.run(base + ["list", "--bootstrap-server", b.bootstrap_servers,
                                     "--user", "alice", "--password", "wrong"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 1 and "Invalid username or password" in bad.stderr
    finally:
        b.stop()
    b = EmbeddedBroker(data_dir=tmp_path / "data", config=cfg).start()
    auth[1] = b.bootstrap_servers  # the restarted broker's port
    try:
        with Admin(bootstrap_servers=b.bootstrap_servers, **creds("admin")) as admin:
            kept = admin.describe_acls(AclFilter(principal="User:alice"))
        assert {(x.resource_name, x.pattern_type, x.operation) for x in kept} == {
            ("app-", PatternType.PREFIXED, Op.WRITE), ("app-", PatternType.PREFIXED, Op.DESCRIBE)}
        out = subprocess.run(base + ["list"] + auth, capture_output=True, text=True, timeout=20)
        assert "TransactionalId" in out.stdout and "Prefixed" in out.stdout, out.stdout
        out = subprocess.run(base + ["remove"] + auth + [
            "--allow-principal", "User:alice", "--operation", "Write", "--transactional-id",
            "app-", "--resource-pattern-type", "prefixed"], capture_output=True, text=True,
            timeout=60)
        assert out.returncode == 0 and "Removed 1 ACL(s)" in out.stdout, out.stderr
    finally:
        b.stop()
