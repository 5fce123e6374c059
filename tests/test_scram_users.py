"""SCRAM users managed while the broker runs (KIP-554): DescribeUserScramCredentials and
AlterUserScramCredentials through confluent-kafka's AdminClient, our Admin and `oncelog
configs`; a user added logs in at once (confluent-kafka's Producer, our Admin), a user changed
or deleted cannot log in with the old password (an established connection stays, as in Kafka);
Kafka's error codes; Describe / Alter on the cluster; kept across a restart; in a cluster, a
user added through one broker logs in on another."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from support.raw_wire import RawConnection
from support.security import USERS, Op, R, allow, creds, grant, raw_login, sasl_config
from support.waiting import wait_until

from oncelog import Admin, NewTopic
from oncelog.client import UserScramCredentialDeletion as Deletion
from oncelog.client import UserScramCredentialUpsertion as Upsertion
from oncelog.errors import (
    ClusterAuthorizationFailedError,
    DuplicateResourceError,
    ResourceNotFoundError,
    SaslAuthenticationFailedError,
    UnacceptableCredentialError,
)
from oncelog.protocol import ApiKey, make, request_module
from oncelog.security.sasl import client_for
from oncelog.server.embedded import EmbeddedBroker

UNSUPPORTED_SASL_MECHANISM, RESOURCE_NOT_FOUND, DUPLICATE_RESOURCE = 33, 91, 92
UNACCEPTABLE_CREDENTIAL, CLUSTER_AUTHORIZATION_FAILED = 93, 31


@pytest.fixture
def broker(tmp_path):
    with EmbeddedBroker(data_dir=tmp_path / "data", config=sasl_config(tmp_path)) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers, **creds("admin")) as admin:
            admin.create_topics([NewTopic("scram-topic")])
        grant(b, allow("User:*", R.TOPIC, "scram-topic", Op.WRITE))
        yield b


def confluent(bootstrap, user, password, mechanism="SCRAM-SHA-256"):
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}


def produces(bootstrap, user, password, mechanism) -> bool:
    """Whether a confluent-kafka Producer logging in as ``user`` delivers a record."""
    delivered = []
    p = Producer(dict(confluent(bootstrap, user, password, mechanism),
                      **{"message.timeout.ms": 10000}))
    p.produce("scram-topic", b"hello", on_delivery=lambda err, msg: delivered.append(err))
    p.flush(8)
    return delivered == [None]


def logs_in(bootstrap, user, password, mechanism="SCRAM-SHA-512") -> bool:
    try:
        with Admin(bootstrap_servers=bootstrap, security_protocol="SASL_PLAINTEXT",
                   sasl_mechanism=mechanism, sasl_plain_username=user,
                   sasl_plain_password=password, default_api_timeout_ms=5000) as admin:
            admin.list_topics()
        return True
    except SaslAuthenticationFailedError:
        return False


def scram_login(bootstrap, user, password, mechanism="SCRAM-SHA-512") -> RawConnection:
    """A raw connection authenticated with SCRAM (SaslHandshake v1 + SaslAuthenticate)."""
    conn = RawConnection(bootstrap)
    r = conn.request(make(request_module(ApiKey.SASL_HANDSHAKE, 1).SaslHandshakeRequest,
                          mechanism=mechanism))
    assert r.error_code == 0
    client = client_for(mechanism, user, password)
    token = client.first()
    while token is not None:
        r = conn.request(make(request_module(ApiKey.SASL_AUTHENTICATE, 2)
                              .SaslAuthenticateRequest, auth_bytes=token))
        assert r.error_code == 0, r
        token = client.step(bytes(r.auth_bytes))
    return conn


def metadata_answered(conn) -> bool:
    md = request_module(ApiKey.METADATA, 12)
    r = conn.request(make(md.MetadataRequest, topics=None, allow_auto_topic_creation=False,
                          include_topic_authorized_operations=False))
    return bool(r.brokers)


def test_confluent_admin_adds_a_user_who_produces_at_once(broker):
    bs = broker.bootstrap_servers
    admin = AdminClient(confluent(bs, "admin", USERS["admin"]))
    # The users file seeded both mechanisms of its users (4096 iterations).
    seeded = admin.describe_user_scram_credentials().result()
    assert set(seeded) == set(USERS)
    assert {(i.mechanism, i.iterations) for i in seeded["alice"].scram_credential_infos} == {
        (ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 4096)}
    assert not logs_in(bs, "carol", "carol-pw")
    futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"carol-pw")])
    assert futures["carol"].result() is None
    described = admin.describe_user_scram_credentials(["carol"])["carol"].result()
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_512, 8192)]
    assert produces(bs, "carol", "carol-pw", "SCRAM-SHA-512")
    assert not logs_in(bs, "carol", "carol-pw", "SCRAM-SHA-256")  # only the mechanism added
    # Deleted: no new login.
    futures = admin.alter_user_scram_credentials([UserScramCredentialDeletion(
        "carol", ScramMechanism.SCRAM_SHA_512)])
    assert futures["carol"].result() is None
    assert not logs_in(bs, "carol", "carol-pw")
    with pytest.raises(KafkaException, match="RESOURCE_NOT_FOUND"):
        admin.describe_user_scram_credentials(["carol"])["carol"].result()


def test_our_admin_changes_a_password_and_established_connections_stay(broker):
    bs = broker.bootstrap_servers
    with Admin(bootstrap_servers=bs, **creds("admin")) as admin:
        assert admin.alter_user_scram_credentials([
            Upsertion("dave", "SCRAM-SHA-512", "first", iterations=4096),
            Upsertion("dave", "SCRAM-SHA-256", "first", iterations=16384)]) == {"dave": None}
        assert {(i.mechanism, i.iterations) for i in
                admin.describe_user_scram_credentials(["dave"])["dave"]} == {
            ("SCRAM-SHA-512", 4096), ("SCRAM-SHA-256", 16384)}
        with scram_login(bs, "dave", "first") as dave:
            assert metadata_answered(dave)
            assert admin.alter_user_scram_credentials([
                Upsertion("dave", "SCRAM-SHA-512", "second", iterations=5000)]) == {"dave": None}
            assert not logs_in(bs, "dave", "first") and logs_in(bs, "dave", "second")
            assert logs_in(bs, "dave", "first", "SCRAM-SHA-256")  # the other one is unchanged
            assert admin.alter_user_scram_credentials([
                Deletion("dave", "SCRAM-SHA-512"), Deletion("dave", "SCRAM-SHA-256")]) == {
                "dave": None}
            assert not logs_in(bs, "dave", "second")
            # As in Kafka, the connection that authenticated is not cut.
            assert metadata_answered(dave)
        with pytest.raises(ResourceNotFoundError):
            admin.describe_user_scram_credentials(["dave"])
        assert "dave" not in admin.describe_user_scram_credentials()
    # PLAIN still reads the users file (Kafka's PLAIN does not read SCRAM credentials).
    raw_login(broker, "bob").close()


def test_kafka_error_codes(broker):
    with Admin(bootstrap_servers=broker.bootstrap_servers, **creds("admin")) as admin:
        outcome = admin.alter_user_scram_credentials([
            Upsertion("few", "SCRAM-SHA-256", "pw", iterations=4095),
            Upsertion("many", "SCRAM-SHA-512", "pw", iterations=16385),
            Upsertion("twice", "SCRAM-SHA-256", "pw"), Deletion("twice", "SCRAM-SHA-256"),
            Deletion("nobody", "SCRAM-SHA-512"),
            Upsertion("fine", "SCRAM-SHA-256", "pw")])
        assert {u: type(e) for u, e in outcome.items()} == {
            "few": UnacceptableCredentialError, "many": UnacceptableCredentialError,
            "twice": DuplicateResourceError, "nobody": ResourceNotFoundError,
            "fine": type(None)}
        assert "Too few iterations" in str(outcome["few"])
        assert "Too many iterations" in str(outcome["many"])
        # Nothing of the refused users was written.
        assert set(admin.describe_user_scram_credentials()) == set(USERS) | {"fine"}
    mod = request_module(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0)
    describe = request_module(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0)
    with raw_login(broker, "admin") as conn:
        r = conn.request(make(mod.AlterUserScramCredentialsRequest, deletions=(
            make(mod.ScramCredentialDeletion, name="alice", mechanism=0),
            make(mod.ScramCredentialDeletion, name="", mechanism=1)), upsertions=(
            make(mod.ScramCredentialUpsertion, name="eve", mechanism=3, iterations=4096,
                 salt=b"s" * 16, salted_password=b"p" * 32),
            make(mod.ScramCredentialUpsertion, name="zoe", mechanism=1, iterations=4096,
                 salt=b"", salted_password=b"p" * 32))))
        assert {x.user: int(x.error_code) for x in r.results} == {
            "alice": UNSUPPORTED_SASL_MECHANISM, "": UNACCEPTABLE_CREDENTIAL,
            "eve": UNSUPPORTED_SASL_MECHANISM, "zoe": UNACCEPTABLE_CREDENTIAL}
        r = conn.request(make(describe.DescribeUserScramCredentialsRequest, users=tuple(
            make(describe.UserName, name=n) for n in ("alice", "", "bob", "bob", "ghost"))))
        assert int(r.error_code) == 0
        assert [(x.user, int(x.error_code)) for x in r.results] == [
            ("alice", 0), ("", RESOURCE_NOT_FOUND), ("bob", DUPLICATE_RESOURCE),
            ("ghost", RESOURCE_NOT_FOUND)]


def test_describe_and_alter_need_the_cluster_rights(broker):
    bs = broker.bootstrap_servers
    with Admin(bootstrap_servers=bs, **creds("alice")) as alice:
        with pytest.raises(ClusterAuthorizationFailedError):
            alice.describe_user_scram_credentials()
        outcome = alice.alter_user_scram_credentials([Upsertion("alice", "SCRAM-SHA-512", "x"),
                                                      Deletion("bob", "SCRAM-SHA-256")])
        assert {u: type(e) for u, e in outcome.items()} == {
            "alice": ClusterAuthorizationFailedError, "bob": ClusterAuthorizationFailedError}
        assert logs_in(bs, "alice", USERS["alice"]) and not logs_in(bs, "alice", "x")
        assert logs_in(bs, "bob", USERS["bob"], "SCRAM-SHA-256")
        grant(broker, allow("User:alice", R.CLUSTER, "kafka-cluster", Op.DESCRIBE))
        assert "bob" in alice.describe_user_scram_credentials()
        assert isinstance(alice.alter_user_scram_credentials([Upsertion(
            "x", "SCRAM-SHA-512", "x")])["x"], ClusterAuthorizationFailedError)  # Describe only
        grant(broker, allow("User:alice", R.CLUSTER, "kafka-cluster", Op.ALTER))
        assert alice.alter_user_scram_credentials([Upsertion("frank", "SCRAM-SHA-512",
                                                             "f")]) == {"frank": None}
    assert logs_in(bs, "frank", "f")


def test_kept_across_a_restart_and_the_users_file_only_seeds(tmp_path):
    config = sasl_config(tmp_path)
    with EmbeddedBroker(data_dir=tmp_path / "data", config=config) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers, **creds("admin")) as admin:
            assert admin.alter_user_scram_credentials([
                Upsertion("gina", "SCRAM-SHA-256", "gina-secret-pw", iterations=9000),
                Deletion("bob", "SCRAM-SHA-256"), Deletion("bob", "SCRAM-SHA-512"),
                Upsertion("alice", "SCRAM-SHA-512", "new-alice")]) == {
                "gina": None, "bob": None, "alice": None}
    text = (tmp_path / "data" / "scram-credentials.json").read_text()
    stored = json.loads(text)
    assert stored["users"]["bob"] == {}  # known, without credentials: not seeded again
    assert stored["users"]["gina"]["SCRAM-SHA-256"].startswith("salt=")
    assert "gina-secret-pw" not in text and USERS["alice"] not in text  # no password kept
    # The users file changes: a new user is seeded, the ones the store holds are not touched.
    users_file = tmp_path / "users"
    users_file.write_text(users_file.read_text().replace(f"alice:{USERS['alice']}",
                                                         "alice:file-alice")
                          + "newbie:newbie-pw\n")
    with EmbeddedBroker(data_dir=tmp_path / "data", config=config) as b:
        bs = b.bootstrap_servers
        assert logs_in(bs, "gina", "gina-secret-pw", "SCRAM-SHA-256")
        assert not logs_in(bs, "bob", USERS["bob"], "SCRAM-SHA-256")
        assert logs_in(bs, "alice", "new-alice") and not logs_in(bs, "alice", "file-alice")
        assert logs_in(bs, "alice", USERS["alice"], "SCRAM-SHA-256")
        assert logs_in(bs, "alice", "file-alice", "PLAIN")  # PLAIN reads the file
        assert logs_in(bs, "newbie", "newbie-pw") and logs_in(bs, "newbie", "newbie-pw",
                                                               "SCRAM-SHA-256")
        with Admin(bootstrap_servers=bs, **creds("admin")) as admin:
            assert [(i.mechanism, i.iterations) for i in
                    admin.describe_user_scram_credentials(["gina"])["gina"]] == [
                ("SCRAM-SHA-256", 9000)]


def test_the_cli_adds_describes_and_deletes(broker):
    bs = broker.bootstrap_servers
    base = [sys.executable, "-m", "oncelog.cli.main", "configs", "--bootstrap-server", bs,
            "--user", "admin", "--password", USERS["admin"]]

    def run(*args):
        return subprocess.run([*base, *args], capture_output=True, text=True, timeout=60,
                              check=False)

    out = run("--alter", "--entity-type", "users", "--entity-name", "hank", "--add-config",
              "SCRAM-SHA-256=[iterations=8192,password=hank-secret],"
              "SCRAM-SHA-512=[password=hank-secret]")
    assert out.returncode == 0 and "Completed updating config for user hank." in out.stdout, \
        out.stderr
    assert logs_in(bs, "hank", "hank-secret") and logs_in(bs, "hank", "hank-secret",
                                                          "SCRAM-SHA-256")
    out = run("--describe", "--entity-type", "users", "--entity-name", "hank")
    assert out.stdout.strip() == ("SCRAM credential configs for user-principal 'hank' are "
                                  "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096")
    out = run("--describe", "--entity-type", "users")
    assert out.returncode == 0 and "user-principal 'alice'" in out.stdout
    out = run("--alter", "--entity-type", "users", "--entity-name", "hank", "--delete-config",
              "SCRAM-SHA-512")
    assert out.returncode == 0, out.stderr
    assert not logs_in(bs, "hank", "hank-secret")
    out = run("--alter", "--entity-type", "users", "--entity-name", "hank", "--delete-config",
              "SCRAM-SHA-512")
    assert out.returncode == 1 and "RESOURCE_NOT_FOUND" in out.stderr
    out = run("--alter", "--entity-type", "users", "--entity-name", "hank", "--add-config",
              "SCRAM-SHA-256=[iterations=100,password=x]")
    assert out.returncode == 1 and "Too few iterations" in out.stderr
    out = run("--alter", "--entity-type", "users", "--entity-name", "hank", "--add-config",
              "SCRAM-SHA-1=[password=x]")
    assert out.returncode == 2 and "not a SCRAM mechanism" in out.stderr


@pytest.mark.slow
def test_a_user_added_through_one_broker_logs_in_on_another(zookeeper_server, tmp_path):
    from oncelog.cluster.zk_client import KafkaZkClient
    from oncelog.harness.broker_process import BrokerProcess

    connect = f"{zookeeper_server.connect_string}/scram-{uuid.uuid4().hex[:8]}"
    settings = {**sasl_config(tmp_path),
                # the brokers log in to each other as admin (a super user), as Kafka's do
                "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                    "org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'username="admin" password="{USERS["admin"]}";'}
    brokers = [BrokerProcess(tmp_path / f"broker-{n}", settings=settings, node_id=n,
                             zookeeper=connect) for n in (1, 2)]
    try:
        for b in brokers:
            b.start()
        one, two = (b.bootstrap_servers for b in brokers)
        wait_until(lambda: logs_in(two, "admin", USERS["admin"]), 30, "broker 2 serving")
        with Admin(bootstrap_servers=one, **creds("admin")) as admin:
            assert admin.alter_user_scram_credentials([
                Upsertion("ivy@ops", "SCRAM-SHA-512", "ivy-pw", iterations=8192)]) == {
                "ivy@ops": None}
        wait_until(lambda: logs_in(two, "ivy@ops", "ivy-pw"), 20, "ivy logging in on broker 2")
        # Kafka's layout: the user's config entity, then a change notification naming it.
        with KafkaZkClient(connect) as zk:
            data, _ = zk.zk.get("/config/users/ivy%40ops")
            config = json.loads(data)
            assert config["version"] == 1 and list(config["config"]) == ["SCRAM-SHA-512"]
            assert config["config"]["SCRAM-SHA-512"].endswith(",iterations=8192")
            changes = sorted(zk.zk.get_children("/config/changes"))
            assert changes and all(c.startswith("config_change_") for c in changes)
            last, _ = zk.zk.get(f"/config/changes/{changes[-1]}")
            assert json.loads(last) == {"version": 2, "entity_path": "users/ivy%40ops"}
        with Admin(bootstrap_servers=two, **creds("admin")) as admin:
            assert [(i.mechanism, i.iterations) for i in
                    admin.describe_user_scram_credentials(["ivy@ops"])["ivy@ops"]] == [
                ("SCRAM-SHA-512", 8192)]
            assert admin.alter_user_scram_credentials([
                Deletion("ivy@ops", "SCRAM-SHA-512")]) == {"ivy@ops": None}
        wait_until(lambda: not logs_in(one, "ivy@ops", "ivy-pw"), 20, "ivy refused on broker 1")
        # A restarted broker reads the users from ZooKeeper (the users file seeds only once).
        brokers[0].restart()
        wait_until(lambda: logs_in(one, "admin", USERS["admin"]), 30, "broker 1 back")
        assert not logs_in(one, "ivy@ops", "ivy-pw")
    finally:
        for b in brokers:
            b.stop()


def test_nothing_but_the_handshake_before_authentication_still(broker):
    """The new APIs are refused before SASL authentication, like every other."""
    with RawConnection(broker.bootstrap_servers) as conn:
        from oncelog.protocol import encode_request

        conn.send(encode_request(conn.next_correlation_id(), "t", make(
            request_module(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0)
            .DescribeUserScramCredentialsRequest, users=None)))
        assert conn.closed_by_broker()
