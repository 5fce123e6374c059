"""TLS listeners (security.protocol SSL and SASL_SSL, Kafka's PEM settings) against real broker
processes and real clients: confluent-kafka (librdkafka), kafka-python and ours, one-way and
mutual TLS, SCRAM over TLS, a fetch larger than the socket buffers (a TLS connection must not
take the broker's sendfile path, which would write the segment's bytes unencrypted), what a
client without TLS or with the wrong CA gets, and a broker that refuses to start on unusable
certificate settings, naming the setting. Certificates are made at test time by ``openssl``
(tests/support/tls.py)."""

from __future__ import annotations

import hashlib
import ssl
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.cli import oncelog
from support.tls import KEY_PASSWORD, make_certificates

from oncelog import Admin, Consumer, Producer, TopicPartition
from oncelog.client.admin.admin_configs import ConfigResource
from oncelog.client.errors import KafkaTimeoutError, SslAuthenticationError
from oncelog.errors import NetworkError, SaslAuthenticationFailedError
from oncelog.harness.broker_process import BrokerProcess
from oncelog.security.tls import (
    TlsConfigError,
    check_broker_settings,
    inter_broker_ssl_context,
    server_ssl_context,
)

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

USERS = {"alice": "alice-secret"}
SMALL = {"transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def ssl_broker(certs, tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("ssl") / "data",
                       settings={**certs.settings(), **SMALL}) as b:
        yield b


@pytest.fixture(scope="module")
def mtls_broker(certs, tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("mtls") / "data",
                       settings={**certs.settings(client_auth="required"), **SMALL}) as b:
        yield b


@pytest.fixture(scope="module")
def sasl_ssl_broker(certs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sasl_ssl")
    users = tmp / "users"
    users.write_text("".join(f"{u}:{p}\n" for u, p in USERS.items()))
    settings = {**certs.settings(protocol="SASL_SSL"), **SMALL, "sasl.users.file": str(users),
                "allow.everyone.if.no.acl.found": "true"}
    with BrokerProcess(tmp / "data", settings=settings) as b:
        yield b


def ours(certs, **extra: Any) -> dict[str, Any]:
    return {"security_protocol": "SSL", "ssl_cafile": certs.ca, **extra}


def scram(**extra: Any) -> dict[str, Any]:
    return {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": "alice", "sasl_plain_password": USERS["alice"], **extra}


def topic_name() -> str:
    return f"tls-{uuid.uuid4().hex[:8]}"


def consume_ours(bootstrap: str, topic: str, count: int, **config: Any) -> list:
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                  max_partition_fetch_bytes=64 << 20, **config) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            got += consumer.poll(0.5)
        return got


def produce_confluent(bootstrap: str, topic: str, values: list[bytes], **config: Any) -> None:
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, **config})
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0


def consume_confluent(bootstrap: str, topic: str, count: int, **config: Any) -> list[bytes]:
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                                  "auto.offset.reset": "earliest", **config})
    c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m.value())
    finally:
        c.close()
    return got


def kafka_python_round_trip(bootstrap: str, topic: str, values: list[bytes], **config: Any
                            ) -> list[bytes]:
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, **config)
    for v in values:
        producer.send(topic, v, partition=0)
    producer.flush(30)
    producer.close()
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                   consumer_timeout_ms=10000, **config)
    consumer.assign([kafka.TopicPartition(topic, 0)])
    got = []
    for record in consumer:
        got.append(record.value)
        if len(got) == len(values):
            break
    consumer.close()
    return got


# -- SSL: each client, and a fetch much larger than a socket buffer ------------------------------


def test_large_fetch_over_tls_returns_the_segment_bytes_encrypted(ssl_broker, certs) -> None:
    """About 11 MB of distinct records fetched in one go by our client and by librdkafka:
    every byte as written (sendfile on the TLS socket would have sent them in clear, under
    the TLS stream, and the client would have failed to decrypt)."""
    topic = topic_name()
    values = [bytes([i]) * 1000 + hashlib.sha256(bytes([i])).digest() * 28000
              for i in range(12)]
    with Producer(bootstrap_servers=ssl_broker.bootstrap_servers, max_request_size=2 << 20,
                  **ours(certs)) as producer:
        for v in values:
            producer.send(topic, v, partition=0)
        producer.flush()
    got = consume_ours(ssl_broker.bootstrap_servers, topic, len(values), **ours(certs))
    assert [r.value for r in got] == values
    got_c = consume_confluent(ssl_broker.bootstrap_servers, topic, len(values),
                              **{"security.protocol": "SSL", "ssl.ca.location": certs.ca,
                                 "fetch.max.bytes": 64 << 20,
                                 "max.partition.fetch.bytes": 64 << 20})
    assert got_c == values


def test_transactions_over_tls_with_our_client(ssl_broker, certs) -> None:
    topic = topic_name()
    with Producer(bootstrap_servers=ssl_broker.bootstrap_servers,
                  transactional_id=f"tx-{topic}", **ours(certs)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"aborted", partition=0)
        producer.abort_transaction()
        producer.begin_transaction()
        for i in range(3):
            producer.send(topic, f"committed-{i}".encode(), partition=0)
        producer.commit_transaction()
    got = consume_ours(ssl_broker.bootstrap_servers, topic, 3,
                       isolation_level="read_committed", **ours(certs))
    assert [r.value for r in got] == [b"committed-0", b"committed-1", b"committed-2"]


def test_confluent_kafka_over_ssl(ssl_broker, certs) -> None:
    topic = topic_name()
    config = {"security.protocol": "SSL", "ssl.ca.location": certs.ca}
    produce_confluent(ssl_broker.bootstrap_servers, topic, [b"a", b"b"], **config)
    assert consume_confluent(ssl_broker.bootstrap_servers, topic, 2, **config) == [b"a", b"b"]
    # read by our client, under Kafka's names for the settings
    got = consume_ours(ssl_broker.bootstrap_servers, topic, 2,
                       security_protocol="SSL", ssl_truststore_location=certs.ca,
                       ssl_truststore_type="PEM")
    assert [r.value for r in got] == [b"a", b"b"]


def test_kafka_python_over_ssl(ssl_broker, certs) -> None:
    topic = topic_name()
    values = [b"x" * 10, b"y" * 300_000]
    assert kafka_python_round_trip(ssl_broker.bootstrap_servers, topic, values,
                                   security_protocol="SSL", ssl_cafile=certs.ca) == values


def test_a_client_that_does_not_trust_the_broker_fails_at_once(ssl_broker, certs) -> None:
    start = time.monotonic()
    with pytest.raises(SslAuthenticationError, match="certificate verify failed"), \
            Admin(bootstrap_servers=ssl_broker.bootstrap_servers,
                  **ours(certs, ssl_cafile=certs.rogue_ca)) as admin:
        admin.list_topics()
    assert time.monotonic() - start < 10  # not retried until a timeout


def test_a_plaintext_client_fails_cleanly_and_the_broker_goes_on(ssl_broker, certs) -> None:
    with pytest.raises((KafkaTimeoutError, NetworkError)), \
            Admin(bootstrap_servers=ssl_broker.bootstrap_servers,
                  default_api_timeout_ms=1000) as admin:
        admin.list_topics()
    p = confluent_kafka.Producer({"bootstrap.servers": ssl_broker.bootstrap_servers,
                                  "message.timeout.ms": 1000, "log_level": 3})
    p.produce("plain", b"x")
    assert p.flush(10) == 0  # failed: delivery timed out, nothing left queued
    assert ssl_broker.running
    topic = topic_name()
    produce_confluent(ssl_broker.bootstrap_servers, topic, [b"after"],
                      **{"security.protocol": "SSL", "ssl.ca.location": certs.ca})
    assert [r.value for r in consume_ours(ssl_broker.bootstrap_servers, topic, 1,
                                          **ours(certs))] == [b"after"]


def test_password_settings_are_not_described(ssl_broker, certs) -> None:
    with Admin(bootstrap_servers=ssl_broker.bootstrap_servers, **ours(certs)) as admin:
        entries = admin.describe_configs([ConfigResource.broker(1)])[ConfigResource.broker(1)]
    assert entries["ssl.keystore.location"].value == certs.server_pem
    assert entries["ssl.key.password"].is_sensitive and entries["ssl.key.password"].value is None
    assert entries["security.protocol"].value == "SSL"


def test_the_contexts_follow_kafkas_settings(ssl_broker, certs) -> None:
    ctx = server_ssl_context({**certs.settings(client_auth="requested"),
                              "ssl.enabled.protocols": "TLSv1.3"})
    assert ctx is not None and ctx.minimum_version == ssl.TLSVersion.TLSv1_3
    assert ctx.verify_mode == ssl.CERT_OPTIONAL
    with pytest.raises(TlsConfigError, match="ssl.enabled.protocols: TLSv1.1"):
        server_ssl_context({**certs.settings(), "ssl.enabled.protocols": "TLSv1.1"})
    assert server_ssl_context({"security.protocol": "SASL_PLAINTEXT"}) is None
    # PEM text on one line, as a properties file may hold it
    def one_line(path: str) -> str:
        return " ".join(Path(path).read_text().split("\n")).strip()

    assert server_ssl_context({"security.protocol": "SSL",
                               "ssl.keystore.certificate.chain": one_line(certs.server_cert),
                               "ssl.keystore.key": one_line(certs.server_key)}) is not None
    # between brokers: the host name is checked unless the algorithm is emptied, as Kafka's
    inter = inter_broker_ssl_context(certs.settings())
    assert inter is not None and inter.check_hostname
    inter = inter_broker_ssl_context({**certs.settings(),
                                      "ssl.endpoint.identification.algorithm": ""})
    assert inter is not None and not inter.check_hostname
    with pytest.raises(TlsConfigError, match="cannot reach this broker's SSL listener"):
        check_broker_settings({**certs.settings(),
                               "security.inter.broker.protocol": "PLAINTEXT"})
    # a context of the caller's own (kafka-python's ssl_context)
    mine = ssl.create_default_context(cafile=certs.ca)
    with Admin(bootstrap_servers=ssl_broker.bootstrap_servers, security_protocol="SSL",
               ssl_context=mine) as admin:
        assert admin.describe_cluster().nodes


def test_the_console_of_an_ssl_broker_is_served_over_https(certs, tmp_path: Path) -> None:
    import socket
    import urllib.error
    import urllib.request

    with socket.socket() as s:  # a free port for the console (the broker prints it, too)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with BrokerProcess(tmp_path / "data", settings={**certs.settings(), **SMALL,
                                                      "console.port": str(port)}):
        context = ssl.create_default_context(cafile=certs.ca)
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/brokers", context=context,
                                    timeout=10) as response:
            assert response.status == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/brokers", timeout=10)


# -- mutual TLS ---------------------------------------------------------------------------------


def test_mutual_tls_admits_a_client_certificate(mtls_broker, certs) -> None:
    topic = topic_name()
    config = ours(certs, ssl_certfile=certs.client_cert, ssl_keyfile=certs.client_key)
    with Producer(bootstrap_servers=mtls_broker.bootstrap_servers, **config) as producer:
        producer.send(topic, b"mine", partition=0).result(30)
    assert consume_confluent(
        mtls_broker.bootstrap_servers, topic, 1,
        **{"security.protocol": "SSL", "ssl.ca.location": certs.ca,
           "ssl.certificate.location": certs.client_cert,
           "ssl.key.location": certs.client_key}) == [b"mine"]
    # kafka-python, with the certificate and key in one file
    assert kafka_python_round_trip(mtls_broker.bootstrap_servers, topic_name(), [b"kp"],
                                   security_protocol="SSL", ssl_cafile=certs.ca,
                                   ssl_certfile=certs.client_pem) == [b"kp"]


def test_mutual_tls_refuses_a_client_without_a_certificate(mtls_broker, certs) -> None:
    # TLS 1.3: our side of the handshake succeeds, then the broker hangs up without a word
    with pytest.raises(KafkaTimeoutError, match="require a client certificate"), \
            Admin(bootstrap_servers=mtls_broker.bootstrap_servers, default_api_timeout_ms=1000,
                  **ours(certs)) as admin:
        admin.list_topics()
    # a certificate the broker does not trust: refused in the handshake
    with pytest.raises((KafkaTimeoutError, SslAuthenticationError)), \
            Admin(bootstrap_servers=mtls_broker.bootstrap_servers, default_api_timeout_ms=1000,
                  **ours(certs, ssl_certfile=certs.rogue_client_pem)) as admin:
        admin.list_topics()
    c = confluent_kafka.Producer({"bootstrap.servers": mtls_broker.bootstrap_servers,
                                  "security.protocol": "SSL", "ssl.ca.location": certs.ca,
                                  "log_level": 3})
    with pytest.raises(confluent_kafka.KafkaException):
        c.list_topics(timeout=1.0)
    assert mtls_broker.running


# -- SASL_SSL -----------------------------------------------------------------------------------


def test_scram_over_tls_with_each_client(sasl_ssl_broker, certs) -> None:
    bootstrap = sasl_ssl_broker.bootstrap_servers
    topic = topic_name()
    with Producer(bootstrap_servers=bootstrap, transactional_id=f"tx-{topic}",
                  **scram(ssl_cafile=certs.ca)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"ours", partition=0)
        producer.commit_transaction()
    librdkafka = {"security.protocol": "SASL_SSL", "ssl.ca.location": certs.ca,
                  "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
                  "sasl.password": USERS["alice"]}
    produce_confluent(bootstrap, topic, [b"confluent"], **librdkafka)
    got = consume_ours(bootstrap, topic, 2, isolation_level="read_committed",
                       **scram(ssl_cafile=certs.ca))
    assert [r.value for r in got] == [b"ours", b"confluent"]
    assert consume_confluent(bootstrap, topic, 2, **librdkafka,
                             **{"isolation.level": "read_committed"}) == [b"ours", b"confluent"]
    assert kafka_python_round_trip(
        bootstrap, topic_name(), [b"kp"], security_protocol="SASL_SSL", ssl_cafile=certs.ca,
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
        sasl_plain_password=USERS["alice"]) == [b"kp"]


def test_sasl_over_tls_still_checks_the_password(sasl_ssl_broker, certs) -> None:
    with pytest.raises(SaslAuthenticationFailedError), \
            Admin(bootstrap_servers=sasl_ssl_broker.bootstrap_servers,
                  **scram(ssl_cafile=certs.ca, sasl_plain_password="wrong")) as admin:
        admin.list_topics()


# -- the command line ---------------------------------------------------------------------------


def test_cli_produce_and_consume_with_command_config(ssl_broker, sasl_ssl_broker, certs,
                                                      tmp_path: Path) -> None:
    topic = topic_name()
    ssl_props = tmp_path / "client.properties"
    ssl_props.write_text(f"security.protocol=SSL\nssl.truststore.type=PEM\n"
                         f"ssl.truststore.location={certs.ca}\nssl.truststore.password=x\n")
    common = ["--bootstrap-server", ssl_broker.bootstrap_servers, "--topic", topic]
    out = oncelog("produce", *common, "--command-config", str(ssl_props), stdin="one\ntwo\n")
    assert "ignoring ssl.truststore.password" in out.stderr  # a JKS store's, as Kafka warns
    out = oncelog("consume", *common, "--command-config", str(ssl_props),
                  "--from-beginning", "--max-messages", "2", "--timeout-ms", "20000")
    assert out.stdout.split() == ["one", "two"]

    # SASL_SSL: Kafka's JAAS line in the file
    jaas = tmp_path / "scram.properties"
    jaas.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        f'    username="alice" password="{USERS["alice"]}";\n'
        f"ssl.truststore.location={certs.ca}\n")
    common = ["--bootstrap-server", sasl_ssl_broker.bootstrap_servers, "--topic", topic]
    oncelog("produce", *common, "--command-config", str(jaas), stdin="three\n")
    # or the flags: --security-protocol SSL with --user means SASL_SSL
    ca_only = tmp_path / "ca.properties"
    ca_only.write_text(f"ssl.truststore.location={certs.ca}\n")
    out = oncelog("consume", *common, "--command-config", str(ca_only),
                  "--security-protocol", "SSL", "--user", "alice", "--password",
                  USERS["alice"], "--sasl-mechanism", "SCRAM-SHA-256", "--from-beginning",
                  "--max-messages", "1", "--timeout-ms", "20000")
    assert out.stdout.split() == ["three"]


def test_cli_refuses_a_broker_it_does_not_trust(ssl_broker) -> None:
    """Without a truststore the system's CAs are used, which did not sign the broker's."""
    out = oncelog("topics", "list", "--bootstrap-server", ssl_broker.bootstrap_servers,
                  "--security-protocol", "SSL", check=False)
    assert out.returncode == 1
    assert "certificate verify failed" in out.stderr


# -- startup -----------------------------------------------------------------------------------


def test_pem_text_settings_and_an_encrypted_key(certs, tmp_path: Path) -> None:
    """ssl.keystore.certificate.chain / ssl.keystore.key hold the PEM itself (the key encrypted
    with ssl.key.password); ssl.truststore.certificates likewise."""
    settings = {"security.protocol": "SSL", "ssl.keystore.type": "PEM",
                "ssl.keystore.certificate.chain": Path(certs.server_cert).read_text(),
                "ssl.keystore.key": Path(certs.server_key_encrypted).read_text(),
                "ssl.key.password": KEY_PASSWORD,
                "ssl.truststore.certificates": Path(certs.ca).read_text(),
                "ssl.client.auth": "requested", **SMALL}
    with BrokerProcess(tmp_path / "data", settings=settings) as b, \
            Admin(bootstrap_servers=b.bootstrap_servers, **ours(certs)) as admin:
        assert admin.describe_cluster().nodes


@pytest.mark.parametrize(("settings", "message"), [
    ({"ssl.keystore.location": "/nonexistent/server.pem"},
     "ssl.keystore.location: no such file: /nonexistent/server.pem"),
    ({}, "needs the broker's certificate and key: ssl.keystore.location"),
    ({"ssl.keystore.location": "CA"}, "ssl.keystore.location: cannot load the certificate"),
    ({"ssl.keystore.certificate.chain": "CERT", "ssl.keystore.key": "CLIENT_KEY"},
     "the private key does not belong to the certificate"),
    ({"ssl.keystore.location": "SERVER", "ssl.client.auth": "required"},
     "ssl.client.auth=required needs the certificates that sign the clients'"),
    ({"ssl.keystore.location": "SERVER", "ssl.truststore.location": "/nonexistent/ca.pem"},
     "ssl.truststore.location: no such file"),
    ({"ssl.keystore.location": "SERVER", "ssl.keystore.type": "JKS"},
     "ssl.keystore.type=JKS: oncelog reads PEM only"),
    ({"ssl.keystore.certificate.chain": "CERT", "ssl.keystore.key": "ENCRYPTED_KEY",
      "ssl.key.password": "wrong"}, "encrypted and ssl.key.password does not open it"),
])
def test_unusable_tls_settings_stop_the_broker_naming_the_setting(
        certs, tmp_path: Path, settings: dict[str, str], message: str) -> None:
    files = {"CA": certs.ca, "SERVER": certs.server_pem}
    texts = {"CERT": certs.server_cert, "ENCRYPTED_KEY": certs.server_key_encrypted,
             "CLIENT_KEY": certs.client_key}
    args = ["broker", "--data-dir", str(tmp_path / "data"), "--port", "0",
            "--security-protocol", "SSL"]
    for key, value in settings.items():
        value = files.get(value, value)
        if value in texts:
            value = Path(texts[value]).read_text()
        args += ["--set", f"{key}={value}"]
    out = oncelog(*args, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


# -- between brokers ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_cluster_replicates_over_mutual_tls(zookeeper_server, certs, tmp_path: Path) -> None:
    """Three brokers whose one listener is SSL with ssl.client.auth=required: followers fetch,
    the controller's and coordinators' requests and transaction markers travel over TLS with
    each broker's certificate (an inter-broker connection without one would be refused)."""
    pytest.importorskip("kazoo")
    from oncelog import NewTopic
    from oncelog.harness.local_cluster import LocalCluster

    client = ours(certs, ssl_certfile=certs.client_pem)
    cluster = LocalCluster(
        tmp_path / "cluster", 3, zookeeper=f"{zookeeper_server.connect_string}/tls",
        broker_settings={**certs.settings(client_auth="required"),
                         "zookeeper.session.timeout.ms": 2000,
                         "transaction.state.log.num.partitions": "2",
                         "offsets.topic.num.partitions": "2"},
        die_with_parent=True)  # its own client settings: from the brokers' (their keystore)
    with cluster:
        topic = topic_name()
        with Admin(bootstrap_servers=cluster.bootstrap_servers, **client) as admin:
            admin.create_topics([NewTopic(topic, 1, replication_factor=3,
                                          config={"min.insync.replicas": "3"})])
        cluster.wait_for_isr(topic, 0, 3, 30)
        with Producer(bootstrap_servers=cluster.bootstrap_servers,
                      transactional_id=f"tx-{topic}", **client) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            for i in range(20):
                producer.send(topic, f"v{i}".encode() * 1000, partition=0)
            producer.commit_transaction()  # acks=all with min.insync.replicas=3
        got = consume_ours(cluster.bootstrap_servers, topic, 20,
                           isolation_level="read_committed", **client)
        assert [r.value for r in got] == [f"v{i}".encode() * 1000 for i in range(20)]
        assert len(cluster.describe(topic)[0].isr) == 3
