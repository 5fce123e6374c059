"""The Spark connector's TLS settings under Kafka's names, as a Spark job moved from
``format("kafka")`` gives them: ``kafka.ssl.truststore.location`` (a PEM file: the CA the
broker's certificate is checked against) is used by the reader's driver and tasks, a truststore
of another CA fails the read, and a Java keystore type (JKS, PKCS12) is refused naming the
setting. Driven through the data source's reader (what Spark calls: planning on the driver,
``read`` in a task) against a TLS broker process; the sink's option check takes the same
settings."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from support.tls import make_certificates

from oncelog import Admin, NewTopic, Producer
from oncelog.client.errors import SslAuthenticationError
from oncelog.harness.broker_process import BrokerProcess
from oncelog.spark.options import OptionError, sink_settings
from oncelog.spark.source import OncelogDataSource

SMALL = {"transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def broker(certs, tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("spark-tls") / "data",
                       settings={**certs.settings(), **SMALL}) as b:
        tls = {"security_protocol": "SSL", "ssl_cafile": certs.ca}
        with Admin(bootstrap_servers=b.bootstrap_servers, **tls) as a:
            a.create_topics([NewTopic("tls-in", 1)])
        with Producer(bootstrap_servers=b.bootstrap_servers, **tls) as p:
            for i in range(3):
                p.send("tls-in", value=f"t{i}")
        yield b


def reader(b, **options: str):
    source = OncelogDataSource({"kafka.bootstrap.servers": b.bootstrap_servers,
                                "subscribe": "tls-in", "kafka.security.protocol": "SSL",
                                "fetchOffset.numRetries": "1", **options})
    return source.reader(source.schema())


def test_the_truststore_location_is_the_ca_the_reader_checks_the_broker_against(broker, certs):
    r = reader(broker, **{"kafka.ssl.truststore.location": certs.ca,
                          "kafka.ssl.truststore.type": "PEM"})
    [part] = r.partitions()
    assert (part.start, part.end) == (0, 3)
    values = [v.as_py() for batch in r.read(part) for v in batch.column("value")]
    assert values == [b"t0", b"t1", b"t2"]
    # Another CA's truststore: the broker's certificate is not trusted.
    with pytest.raises(SslAuthenticationError, match="certificate verify failed"):
        reader(broker, **{"kafka.ssl.truststore.location": certs.rogue_ca}).partitions()


def test_a_java_keystore_type_is_refused_naming_the_setting(broker, certs):
    with pytest.raises(OptionError, match="ssl.truststore.type=JKS: oncelog's client reads PEM "
                                          "files only"):
        reader(broker, **{"kafka.ssl.truststore.location": certs.ca,
                          "kafka.ssl.truststore.type": "JKS"})
    _, client = sink_settings({"kafka.bootstrap.servers": broker.bootstrap_servers,
                               "kafka.security.protocol": "SSL",
                               "kafka.ssl.truststore.location": certs.ca})
    assert client["ssl.truststore.location"] == certs.ca
    with pytest.raises(OptionError, match="ssl.keystore.type=PKCS12: oncelog's client reads PEM"):
        sink_settings({"kafka.bootstrap.servers": broker.bootstrap_servers,
                       "kafka.ssl.keystore.type": "PKCS12"})
