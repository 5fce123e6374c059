"""Shared pytest fixtures. Each section belongs to one area; add new sections below, apart."""

from __future__ import annotations

# ================================================================================================
# Client tests (tests/test_client_*.py): brokers to point oncelog.client at.
#
#   bootstrap        "127.0.0.1:PORT" of the EmbeddedBroker, or of librdkafka's mock cluster
#                    when the embedded broker cannot be imported
#   embedded_broker  the EmbeddedBroker itself (skips the test if there is none)
#   mock_cluster     librdkafka's built-in mock cluster (3 brokers): a second, independent
#                    implementation of the protocol to check our client against
#   fake_broker      FakeBroker: a scripted broker speaking real Kafka framing, for failures a
#                    real broker will not produce on demand (lost responses, NOT_LEADER, ...)
# ================================================================================================
import os
from typing import Any

import pytest
from support.fake_broker import FakeBroker, MockCluster
from support.zookeeper import require_zookeeper

try:
    from oncelog.server.embedded import EmbeddedBroker
except ImportError:  # the broker is not there yet: client tests run against the mock cluster
    EmbeddedBroker = None  # type: ignore[assignment,misc]

# The suite is CPU-bound on two cores, and most JVMs it starts (Spark's drivers, Kafka's brokers
# and tools) live seconds to a minute on small data: C1 alone compiles what they run for a
# fraction of the CPU the C2 compiler spends, and the serial collector has no GC threads to
# keep busy. Inherited by every process the tests start (spark-submit reads SPARK_SUBMIT_OPTS,
# scripts/kafka.sh KAFKA_JVM_PERFORMANCE_OPTS); a value already set is kept.
_QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", _QUICK_JVM)
os.environ.setdefault("KAFKA_JVM_PERFORMANCE_OPTS", _QUICK_JVM + " -Djava.awt.headless=true")


@pytest.fixture
def mock_cluster():
    cluster = MockCluster()
    yield cluster
    cluster.close()


@pytest.fixture
def embedded_broker():
    if EmbeddedBroker is None:
        pytest.skip("oncelog.server.embedded is not available")
    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture
def bootstrap():
    if EmbeddedBroker is not None:
        with EmbeddedBroker() as broker:
            yield broker.bootstrap_servers
    else:
        cluster = MockCluster()
        yield cluster.bootstrap_servers
        cluster.close()


@pytest.fixture
def fake_broker():
    brokers: list[FakeBroker] = []

    def start(topics: dict[str, int] | None = None, **kwargs: Any) -> FakeBroker:
        broker = FakeBroker(topics, **kwargs)
        brokers.append(broker)
        return broker

    yield start
    for broker in brokers:
        broker.close()


# ================================================================================================
# end of the client tests section
# ================================================================================================


# -- cluster tests --------------------------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that starts ZooKeeper (through the zookeeper_server fixture, however
    indirectly) is a ``cluster`` test, so that the fast tier (-m "not cluster") leaves it out
    without each test having to say so."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "zookeeper_server" in names:
            item.add_marker(pytest.mark.cluster)
        if any(n in names for n in _KAFKA_FIXTURES):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory):
    """One ZooKeeper server for the session's cluster tests (each test takes a chroot of its
    own)."""
    from oncelog.harness.zookeeper import ZooKeeperServer

    require_zookeeper()
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), fsync=False,
                             die_with_parent=True)
    server.start()
    yield server
    server.stop()


# -- Apache Kafka beside oncelog (tests/test_kafka_*.py) ------------------------------------------
#
#   apache_kafka   the bootstrap address of one real Apache Kafka (KRaft, one node) shared by the
#                  whole session (see support/apache_kafka.py); tests use names of their own
#   kafka_tools    Kafka's command-line tools run in one JVM per worker (KafkaTools.run)
#   kafka_jars     the ':'-separated classpath of Kafka's client, Streams, tools and broker
# Every test using one of them is marked ``kafka`` (left out of the fast tier).

_KAFKA_FIXTURES = ("apache_kafka", "kafka_tools", "kafka_jars")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller: the workers inherit the directory
        from support.apache_kafka import shared_dir

        shared_dir()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        from support.apache_kafka import stop_shared_kafka

        stop_shared_kafka()


@pytest.fixture(scope="session")
def apache_kafka() -> str:
    from support.apache_kafka import shared_kafka_bootstrap

    return shared_kafka_bootstrap()


@pytest.fixture(scope="session")
def kafka_tools(tmp_path_factory: pytest.TempPathFactory):
    from support.apache_kafka import require_kafka

    from oncelog.harness.apache_kafka import KafkaTools

    require_kafka()
    tools = KafkaTools(tmp_path_factory.mktemp("kafka-tools"))
    yield tools
    tools.close()


@pytest.fixture(scope="session")
def kafka_jars() -> str:
    from support.apache_kafka import require_kafka

    from oncelog.harness.apache_kafka import kafka_classpath

    require_kafka()
    return kafka_classpath()
