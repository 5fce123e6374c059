"""The rest of Kafka's bin/ against oncelog, each beside the session's real Kafka: what works
gives what Kafka gives; what oncelog does not serve fails at once with Kafka's own
UnsupportedVersionException ("The node does not support ..."), never a hang. The outcomes are
listed in docs/kafka-compatibility.md, "Kafka's command-line tools (B)"."""

from __future__ import annotations

import json
import re

import confluent_kafka
import pytest
from support.interop import unique_topic

from oncelog.harness.apache_kafka import kafka_sh
from oncelog.server.embedded import EmbeddedBroker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def oncelog_bs():
    with EmbeddedBroker() as b:
        yield b.bootstrap_servers


@pytest.fixture(scope="module")
def both(apache_kafka, oncelog_bs, kafka_tools):
    """A topic of two partitions with ten records, and a consumer group that read them and
    committed, on each broker."""
    topic = unique_topic("tools-b")
    out = {}
    for name, bs in (("kafka", apache_kafka), ("oncelog", oncelog_bs)):
        kafka_tools.run("kafka-topics", "--bootstrap-server", bs, "--create", "--topic", topic,
                        "--partitions", "2").check()
        kafka_tools.run("kafka-console-producer", "--bootstrap-server", bs, "--topic", topic,
                        input="".join(f"v{i}\n" for i in range(10))).check()
        group = f"{topic}-g"
        c = confluent_kafka.Consumer({"bootstrap.servers": bs, "group.id": group,
                                      "auto.offset.reset": "earliest",
                                      "enable.auto.commit": False})
        c.subscribe([topic])
        got = 0
        while got < 10:
            m = c.poll(10)
            assert m is not None and m.error() is None
            got += 1
        c.commit(asynchronous=False)
        c.close()
        out[name] = bs
    return topic, out


def run(kafka_tools, tool: str, bs: str, *args: str):
    return kafka_tools.run(tool, "--bootstrap-server", bs, *args)


def test_the_tools_oncelog_serves_answer_as_on_kafka(both, kafka_tools, tmp_path):
    topic, bss = both
    group = f"{topic}-g"
    seen: dict[str, dict[str, object]] = {"kafka": {}, "oncelog": {}}
    for name, bs in bss.items():
        s = seen[name]
        # kafka-broker-api-versions: one broker, id 1, every API the client knows listed
        r = run(kafka_tools, "kafka-broker-api-versions", bs).check()
        assert re.match(r"127\.0\.0\.1:\d+ \(id: 1 rack: null isFenced: false\) -> \(",
                        r.stdout), name
        s["apis"] = re.findall(r"^\t(\w+)\(\d+\):", r.stdout, re.MULTILINE)
        assert "Produce" in s["apis"] and "Produce(0): UNSUPPORTED" not in r.stdout
        # kafka-features describe: transaction.version 2 finalized (KIP-890), as on Kafka
        r = run(kafka_tools, "kafka-features", bs, "describe").check()
        s["txn_feature"] = re.sub(r"Epoch: \d+", "", next(
            line for line in r.stdout.splitlines() if "transaction.version" in line)).split()
        # kafka-groups --list: the group, its type and protocol
        r = run(kafka_tools, "kafka-groups", bs, "--list").check()
        s["groups"] = [line.split() for line in r.stdout.splitlines()
                       if line.startswith(("GROUP", group))]
        # kafka-streams-application-reset: the input topic's offsets reset to the beginning
        r = kafka_tools.run("kafka-streams-application-reset", "--bootstrap-server", bs,
                            "--application-id", group, "--input-topics", topic).check()
        s["reset"] = sorted(r.stdout.replace(group, "G").replace(topic, "T").splitlines())
        # kafka-e2e-latency: 20 round trips through a topic of its own
        r = kafka_tools.run("kafka-e2e-latency", "--bootstrap-server", bs, "--topic",
                            f"{topic}-lat", "--num-records", "20", "--producer-acks", "all",
                            "--record-size", "100").check()
        assert re.search(r"^Avg latency: [\d.]+ ms$", r.stdout, re.MULTILINE), (name, r)
        # kafka-streams-groups --list and kafka-share-groups --list: none
        s["streams"] = run(kafka_tools, "kafka-streams-groups", bs, "--list").check().stdout
        s["shares"] = run(kafka_tools, "kafka-share-groups", bs, "--list").check().stdout
    assert seen["oncelog"] == seen["kafka"]
    assert seen["kafka"]["groups"] == [["GROUP", "TYPE", "PROTOCOL"],
                                       [group, "Classic", "consumer"]]
    assert "Topic: T Partition: 0 Offset: 0" in seen["kafka"]["reset"]


def test_verifiable_producer_and_consumer_and_cluster_id(oncelog_bs, both):
    """In JVMs of their own, by their usual names (they print to the JVM's stdout)."""
    topic = unique_topic("verifiable")
    r = kafka_sh("kafka-verifiable-producer", "--bootstrap-server", oncelog_bs, "--topic",
                 topic, "--max-messages", "5", timeout=120)
    events = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert r.returncode == 0, r.stderr.decode()
    assert [e["name"] for e in events] == ["startup_complete"] + ["producer_send_success"] * 5 \
        + ["shutdown_complete", "tool_data"]
    assert (events[-1]["sent"], events[-1]["acked"]) == (5, 5)
    r = kafka_sh("kafka-verifiable-consumer", "--bootstrap-server", oncelog_bs, "--topic",
                 topic, "--group-id", f"{topic}-g", "--max-messages", "5", "--reset-policy",
                 "earliest", timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    events = [json.loads(line) for line in r.stdout.decode().splitlines()]
    consumed = sum(e["count"] for e in events if e["name"] == "records_consumed")
    committed = [e for e in events if e["name"] == "offsets_committed"]
    assert consumed == 5 and committed and all(e["success"] for e in committed)
    assert sum(o["offset"] for e in committed for o in e["offsets"]) == 5
    # kafka-cluster cluster-id: the id oncelog's metadata gives
    r = kafka_sh("kafka-cluster", "cluster-id", "--bootstrap-server", oncelog_bs)
    assert r.returncode == 0, r.stderr.decode()
    from oncelog import Admin

    with Admin(bootstrap_servers=oncelog_bs) as admin:
        cluster_id = admin.describe_cluster().cluster_id
    assert r.stdout.decode().strip() == f"Cluster ID: {cluster_id}"


UNSERVED = [
    # (tool and arguments, the API oncelog does not serve)
    (["kafka-leader-election", "--election-type", "preferred", "--all-topic-partitions"],
     "ELECT_LEADERS"),
    (["kafka-client-metrics", "--list"], "LIST_CONFIG_RESOURCES"),
    (["kafka-delegation-tokens", "--describe", "--command-config", "{empty}"],
     "DESCRIBE_DELEGATION_TOKEN"),
    (["kafka-reassign-partitions", "--verify", "--reassignment-json-file", "{reassign}"],
     "LIST_PARTITION_REASSIGNMENTS"),
    (["kafka-metadata-quorum", "describe", "--status"], "DESCRIBE_QUORUM"),
    (["kafka-share-groups", "--describe", "--group", "{topic}-share"], "SHARE_GROUP_DESCRIBE"),
]


def test_what_oncelog_does_not_serve_fails_at_once_with_kafkas_error(both, kafka_tools,
                                                                     tmp_path):
    """Each fails in one request's time: UNSUPPORTED_VERSION from ApiVersions, no retry."""
    topic, bss = both
    files = {"empty": tmp_path / "admin.properties", "reassign": tmp_path / "reassign.json"}
    files["empty"].write_text("")
    files["reassign"].write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": [1], "log_dirs": ["any"]}]}))
    names = {k: str(v) for k, v in files.items()} | {"topic": topic}
    for args, api in UNSERVED:
        args = [a.format(**names) for a in args]
        on_kafka = run(kafka_tools, args[0], bss["kafka"], *args[1:])
        r = run(kafka_tools, args[0], bss["oncelog"], *args[1:])
        message = f"The node does not support {api}"  # Kafka's UnsupportedVersionException
        assert message in r.stdout + r.stderr, (args, r)
        assert message not in on_kafka.stdout + on_kafka.stderr, (args, on_kafka)
        # the tool's own exit code for a failed call (kafka-share-groups prints and exits 0,
        # on Kafka too); kafka-delegation-tokens fails on Kafka's PLAINTEXT listener as well
        assert r.returncode == (0 if args[0] == "kafka-share-groups" else 1), (args, r)


def test_a_share_consumer_gets_nothing_and_ends_at_its_timeout_not_a_hang(both, kafka_tools):
    topic, bss = both
    r = kafka_tools.run("kafka-console-share-consumer", "--bootstrap-server", bss["oncelog"],
                        "--topic", topic, "--group", f"{topic}-share", "--timeout-ms", "3000",
                        timeout=60).check()
    assert r.stdout == "" and "Processed a total of 0 messages" in r.stderr


def test_log_dirs_and_a_reassignment_plan_as_on_kafka(both, kafka_tools, tmp_path):
    """kafka-log-dirs --describe and kafka-reassign-partitions --generate (which asks for the
    log dirs too): DescribeLogDirs (KIP-113) answers the data directory and each partition's
    size."""
    topic, bss = both
    move = tmp_path / "move.json"
    move.write_text(json.dumps({"version": 1, "topics": [{"topic": topic}]}))
    seen = {}
    for name, bs in bss.items():
        r = kafka_tools.run("kafka-log-dirs", "--bootstrap-server", bs, "--describe",
                            "--topic-list", topic).check()
        lines = r.stdout.splitlines()
        assert lines[:2] == ["Querying brokers for log directories information",
                             "Received log directory information from brokers 1"], (name, r)
        described = json.loads(lines[2])
        (broker,) = described["brokers"]
        (log_dir,) = broker["logDirs"]
        assert log_dir["error"] is None and log_dir["logDir"].startswith("/"), name
        sizes = {p["partition"]: p["size"] for p in log_dir["partitions"]}
        assert sorted(sizes) == [f"{topic}-0", f"{topic}-1"] and sum(sizes.values()) > 0
        seen[name, "log-dirs"] = (described["version"], broker["broker"], sorted(
            (p["partition"], p["offsetLag"], p["isFuture"]) for p in log_dir["partitions"]))
        r = kafka_tools.run("kafka-reassign-partitions", "--bootstrap-server", bs,
                            "--generate", "--topics-to-move-json-file", str(move),
                            "--broker-list", "1").check()
        seen[name, "plan"] = r.stdout.replace(log_dir["logDir"], "DIR")
    assert seen["oncelog", "log-dirs"] == seen["kafka", "log-dirs"]
    assert seen["oncelog", "plan"] == seen["kafka", "plan"]
    assert '"log_dirs":["DIR"]' in seen["kafka", "plan"]
