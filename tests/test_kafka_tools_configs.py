"""kafka-configs against oncelog and against the real Kafka, side by side: a topic's configs
(--describe, --alter --add-config / --delete-config, --all), a broker's and the cluster-wide
default's (--entity-name N / --entity-default, a dynamic config altered and deleted, --all), and
SCRAM users (--add-config 'SCRAM-SHA-256=[iterations=8192,password=...]', --describe,
--delete-config). The deliberate differences are in docs/kafka-compatibility.md ("Kafka's
command-line tools (A)")."""

from __future__ import annotations

import re

import pytest
from support.interop import unique_topic
from support.kafka_tools_compare import BS, ToolPair, assert_same_output

from oncelog.harness.broker_process import BrokerProcess

# Kafka 4's controller sets min.insync.replicas as a cluster-wide dynamic default (KIP-966's
# eligible leader replicas); oncelog has no such layer (docs/kafka-compatibility.md).
KAFKA_ELR_DEFAULT = "  min.insync.replicas=1 sensitive=false " \
                    "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:min.insync.replicas=1}"


@pytest.fixture(scope="module")
def oncelog(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("oncelog") / "data") as broker:
        yield broker.bootstrap_servers


@pytest.fixture
def pair(kafka_tools, apache_kafka, oncelog):
    return ToolPair(kafka_tools, apache_kafka, oncelog)


def configs(pair: ToolPair, *args: str):
    return pair.run("kafka-configs", "--bootstrap-server", BS, *args)


def entries(text: str) -> dict[str, tuple[str, str]]:
    """``  name=value sensitive=... synonyms={...}`` lines: name -> (value, synonyms)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^  ([^=]+)=(.*) sensitive=\w+ synonyms=\{(.*)\}$", line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3))
    return out


def test_topic_configs_described_altered_and_deleted_as_with_kafka(pair):
    t = unique_topic("kcf-topic")
    k, o = pair.run("kafka-topics", "--bootstrap-server", BS, "--create", "--topic", t,
                    "--config", "retention.ms=12345")
    assert (k.returncode, o.returncode) == (0, 0)
    topic = ("--entity-type", "topics", "--entity-name", t)
    k, o = configs(pair, *topic, "--describe")
    assert_same_output(k, o)
    assert "retention.ms=12345 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=12345" \
        in o.stdout
    k, o = configs(pair, *topic, "--alter", "--add-config",
                   "retention.bytes=1000,cleanup.policy=[compact,delete]")
    assert_same_output(k, o)
    assert o.stdout.strip() == f"Completed updating config for topic {t}."
    k, o = configs(pair, *topic, "--alter", "--delete-config", "retention.ms")
    assert_same_output(k, o)
    k, o = pair.settled("kafka-configs", "--bootstrap-server", BS, *topic, "--describe")
    assert_same_output(k, o)
    assert list(entries(o.stdout)) == ["cleanup.policy", "retention.bytes"]
    assert entries(o.stdout)["cleanup.policy"] == (
        "compact,delete",
        ("DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact,delete, DEFAULT_CONFIG:log.cleanup.policy="
        "delete"))

    # --all: every config with Kafka's value and synonyms (none where Kafka's broker setting is
    # unset: retention.ms, segment.ms, ...), but min.insync.replicas' ELR default; and the
    # three configs Kafka 4 removed, which oncelog still accepts (docs/kafka-compatibility.md)
    k, o = configs(pair, *topic, "--describe", "--all")
    assert (k.returncode, o.returncode) == (0, 0)
    ke, oe = entries(k.stdout), entries(o.stdout)
    removed_in_kafka_4 = {"message.downconversion.enable", "message.format.version",
                          "message.timestamp.difference.max.ms"}
    assert set(oe) - set(ke) == removed_in_kafka_4
    assert set(ke) - set(oe) == set()
    for name, (value, synonyms) in ke.items():
        assert oe[name][0] == value, name
        if name == "min.insync.replicas":
            assert synonyms == "DYNAMIC_DEFAULT_BROKER_CONFIG:min.insync.replicas=1, " \
                "DEFAULT_CONFIG:min.insync.replicas=1"
            assert oe[name][1] == "DEFAULT_CONFIG:min.insync.replicas=1"
        else:
            assert oe[name][1] == synonyms, name

    # errors: an unknown config, a bad value, and a topic that does not exist
    for bad in ("bogus.x=1", "retention.ms=later", "cleanup.policy=sometimes"):
        k, o = configs(pair, *topic, "--alter", "--add-config", bad)
        assert (k.returncode, o.returncode) == (1, 1)
        assert _cause(o.stderr) == _cause(k.stderr), bad
    k, o = configs(pair, "--entity-type", "topics", "--entity-name", unique_topic("kcf-none"),
                   "--describe")
    assert_same_output(k, o)
    assert _cause(o.stderr) == _cause(k.stderr)


def _cause(stderr: str) -> str:
    """The exception a tool's stack trace ends with (its first line), or the whole of it."""
    causes = [line for line in stderr.splitlines() if line.startswith("Caused by: ")]
    return causes[-1] if causes else stderr.strip()


def test_broker_configs_per_broker_and_cluster_default(pair):
    broker = ("--entity-type", "brokers", "--entity-name", "1")
    default = ("--entity-type", "brokers", "--entity-default")
    k, o = configs(pair, *broker, "--describe")
    assert_same_output(k, o)
    assert o.stdout.strip() == "Dynamic configs for broker 1 are:"

    # per broker: log.retention.ms (Kafka's synonym default is log.retention.hours; oncelog
    # has the ms setting only)
    k, o = configs(pair, *broker, "--alter", "--add-config", "log.retention.ms=86400001")
    assert_same_output(k, o)
    assert o.stdout.strip() == "Completed updating config for broker 1."
    try:
        # Kafka's broker applies the record of the change a moment later (its value reads
        # null until then)
        k, o = pair.settled("kafka-configs", "--bootstrap-server", BS, *broker, "--describe",
                            agree=lambda k, o: entries(k.stdout).get(
                                "log.retention.ms", ("null",))[0] != "null")
        ke, oe = entries(k.stdout), entries(o.stdout)
        assert list(oe) == list(ke) == ["log.retention.ms"]
        assert ke["log.retention.ms"] == ("86400001", ("DYNAMIC_BROKER_CONFIG:log.retention.ms="
                                          "86400001, DEFAULT_CONFIG:log.retention.hours=168"))
        assert oe["log.retention.ms"] == ("86400001", ("DYNAMIC_BROKER_CONFIG:log.retention.ms="
                                          "86400001, DEFAULT_CONFIG:log.retention.ms=604800000"))
    finally:
        k, o = configs(pair, *broker, "--alter", "--delete-config", "log.retention.ms")
        assert_same_output(k, o)

    # the cluster-wide default (Kafka's is the session's: other tests may have set more there)
    k, o = configs(pair, *default, "--alter", "--add-config", "log.cleaner.min.compaction.lag.ms=7")
    assert_same_output(k, o)
    assert o.stdout.strip() == "Completed updating default config for brokers in the cluster."
    try:
        k, o = pair.settled("kafka-configs", "--bootstrap-server", BS, *default, "--describe",
                            agree=lambda k, o: "log.cleaner.min.compaction.lag.ms=7" in k.stdout)
        assert (k.returncode, o.returncode) == (0, 0)
        assert o.stdout.splitlines()[0] == k.stdout.splitlines()[0] == \
            "Default configs for brokers in the cluster are:"
        lag = "  log.cleaner.min.compaction.lag.ms=7 sensitive=false " \
              "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.cleaner.min.compaction.lag.ms=7}"
        assert lag in k.stdout.splitlines() and lag in o.stdout.splitlines()
        assert KAFKA_ELR_DEFAULT in k.stdout.splitlines()  # not on oncelog's: no ELR
        assert o.stdout.splitlines()[1:] == [lag]
    finally:
        k, o = configs(pair, *default, "--alter", "--delete-config",
                       "log.cleaner.min.compaction.lag.ms")
        assert_same_output(k, o)

    # a setting neither lets change while running: Kafka's refusal
    k, o = configs(pair, *broker, "--alter", "--add-config", "node.id=7")
    assert (k.returncode, o.returncode) == (1, 1)
    assert _cause(o.stderr) == _cause(k.stderr) == "Caused by: org.apache.kafka.common.errors." \
        "InvalidRequestException: Cannot update these configs dynamically: [node.id]"
    # --all: oncelog's settings are a subset of Kafka's (it has no KRaft controller, no
    # remote storage, ...); every one it shares with Kafka is described by both
    k, o = configs(pair, *broker, "--describe", "--all")
    assert (k.returncode, o.returncode) == (0, 0)
    assert o.stdout.splitlines()[0] == k.stdout.splitlines()[0] == "All configs for broker 1 are:"
    shared = set(entries(k.stdout)) & set(entries(o.stdout))
    assert {"num.partitions", "auto.create.topics.enable", "offsets.topic.num.partitions",
            "transaction.state.log.num.partitions", "message.max.bytes"} <= shared


def scram(text: str) -> list[tuple[str, list[str]]]:
    """Each user's line with its mechanisms sorted: Kafka lists them in the order of a HashMap
    keyed by the mechanism enum (identity hash codes: not the same from one run to the next)."""
    out = []
    for line in text.splitlines():
        head, sep, creds = line.partition(" are ")
        out.append((head, sorted(creds.split(", ")) if sep else []))
    return out


def assert_same_scram(k, o) -> None:
    assert (o.returncode, scram(o.stdout)) == (k.returncode, scram(k.stdout)), (k, o)


def test_scram_users(pair):
    user = unique_topic("kcf-user")
    users = ("--entity-type", "users", "--entity-name", user)
    k, o = configs(pair, *users, "--alter", "--add-config",
                   "SCRAM-SHA-256=[iterations=8192,password=pw1]")
    assert_same_output(k, o)
    assert o.stdout.strip() == f"Completed updating config for user {user}."
    k, o = pair.settled("kafka-configs", "--bootstrap-server", BS, *users, "--describe",
                        agree=lambda k, o: scram(k.stdout) == scram(o.stdout))
    assert_same_scram(k, o)
    assert o.stdout.strip() == \
        f"SCRAM credential configs for user-principal '{user}' are SCRAM-SHA-256=iterations=8192"
    k, o = configs(pair, *users, "--alter", "--add-config", "SCRAM-SHA-512=[password=pw2]")
    assert_same_output(k, o)
    k, o = pair.settled("kafka-configs", "--bootstrap-server", BS, *users, "--describe",
                        agree=lambda k, o: scram(k.stdout) == scram(o.stdout))
    assert_same_scram(k, o)
    assert scram(o.stdout)[0][1] == ["SCRAM-SHA-256=iterations=8192",
                                     "SCRAM-SHA-512=iterations=4096"]
    k, o = configs(pair, *users, "--alter", "--delete-config", "SCRAM-SHA-256")
    assert_same_output(k, o)
    k, o = pair.settled("kafka-configs", "--bootstrap-server", BS, *users, "--describe",
                        agree=lambda k, o: scram(k.stdout) == scram(o.stdout))
    assert_same_scram(k, o)
    assert o.stdout.strip().endswith("are SCRAM-SHA-512=iterations=4096")
    # every user (here: at least ours) described without a name
    k, o = configs(pair, "--entity-type", "users", "--describe")
    assert (k.returncode, o.returncode) == (0, 0)
    line = f"SCRAM credential configs for user-principal '{user}' are SCRAM-SHA-512=iterations=4096"
    assert line in k.stdout.splitlines() and line in o.stdout.splitlines()
    # refusals: too few iterations; deleting a credential the user does not have
    k, o = configs(pair, *users, "--alter", "--add-config",
                   "SCRAM-SHA-256=[iterations=1000,password=pw]")
    assert (k.returncode, o.returncode) == (1, 1) and o.stderr == k.stderr
    assert "Iterations 1000 is less than the minimum 4096" in o.stderr
    k, o = configs(pair, *users, "--alter", "--delete-config", "SCRAM-SHA-256")
    assert (k.returncode, o.returncode) == (1, 1)
    assert _cause(o.stderr) == _cause(k.stderr)
    assert "ResourceNotFoundException" in _cause(o.stderr)
    k, o = configs(pair, *users, "--alter", "--delete-config", "SCRAM-SHA-512")
    assert_same_output(k, o)
