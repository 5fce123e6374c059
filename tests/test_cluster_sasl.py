"""SASL between brokers (Kafka's sasl.mechanism.inter.broker.protocol and
listener.name.<listener>.<mechanism>.sasl.jaas.config): a ZooKeeper cluster whose listener is
SASL_PLAINTEXT or SASL_SSL replicates (followers log in to their leaders) and commits
transactions (the coordinators' markers and verifications log in too); a broker with a wrong
password stays up, logs the refusal, and its partitions' ISR shrinks instead; a SASL broker of
a cluster without its credentials refuses to start, naming the setting."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.cli import oncelog
from support.tls import make_certificates

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.client.admin.admin_configs import ConfigResource
from oncelog.errors import NotEnoughReplicasError

USERS = {"admin": "admin-secret", "broker": "broker-secret"}
JAAS_KEY = "listener.name.{}.scram-sha-512.sasl.jaas.config"


def jaas(password: str) -> str:
    return ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username="broker" password="{password}";')


def sasl_cluster(tmp_path: Path, zookeeper_server, protocol: str,
                 extra: dict[str, str] | None = None, client: dict[str, Any] | None = None):
    pytest.importorskip("kazoo")
    from oncelog.harness.local_cluster import LocalCluster

    users = tmp_path / "users"
    users.write_text("".join(f"{u}:{p}\n" for u, p in USERS.items()))
    settings = {"security.protocol": protocol, "sasl.users.file": str(users),
                # the brokers' own principal may do what brokers do (ClusterAction ...)
                "super.users": "User:admin;User:broker",
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                JAAS_KEY.format(protocol.lower()): jaas(USERS["broker"]),
                "zookeeper.session.timeout.ms": "2000", "replica.lag.time.max.ms": "2000",
                "transaction.state.log.num.partitions": "2",
                "offsets.topic.num.partitions": "2", **(extra or {})}
    client = {"security_protocol": protocol, "sasl_mechanism": "SCRAM-SHA-256",
              "sasl_plain_username": "admin", "sasl_plain_password": USERS["admin"],
              **(client or {})}
    chroot = f"{zookeeper_server.connect_string}/sasl-{uuid.uuid4().hex[:6]}"
    # (the cluster checks its brokers with their own login: the JAAS setting's user)
    cluster = LocalCluster(tmp_path / "cluster", 3, zookeeper=chroot, broker_settings=settings,
                           die_with_parent=True)
    return cluster, client


def replicate_a_transaction(cluster, client: dict[str, Any]) -> None:
    """acks=all with min.insync.replicas=3 (every follower fetches), a committed transaction
    (markers from the coordinator to the leader) read back read_committed."""
    topic = f"sasl-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap_servers=cluster.bootstrap_servers, **client) as admin:
        admin.create_topics([NewTopic(topic, 1, replication_factor=3,
                                      config={"min.insync.replicas": "3"})])
    cluster.wait_for_isr(topic, 0, 3, 30)
    with Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=f"tx-{topic}",
                  **client) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(20):
            producer.send(topic, f"v{i}".encode(), partition=0)
        producer.commit_transaction()
    with Consumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest",
                  isolation_level="read_committed", **client) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got: list = []
        deadline = time.monotonic() + 20
        while len(got) < 20 and time.monotonic() < deadline:
            got += consumer.poll(0.5)
    assert [r.value for r in got] == [f"v{i}".encode() for i in range(20)]
    assert len(cluster.describe(topic)[0].isr) == 3


@pytest.mark.slow
def test_a_sasl_plaintext_cluster_replicates_and_commits(zookeeper_server,
                                                         tmp_path: Path) -> None:
    cluster, client = sasl_cluster(tmp_path, zookeeper_server, "SASL_PLAINTEXT")
    with cluster:
        replicate_a_transaction(cluster, client)
        # the JAAS setting is a password: described without its value, as Kafka does
        with Admin(bootstrap_servers=cluster.bootstrap_servers, **client) as admin:
            resource = ConfigResource.broker(1)
            entry = admin.describe_configs([resource])[resource][
                JAAS_KEY.format("sasl_plaintext")]
        assert entry.is_sensitive and entry.value is None


@pytest.mark.slow
def test_a_sasl_ssl_cluster_replicates_and_commits(zookeeper_server, tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    cluster, client = sasl_cluster(tmp_path, zookeeper_server, "SASL_SSL",
                                   extra=certs.settings(protocol="SASL_SSL"),
                                   client={"ssl_cafile": certs.ca})
    with cluster:
        replicate_a_transaction(cluster, client)


@pytest.mark.slow
def test_a_broker_with_a_wrong_password_drops_out_of_the_isr(zookeeper_server,
                                                             tmp_path: Path) -> None:
    """Broker 3 restarted with a wrong password: it stays up and logs the refusal once per
    leader (no hot reconnect loop), the partitions it follows shrink their ISR without it,
    and acks=all with min.insync.replicas=3 fails NOT_ENOUGH_REPLICAS."""
    cluster, client = sasl_cluster(tmp_path, zookeeper_server, "SASL_PLAINTEXT")
    with cluster:
        topic = f"sasl-{uuid.uuid4().hex[:8]}"
        with Admin(bootstrap_servers=cluster.bootstrap_servers, **client) as admin:
            admin.create_topics([NewTopic(topic, 3, replication_factor=3,
                                          config={"min.insync.replicas": "3"})])
        for p in range(3):
            cluster.wait_for_isr(topic, p, 3, 30)
        cluster.stop_broker(3)
        cluster.broker_settings[JAAS_KEY.format("sasl_plaintext")] = jaas("wrong")
        cluster.start_broker(3)
        followed = next(p for p, info in cluster.describe(topic).items()
                        if info.leader != 3 and 3 in info.replicas)
        deadline = time.monotonic() + 15
        while 3 in cluster.describe(topic)[followed].isr or \
                len(cluster.describe(topic)[followed].isr) != 2:
            assert time.monotonic() < deadline, cluster.describe(topic)
            time.sleep(0.2)
        time.sleep(3)  # broker 3 keeps trying: its log must not fill up
        # (retries=0: the broker's answer itself, not the retries' timeout)
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", retries=0,
                      enable_idempotence=False, **client) as producer:
            future = producer.send(topic, b"x", partition=followed)
            with pytest.raises(NotEnoughReplicasError):
                future.result(10)
        assert cluster.brokers[3].process.running
        log = cluster.brokers[3].log_path.read_text()
        refusals = log.count("SASL login to broker")
        assert 1 <= refusals <= 2, log[-3000:]  # once per leader it follows
        assert "Invalid username or password" in log


def test_a_sasl_cluster_broker_needs_its_credentials(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("broker:broker-secret\n")
    out = oncelog("broker", "--data-dir", str(tmp_path / "data"), "--port", "0",
                  "--zookeeper", "127.0.0.1:1/none",
                  "--set", "security.protocol=SASL_PLAINTEXT",
                  "--set", f"sasl.users.file={users}",
                  "--set", "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512", check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config" in out.stderr
    assert "Traceback" not in out.stderr
