"""The flags a Kafka user types on their first hour, through ``oncelog`` run as a command
against one broker process (shared by the module): kafka-topics.sh's and kafka-acls.sh's
action flags, --if-exists / --if-not-exists / --exclude-internal, describe's health filters,
the console tools' --producer-property / --producer.config / --consumer-property /
--consumer.config, --offset earliest|latest|N|-N|s@MS, --from-timestamp, kcat's -J, and a
usage error naming the subcommand."""

from __future__ import annotations

import json

import pytest
from support.cli import groups_broker, oncelog  # noqa: F401 (groups_broker: a fixture)

from oncelog import Admin, Producer, TopicPartition


@pytest.fixture(scope="module")
def bs(groups_broker):  # noqa: F811
    return ["--bootstrap-server", groups_broker.bootstrap_servers]


def _internal_topic_exists(bootstrap: str) -> None:
    """A committed offset: the broker creates __consumer_offsets."""
    from oncelog import Consumer

    with Consumer(bootstrap_servers=bootstrap, group_id="makes-offsets-topic") as c:
        c.assign([TopicPartition("kt-list", 0)])
        c.commit({TopicPartition("kt-list", 0): 0})


def test_topics_action_flags_if_exists_if_not_exists_and_exclude_internal(bs):
    created = oncelog("topics", "--create", *bs, "--topic", "kt-list", "--partitions", "2")
    assert created.stdout == "Created topic kt-list.\n"
    again = oncelog("topics", "--create", *bs, "--topic", "kt-list", check=False)
    assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr
    quiet = oncelog("topics", "--create", *bs, "--topic", "kt-list", "--if-not-exists")
    assert quiet.stdout == "" and quiet.stderr == ""

    _internal_topic_exists(bs[1])
    listed = oncelog("topics", "--list", *bs).stdout.split()
    assert "kt-list" in listed and "__consumer_offsets" in listed  # Kafka's: included
    assert listed == sorted(listed)
    public = oncelog("topics", "--list", *bs, "--exclude-internal").stdout.split()
    assert "kt-list" in public and "__consumer_offsets" not in public
    described = oncelog("topics", "--describe", *bs, "--exclude-internal").stdout
    assert "Topic: kt-list\t" in described and "__consumer_offsets" not in described
    assert "Topic: __consumer_offsets\t" in oncelog("topics", "--describe", *bs).stdout

    for action, extra in (("--delete", []), ("--alter", ["--partitions", "3"]),
                          ("--describe", [])):
        missing = oncelog("topics", action, *bs, "--topic", "kt-none", *extra, check=False)
        assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr, \
            (action, missing.stderr)
        skipped = oncelog("topics", action, *bs, "--topic", "kt-none", *extra, "--if-exists")
        assert (skipped.returncode, skipped.stdout, skipped.stderr) == (0, "", ""), action
    # an existing topic is still altered, described and deleted with --if-exists
    assert oncelog("topics", "--alter", *bs, "--topic", "kt-list", "--partitions", "3",
                   "--if-exists").stdout == "Topic kt-list now has 3 partitions.\n"
    assert "PartitionCount: 3" in oncelog("topics", "--describe", *bs, "--topic", "kt-list",
                                          "--if-exists").stdout
    oncelog("topics", "--delete", *bs, "--topic", "kt-list", "--if-exists")
    assert "kt-list" not in oncelog("topics", "--list", *bs).stdout.split()


def test_describe_health_filters_show_only_the_partitions_asked_for(bs):
    oncelog("topics", "create", *bs, "--topic", "kt-min1", "--partitions", "2",
            "--config", "min.insync.replicas=1")
    oncelog("topics", "create", *bs, "--topic", "kt-min2", "--config",
            "min.insync.replicas=2")
    topics = ["--topic", "kt-min1", "--topic", "kt-min2"]
    # one broker: every ISR is 1, every leader live
    at_min = oncelog("topics", "--describe", *bs, *topics, "--at-min-isr-partitions").stdout
    assert at_min.splitlines() == [
        "\tTopic: kt-min1\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1",
        "\tTopic: kt-min1\tPartition: 1\tLeader: 1\tReplicas: 1\tIsr: 1"]
    under_min = oncelog("topics", "--describe", *bs, *topics,
                        "--under-min-isr-partitions").stdout
    assert under_min.splitlines() == [
        "\tTopic: kt-min2\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1"]
    for healthy in ("--under-replicated-partitions", "--unavailable-partitions"):
        assert oncelog("topics", "--describe", *bs, *topics, healthy).stdout == ""
    overrides = oncelog("topics", "--describe", *bs, "--topics-with-overrides").stdout
    lines = overrides.splitlines()
    assert any(line.startswith("Topic: kt-min1\t") for line in lines)
    assert all(line.startswith("Topic: ") for line in lines)  # no partition lines
    oncelog("topics", "create", *bs, "--topic", "kt-plain")
    assert "kt-plain" not in overrides and "kt-plain" not in oncelog(
        "topics", "--describe", *bs, "--topics-with-overrides").stdout
    js = json.loads(oncelog("topics", "describe", *bs, *topics, "--under-min-isr-partitions",
                            "--output", "json").stdout)
    assert [(t["topic"], [p["partition"] for p in t["partitions"]]) for t in js] == [
        ("kt-min2", [0])]


def test_acls_take_kafka_acls_action_flags(bs):
    # No authorizer on this broker: each action reaches it (and is refused there), which a
    # flag not read as the action would not (argparse would stop with a usage error, exit 2)
    listed = oncelog("acls", "--list", *bs, check=False)
    assert listed.returncode == 1 and "SECURITY_DISABLED" in listed.stderr
    for flag, extra in (("--add", []), ("--remove", ["--force"])):
        out = oncelog("acls", flag, *bs, "--allow-principal", "User:al", "--operation", "Read",
                      "--topic", "t", *extra, check=False)
        assert out.returncode == 1 and "SECURITY_DISABLED" in out.stderr, out


def test_a_usage_error_prints_the_subcommands_usage(bs):
    out = oncelog("topics", "create", *bs, "--topic", "x", "--bogus", check=False)
    assert out.returncode == 2
    assert out.stderr.startswith("usage: oncelog topics create ")
    assert out.stderr.rstrip().endswith(
        "oncelog topics create: error: unrecognized arguments: --bogus")
    flagged = oncelog("topics", "--create", *bs, "--topic", "x", "--bogus", check=False)
    assert flagged.returncode == 2 and flagged.stderr.startswith("usage: oncelog topics create ")
    two = oncelog("topics", "--create", "--delete", *bs, "--topic", "x", check=False)
    assert two.returncode == 2 and two.stderr.startswith("usage: oncelog topics ")
    assert "exactly one action" in two.stderr
    consume = oncelog("consume", *bs, "--topic", "x", "--offset", "soon", check=False)
    assert consume.returncode == 2 and consume.stderr.startswith("usage: oncelog consume ")
    assert "The provided offset value 'soon' is incorrect" in consume.stderr
    groups = oncelog("groups", "--describe", *bs, "--group", "g", "--nope", check=False)
    assert groups.returncode == 2 and groups.stderr.startswith("usage: oncelog groups describe ")
