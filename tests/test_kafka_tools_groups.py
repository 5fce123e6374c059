"""kafka-consumer-groups against oncelog and against the real Kafka, the same commands side by
side, their tables compared column by column (ids, hosts and ports normalised): --list,
--describe (offsets, --members, --members --verbose, --state) with a live member and without,
--reset-offsets (--to-earliest, --to-latest, --to-offset, --shift-by, --to-datetime; --dry-run
and --execute; --all-topics and --topic t:0), --delete-offsets and --delete."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer
from support.interop import unique_topic
from support.kafka_tools_compare import (
    BS,
    ToolPair,
    assert_same_output,
    assert_same_table,
    normalise,
)

from oncelog.harness.broker_process import BrokerProcess


@pytest.fixture(scope="module")
def oncelog(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("oncelog") / "data",
                       settings={"group.initial.rebalance.delay.ms": "0"}) as broker:
        yield broker.bootstrap_servers


@pytest.fixture
def pair(kafka_tools, apache_kafka, oncelog):
    return ToolPair(kafka_tools, apache_kafka, oncelog)


def groups(pair: ToolPair, *args: str):
    return pair.run("kafka-consumer-groups", "--bootstrap-server", BS, *args)


def setup_group(pair: ToolPair, topic: str, group: str) -> None:
    """A topic of two partitions with keys 0..9 (the same partitioner on both sides), read to the
    end by the console consumer in ``group``, which commits as it closes."""
    k, o = pair.run("kafka-topics", "--bootstrap-server", BS, "--create", "--topic", topic,
                    "--partitions", "2")
    assert (k.returncode, o.returncode) == (0, 0)
    k, o = pair.run("kafka-console-producer", "--bootstrap-server", BS, "--topic", topic,
                    "--reader-property", "parse.key=true", input="".join(
                        f"key{i}\tv{i}\n" for i in range(10)))
    assert (k.returncode, o.returncode) == (0, 0)
    k, o = pair.run("kafka-console-consumer", "--bootstrap-server", BS, "--topic", topic,
                    "--group", group, "--from-beginning", "--max-messages", "10",
                    "--timeout-ms", "30000")
    assert (k.returncode, o.returncode) == (0, 0), (k.stderr, o.stderr)


def test_describe_an_empty_group_and_reset_its_offsets(pair):
    t = unique_topic("kg-topic")
    g = unique_topic("kg-group")
    setup_group(pair, t, g)
    k, o = groups(pair, "--list")
    assert g in k.stdout.split() and g in o.stdout.split()

    offsets = None
    for args in ((), ("--offsets",), ("--members",), ("--members", "--verbose"), ("--state",)):
        k, o = groups(pair, "--describe", "--group", g, *args)
        assert (k.returncode, o.returncode) == (0, 0)
        assert o.stderr == k.stderr
        assert o.stderr.strip() == f"Consumer group '{g}' has no active members."
        rows = assert_same_table(k.stdout, o.stdout)
        if args in ((), ("--offsets",)):
            offsets = rows
        if args == ("--state",):
            assert rows == [{"GROUP": g, "COORDINATOR (ID)": "<host:port>(1)",
                             "ASSIGNMENT-STRATEGY": "-", "STATE": "Empty", "#MEMBERS": "0"}]
    assert offsets is not None and sum(int(r["CURRENT-OFFSET"]) for r in offsets) == 10
    ends = {r["PARTITION"]: int(r["LOG-END-OFFSET"]) for r in offsets}

    def reset(*args: str) -> list[dict[str, str]]:
        k, o = groups(pair, "--group", g, "--reset-offsets", *args)
        assert (k.returncode, o.returncode) == (0, 0), (k.stdout + k.stderr, o.stdout + o.stderr)
        return assert_same_table(k.stdout, o.stdout)

    def committed() -> dict[str, str]:
        k, o = groups(pair, "--describe", "--group", g, "--offsets")
        rows = assert_same_table(k.stdout, o.stdout)
        return {r["PARTITION"]: r["CURRENT-OFFSET"] for r in rows}

    at_end = {p: str(n) for p, n in ends.items()}
    assert {r["PARTITION"]: r["NEW-OFFSET"]
            for r in reset("--to-earliest", "--all-topics", "--dry-run")} == {"0": "0", "1": "0"}
    assert committed() == at_end  # a dry run changes nothing
    reset("--to-earliest", "--all-topics", "--execute")
    assert committed() == {"0": "0", "1": "0"}
    assert [r["NEW-OFFSET"] for r in reset("--to-offset", "1", "--topic", f"{t}:0",
                                           "--execute")] == ["1"]
    assert committed() == {"0": "1", "1": "0"}
    reset("--shift-by", "2", "--all-topics", "--execute")
    assert committed() == {"0": str(min(3, ends["0"])), "1": str(min(2, ends["1"]))}
    reset("--to-latest", "--topic", t, "--execute")
    assert committed() == at_end
    # every record is younger than 2020: the earliest offset; one from the future: the end
    rows = reset("--to-datetime", "2020-01-01T00:00:00.000", "--all-topics", "--dry-run")
    assert {r["PARTITION"]: r["NEW-OFFSET"] for r in rows} == {"0": "0", "1": "0"}
    rows = reset("--to-datetime", "2999-01-01T00:00:00.000", "--all-topics", "--dry-run")
    assert {r["PARTITION"]: r["NEW-OFFSET"] for r in rows} == at_end

    # --delete-offsets of one partition, then of a partition that does not exist
    k, o = groups(pair, "--group", g, "--delete-offsets", "--topic", f"{t}:1")
    assert_same_output(k, o)
    assert committed() == {"0": at_end["0"]}  # partition 1: no committed offset, not listed
    k, o = groups(pair, "--group", g, "--delete-offsets", "--topic", f"{t}:7")
    assert_same_output(k, o)
    assert "UnknownTopicOrPartitionException" in o.stdout

    k, o = groups(pair, "--delete", "--group", g)
    assert_same_output(k, o)
    assert o.stdout.strip() == f"Deletion of requested consumer groups ('{g}') was successful."
    for gone in (g, unique_topic("kg-never")):
        k, o = groups(pair, "--describe", "--group", gone)
        assert_same_output(k, o)  # Kafka 4: GroupIdNotFoundException (DescribeGroups v6)
        assert f"GroupIdNotFoundException: Group {gone} not found." in o.stdout


def _join(bootstrap: str, topic: str, group: str, client_id: str) -> Consumer:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "partition.assignment.strategy": "range"})
    c.subscribe([topic])
    deadline = time.monotonic() + 60
    while not c.assignment():
        assert time.monotonic() < deadline, "no assignment within 60 s"
        c.poll(0.2)
    return c


def test_describe_a_group_with_a_live_member(pair, apache_kafka, oncelog):
    t = unique_topic("kg-live")
    g = unique_topic("kg-live-group")
    setup_group(pair, t, g)
    members = [_join(b, t, g, "kg-live-client") for b in (apache_kafka, oncelog)]
    try:
        for args in ((), ("--members",), ("--members", "--verbose"), ("--state",)):
            k, o = groups(pair, "--describe", "--group", g, *args)
            assert (k.returncode, o.returncode) == (0, 0)
            assert o.stderr == k.stderr == ""
            rows = assert_same_table(k.stdout, o.stdout)
            if args == ():
                assert {r["CONSUMER-ID"] for r in rows} == {"<member-id>"}
                assert {r["HOST"] for r in rows} == {"/<host>"}
                assert {r["CLIENT-ID"] for r in rows} == {"kg-live-client"}
            if args == ("--members", "--verbose"):
                assert rows[0]["#PARTITIONS"] == "2"
            if args == ("--state",):
                assert (rows[0]["ASSIGNMENT-STRATEGY"], rows[0]["STATE"],
                        rows[0]["#MEMBERS"]) == ("range", "Stable", "1")
        # a live group's offsets cannot be reset: the same refusal
        k, o = groups(pair, "--group", g, "--reset-offsets", "--to-earliest", "--all-topics",
                      "--execute")
        assert (k.returncode, normalise(o.stdout + o.stderr)) == \
            (o.returncode, normalise(k.stdout + k.stderr))
        assert "can only be reset if the group" in o.stdout + o.stderr
    finally:
        for c in members:
            c.close()
