"""The harness beside a real Apache Kafka: scripts/kafka.sh runs Kafka's tools by their names,
the session's Kafka answers, and the one-JVM tool runner gives a tool's output and exit code."""

from __future__ import annotations

import subprocess

import pytest
from support.interop import unique_topic

from oncelog.harness.apache_kafka import KAFKA_SH, kafka_sh, kafka_version


def test_kafka_sh_knows_every_tool_of_kafkas_bin_and_runs_one_by_its_name(kafka_jars):
    names = kafka_sh("list").stdout.decode().split()
    for tool in ("kafka-topics", "kafka-console-producer", "kafka-console-consumer",
                 "kafka-consumer-groups", "kafka-configs", "kafka-transactions", "kafka-acls",
                 "kafka-delete-records", "kafka-get-offsets", "kafka-dump-log",
                 "kafka-producer-perf-test", "kafka-consumer-perf-test", "kafka-storage",
                 "kafka-server-start", "kafka-share-groups", "kafka-console-share-consumer",
                 "kafka-metadata-shell", "connect-mirror-maker"):
        assert tool in names
    assert kafka_version().startswith("4.")
    # a tool in a JVM of its own, by its usual name (with or without .sh)
    out = kafka_sh("kafka-topics.sh", "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip().startswith(kafka_version())
    bad = subprocess.run(["bash", str(KAFKA_SH), "kafka-nonesuch"], check=False,
                         capture_output=True)
    assert bad.returncode == 2 and b"unknown tool" in bad.stderr


def test_the_tool_runner_gives_each_tools_output_and_exit_code(apache_kafka, kafka_tools):
    topic = unique_topic("harness")
    created = kafka_tools.run("kafka-topics", "--bootstrap-server", apache_kafka, "--create",
                              "--topic", topic, "--partitions", "2").check()
    assert f"Created topic {topic}." in created.stdout
    again = kafka_tools.run("kafka-topics", "--bootstrap-server", apache_kafka, "--create",
                            "--topic", topic, "--partitions", "2")
    assert again.returncode == 1 and "already exists" in again.stdout  # as Kafka prints it
    kafka_tools.run("kafka-console-producer", "--bootstrap-server", apache_kafka, "--topic",
                    topic, input="one\ntwo\n").check()
    read = kafka_tools.run("kafka-console-consumer", "--bootstrap-server", apache_kafka,
                           "--topic", topic, "--from-beginning", "--max-messages", "2").check()
    assert sorted(read.stdout.split()) == ["one", "two"]


@pytest.mark.slow
def test_a_three_node_kafka_replicates_and_rides_out_a_node_kill(tmp_path, kafka_jars,
                                                                  kafka_tools):
    """ApacheKafka(nodes=3): a KRaft quorum of three combined nodes; a topic with three
    replicas keeps taking acks=all writes with one node SIGKILLed, and the node comes back."""
    from oncelog.harness.apache_kafka import ApacheKafka

    with ApacheKafka(tmp_path / "k3", nodes=3, heap="256M", tools=kafka_tools) as kafka:
        bs = kafka.bootstrap_servers
        kafka_tools.run("kafka-topics", "--bootstrap-server", bs, "--create", "--topic", "r3",
                        "--partitions", "1", "--replication-factor", "3",
                        "--config", "min.insync.replicas=2").check()
        kafka.kill(3)
        kafka_tools.run("kafka-console-producer", "--bootstrap-server", bs, "--topic", "r3",
                        "--producer-property", "acks=all", input="a\nb\n").check()
        kafka.restart(3)
        described = kafka_tools.run("kafka-topics", "--bootstrap-server", bs, "--describe",
                                    "--topic", "r3").check().stdout
        assert "ReplicationFactor: 3" in described
        read = kafka_tools.run("kafka-console-consumer", "--bootstrap-server", bs, "--topic",
                               "r3", "--from-beginning", "--max-messages", "2").check()
        assert read.stdout.split() == ["a", "b"]


def test_cluster_ids_are_kafka_uuids_that_no_command_line_takes_for_an_option():
    """A base64url id can start with '-', and `kafka-storage format -t -Xy...` then fails
    (seen in CI); Kafka's Uuid.randomUuid draws again, and so do we."""
    import base64

    from oncelog.harness.apache_kafka import _cluster_id

    ids = [_cluster_id() for _ in range(2000)]  # about 1 in 64 would start with '-'
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
