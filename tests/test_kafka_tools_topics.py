"""kafka-topics against oncelog and against the real Kafka, the same commands side by side:
create (partitions, replication factor, --config), list (--exclude-internal), describe (plain,
--topics-with-overrides, --under-replicated-partitions, --unavailable-partitions, paged with
--partition-size-limit-per-response), alter --partitions and delete, and their errors.

Differences kept on purpose are in docs/kafka-compatibility.md ("Kafka's command-line tools (A)"):
Kafka 4's describe shows ``min.insync.replicas=1`` among a topic's Configs (the cluster-wide
dynamic default its controller writes for eligible leader replicas, KIP-966); oncelog has none.
"""

from __future__ import annotations

import pytest
from support.interop import unique_topic
from support.kafka_tools_compare import BS, ToolPair, described, normalise

from oncelog.harness.broker_process import BrokerProcess

# Kafka 4's controller writes min.insync.replicas as a cluster-wide dynamic default (KIP-966);
# it shows among every topic's Configs there (see the module's docstring).
KAFKA_ONLY_CONFIG = "min.insync.replicas=1"


@pytest.fixture(scope="module")
def oncelog(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("oncelog") / "data",
                       settings={"group.initial.rebalance.delay.ms": "0"}) as broker:
        yield broker.bootstrap_servers


@pytest.fixture
def pair(kafka_tools, apache_kafka, oncelog):
    return ToolPair(kafka_tools, apache_kafka, oncelog)


def topics(pair: ToolPair, *args: str):
    return pair.run("kafka-topics", "--bootstrap-server", BS, *args)


def describe(pair: ToolPair, *args: str):
    """``kafka-topics --describe``, asked again until Kafka's answer has as many lines as
    oncelog's (Kafka's broker learns of a topic, its configs and its partitions from its
    controller a moment after the admin call returned)."""
    return pair.settled("kafka-topics", "--bootstrap-server", BS, "--describe", *args,
                        agree=lambda k, o: (k.returncode, len(k.stdout.splitlines()))
                        == (o.returncode, len(o.stdout.splitlines())))


def configs_of(line: dict[str, str]) -> list[str]:
    return [c for c in line["Configs"].split(",") if c and c != KAFKA_ONLY_CONFIG]


def assert_same_description(k, o) -> list[dict[str, str]]:
    """The topic line (its Configs but Kafka's min.insync.replicas) and every partition line,
    Elr and LastKnownElr included."""
    assert (k.returncode, o.returncode) == (0, 0), (k.stdout + k.stderr, o.stdout + o.stderr)
    kd, od = described(k.stdout), described(o.stdout)
    assert len(od) == len(kd), (k.stdout, o.stdout)
    for kl, ol in zip(kd, od, strict=True):
        if "Configs" in kl:
            assert configs_of(ol) == configs_of(kl), (k.stdout, o.stdout)
            kl, ol = dict(kl, Configs=""), dict(ol, Configs="")
        assert list(ol) == list(kl), (k.stdout, o.stdout)  # the same fields, in order
        assert ol == kl, (k.stdout, o.stdout)
    return kd


def test_create_describe_alter_and_delete_print_what_kafka_prints(pair):
    t = unique_topic("kt-topic")
    plain = unique_topic("kt-plain")
    for k, o in (topics(pair, "--create", "--topic", t, "--partitions", "3",
                        "--replication-factor", "1", "--config", "retention.ms=12345",
                        "--config", "cleanup.policy=compact"),
                 topics(pair, "--create", "--topic", plain, "--partitions", "2")):
        assert (k.returncode, o.returncode) == (0, 0), (k.stdout + k.stderr, o.stdout + o.stderr)
        assert normalise(o.stdout) == normalise(k.stdout)

    lines = assert_same_description(*describe(pair, "--topic", t))
    head, *parts = lines
    assert head["PartitionCount"] == "3" and head["ReplicationFactor"] == "1"
    assert configs_of(head) == ["cleanup.policy=compact", "retention.ms=12345"]
    assert [p["Partition"] for p in parts] == ["0", "1", "2"]
    # KIP-966's DescribeTopicPartitions answered: empty ELR lists, not "N/A" (Metadata's)
    assert all(p["Elr"] == "" and p["LastKnownElr"] == "" for p in parts)

    # --topics-with-overrides: the topic lines of topics with an override, no partition lines
    k, o = pair.settled("kafka-topics", "--bootstrap-server", BS, "--describe",
                        "--topics-with-overrides", "--topic", f"{t}|{plain}",
                        agree=lambda k, o: len(k.stdout.splitlines()) == 2)
    kd, od = described(k.stdout), described(o.stdout)
    assert [d["Topic"] for d in od] == [t]  # Kafka lists both: min.insync.replicas everywhere
    assert sorted(d["Topic"] for d in kd) == sorted([t, plain])
    assert configs_of(od[0]) == configs_of(next(d for d in kd if d["Topic"] == t))
    assert not any("Partition" in d for d in od + kd)

    # every partition has its leader and its one replica in sync: nothing printed on either
    for flag in ("--under-replicated-partitions", "--unavailable-partitions"):
        k, o = topics(pair, "--describe", flag, "--topic", f"{t}|{plain}")
        assert (k.returncode, k.stdout.strip()) == (0, "")
        assert (o.returncode, o.stdout.strip()) == (0, "")

    k, o = topics(pair, "--alter", "--topic", plain, "--partitions", "4")
    assert (k.returncode, o.returncode) == (0, 0)
    # Kafka's broker learns of the new partitions from its controller a moment later
    k, o = describe(pair, "--topic", plain)
    head, *parts = assert_same_description(k, o)
    assert head["PartitionCount"] == "4" and len(parts) == 4
    k, o = topics(pair, "--alter", "--topic", plain, "--partitions", "2")
    assert (k.returncode, o.returncode) == (1, 1)
    assert o.stdout == k.stdout  # "... currently has 4 partition(s); 2 would not be an increase."
    assert "would not be an increase" in o.stdout

    k, o = topics(pair, "--create", "--topic", t, "--partitions", "1")
    assert (k.returncode, o.returncode) == (1, 1)
    assert o.stdout == k.stdout == \
        f"Error while executing topic command : Topic '{t}' already exists.\n"

    k, o = topics(pair, "--delete", "--topic", plain)
    assert (k.returncode, o.returncode) == (0, 0) and o.stdout == k.stdout
    # as above: Kafka's broker forgets the topic a moment later
    k, o = pair.settled("kafka-topics", "--bootstrap-server", BS, "--describe", "--topic", plain,
                        agree=lambda k, o: k.returncode == 1)
    assert (k.returncode, o.returncode) == (1, 1) and o.stdout == k.stdout
    assert "does not exist as expected" in o.stdout


def test_create_errors_are_kafkas(pair):
    t = unique_topic("kt-bad")
    for config in ("nonsense.x=1", "retention.ms=abc", "cleanup.policy=sometimes"):
        k, o = topics(pair, "--create", "--topic", t, "--config", config)
        assert (k.returncode, o.returncode) == (1, 1)
        assert o.stdout == k.stdout, config
    # one broker on each side: Kafka (KRaft) adds "or some brokers have all their log
    # directories cordoned" (KIP-1066), which oncelog does not have
    k, o = topics(pair, "--create", "--topic", t, "--replication-factor", "3")
    assert (k.returncode, o.returncode) == (1, 1)
    words = ("Error while executing topic command : Unable to replicate the partition 3 time(s): "
             "The target replication factor of 3 cannot be reached because only 1 broker(s) "
             "are registered")
    assert k.stdout.startswith(words) and o.stdout.startswith(words), (k.stdout, o.stdout)
    k, o = topics(pair, "--describe", "--topic", t)  # nothing was created on either side
    assert (k.returncode, o.returncode) == (1, 1) and o.stdout == k.stdout


def test_list_and_exclude_internal(pair):
    t = unique_topic("kt-list")
    group = unique_topic("kt-list-group")
    k, o = topics(pair, "--create", "--topic", t)
    assert (k.returncode, o.returncode) == (0, 0)
    # a group's committed offset: __consumer_offsets exists on both sides
    k, o = pair.run("kafka-consumer-groups", "--bootstrap-server", BS, "--group", group,
                    "--reset-offsets", "--to-earliest", "--topic", t, "--execute")
    assert (k.returncode, o.returncode) == (0, 0), (k.stdout + k.stderr, o.stdout + o.stderr)
    k, o = topics(pair, "--list")
    for r in (k, o):
        assert r.returncode == 0 and t in r.stdout.split()
        assert "__consumer_offsets" in r.stdout.split()
    k, o = topics(pair, "--list", "--exclude-internal")
    for r in (k, o):
        assert r.returncode == 0 and t in r.stdout.split()
        assert not any(n.startswith("__") for n in r.stdout.split()), r.stdout
    # --topic takes a regular expression, as with Kafka
    k, o = topics(pair, "--list", "--topic", t.replace("kt-list", "kt-l.st"))
    assert (k.stdout, o.stdout) == (t + "\n", t + "\n")


def test_describe_pages_through_describe_topic_partitions(pair):
    """--partition-size-limit-per-response 2 on a topic of 5 partitions and one of 3: the admin
    client follows the broker's cursor (KIP-966) three and more times; every partition once."""
    a, b = unique_topic("kt-page-a"), unique_topic("kt-page-b")
    for name, n in ((a, "5"), (b, "3")):
        k, o = topics(pair, "--create", "--topic", name, "--partitions", n)
        assert (k.returncode, o.returncode) == (0, 0)
    k, o = describe(pair, "--topic", f"{a}|{b}", "--partition-size-limit-per-response", "2")
    lines = assert_same_description(k, o)
    # the topics in the admin client's (hash) order, the same on both sides; partitions sorted
    assert sorted((d["Topic"], d["Partition"]) for d in lines if "Partition" in d) == \
        [(a, str(i)) for i in range(5)] + [(b, str(i)) for i in range(3)]
