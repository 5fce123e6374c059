"""``oncelog groups`` (list, describe, reset-offsets, delete, delete-offsets) run as users run it, against one
broker process for the module: Kafka's columns and messages, ``--output json``, the dry run
and ``--execute``, and the refusals Kafka's tool and broker give a group with live members
(reset-offsets, delete; OffsetCommit outside the group answered UNKNOWN_MEMBER_ID)."""

from __future__ import annotations

import json
import time

import pytest
from support.cli import groups_broker, help_text, oncelog  # noqa: F401 (a fixture)
from support.waiting import wait_until

from oncelog import Admin, Consumer
from oncelog.client import TopicPartition
from oncelog.errors import UnknownMemberIdError

HEADER = ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
          "CONSUMER-ID", "HOST", "CLIENT-ID"]


@pytest.fixture(scope="module")
def bs(groups_broker):  # noqa: F811
    return ["--bootstrap-server", groups_broker.bootstrap_servers]


def three_partitions(bs, topic: str) -> None:
    """``topic`` with 3 partitions of 4, 2 and 0 records."""
    oncelog("topics", "create", *bs, "--topic", topic, "--partitions", "3")
    for partition, n in ((0, 4), (1, 2)):
        oncelog("produce", *bs, "--topic", topic, "--partition", str(partition),
                stdin="".join(f"{partition}-{i}\n" for i in range(n)))


def consume_all(bs, group: str, topic: str) -> None:
    """Consume the 6 records of ``topic`` as ``group``, which commits them."""
    done = oncelog("consume", *bs, "--topic", topic, "--group", group, "--from-beginning",
                   "--max-messages", "6", "--timeout-ms", "10000")
    assert "Processed a total of 6 messages" in done.stderr


def committed(bs, group: str) -> dict[tuple[str, int], int | None]:
    rows = json.loads(oncelog("groups", "describe", *bs, "--group", group, "--output",
                              "json").stdout)
    return {(r["topic"], r["partition"]): r["current_offset"] for r in rows}


@pytest.mark.slow  # a dozen commands, each a Python start (the slow part)
def test_describe_prints_kafkas_columns_for_a_group_with_lag(bs):
    three_partitions(bs, "orders")
    consume_all(bs, "lagging", "orders")  # then 3 more arrive
    oncelog("produce", *bs, "--topic", "orders", "--partition", "0", stdin="x\ny\nz\n")
    out = oncelog("groups", "describe", *bs, "--group", "lagging")
    lines = out.stdout.splitlines()
    assert lines[0] == ""  # as Kafka: a blank line before each group's table
    assert lines[1].split() == HEADER
    assert [line.split() for line in lines[2:]] == [
        ["lagging", "orders", "0", "4", "7", "3", "-", "-", "-"],
        ["lagging", "orders", "1", "2", "2", "0", "-", "-", "-"],
        ["lagging", "orders", "2", "0", "0", "0", "-", "-", "-"]]
    # aligned: every column starts where its header does
    starts = [lines[1].index(h) for h in HEADER]
    for line in lines[2:]:
        assert [line[s - 1] if s else " " for s in starts] == [" "] * len(HEADER)
    assert "Consumer group 'lagging' has no active members." in out.stderr
    rows = json.loads(oncelog("groups", "describe", *bs, "--group", "lagging", "--output",
                              "json").stdout)
    assert rows[0] == {"group": "lagging", "topic": "orders", "partition": 0,
                       "current_offset": 4, "log_end_offset": 7, "lag": 3,
                       "consumer_id": None, "host": None, "client_id": None,
                       "held_by_transaction": None}
    # the old name and Kafka's action flags
    kafka_style = oncelog("consumer-groups", "--describe", *bs, "--group", "lagging")
    assert kafka_style.stdout == out.stdout
    assert "lagging" in oncelog("groups", "--list", *bs).stdout.split()
    listed = json.loads(oncelog("groups", "list", *bs, "--output", "json").stdout)
    assert {"group": "lagging", "type": "classic", "state": "Empty"} in listed


@pytest.mark.slow  # a dozen commands, each a Python start
def test_reset_offsets_plans_by_default_and_writes_with_execute(bs):
    three_partitions(bs, "moves")
    consume_all(bs, "resets", "moves")
    before = committed(bs, "resets")
    assert before == {("moves", 0): 4, ("moves", 1): 2, ("moves", 2): 0}
    plan = oncelog("groups", "reset-offsets", *bs, "--group", "resets", "--topic", "moves",
                   "--to-earliest")
    assert "WARN: No action will be performed as the --execute option is missing." \
        in plan.stderr
    lines = plan.stdout.splitlines()
    assert lines[:2] == ["", f"{'GROUP':30} {'TOPIC':30} {'PARTITION':10} NEW-OFFSET"]
    assert [line.split() for line in lines[2:]] == [
        ["resets", "moves", "0", "0"], ["resets", "moves", "1", "0"],
        ["resets", "moves", "2", "0"]]
    assert committed(bs, "resets") == before  # a dry run writes nothing

    def reset(*how: str) -> dict:
        oncelog("groups", "reset-offsets", *bs, "--group", "resets", *how, "--execute")
        return committed(bs, "resets")

    assert reset("--topic", "moves:0,1", "--to-earliest") == {
        ("moves", 0): 0, ("moves", 1): 0, ("moves", 2): 0}
    assert reset("--all-topics", "--shift-by", "3") == {
        ("moves", 0): 3, ("moves", 1): 2, ("moves", 2): 0}  # within each log
    assert reset("--topic", "moves:0", "--to-latest")["moves", 0] == 4
    # past the end: the end, with Kafka's warning
    beyond = oncelog("groups", "reset-offsets", *bs, "--group", "resets", "--topic",
                     "moves:1", "--to-offset", "99", "--output", "json")
    assert json.loads(beyond.stdout) == [
        {"group": "resets", "topic": "moves", "partition": 1, "new_offset": 2}]
    assert "New offset (99) is higher than latest offset for topic partition moves-1. " \
        "Value will be set to 2" in beyond.stderr
    no_offset = oncelog("groups", "reset-offsets", *bs, "--group", "fresh", "--topic",
                        "moves", "--shift-by", "-1", check=False)
    assert no_offset.returncode == 2
    assert "Cannot shift offset for partition moves-0 since there is no current committed " \
        "offset" in no_offset.stderr


def test_reset_to_a_datetime(bs):
    hour_ago = int(time.time() * 1000) - 3_600_000
    oncelog("topics", "create", *bs, "--topic", "stamped")
    for ts, line in ((hour_ago, "old\n"), (hour_ago + 60_000, "newer\n")):
        oncelog("produce", *bs, "--topic", "stamped", "--timestamp", str(ts), stdin=line)
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((hour_ago + 1000) / 1000))
    out = oncelog("groups", "reset-offsets", *bs, "--group", "dated", "--topic", "stamped",
                  "--to-datetime", f"{iso}.000", "--execute", "--output", "json")
    assert json.loads(out.stdout) == [
        {"group": "dated", "topic": "stamped", "partition": 0, "new_offset": 1}]
    assert committed(bs, "dated") == {("stamped", 0): 1}
    # after the last record: "is empty", the end, as Kafka
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    out = oncelog("groups", "reset-offsets", *bs, "--group", "dated", "--topic", "stamped",
                  "--to-datetime", later, "--output", "json")
    assert json.loads(out.stdout)[0]["new_offset"] == 2
    assert "Warn: Partition 0 from topic stamped is empty. Falling back to latest known " \
        "offset." in out.stderr
    # Kafka's --delete-offsets (KIP-496)
    gone = oncelog("groups", "--delete-offsets", *bs, "--group", "dated", "--topic", "stamped")
    assert gone.stdout.splitlines() == [
        "Request succeed for deleting offsets with topic stamped group dated", "",
        f"{'TOPIC':30} {'PARTITION':15} STATUS", f"{'stamped':30} {'0':15} Successful"]
    assert committed(bs, "dated") == {}


@pytest.mark.slow  # a consumer joins a group (the broker's initial rebalance delay)
def test_a_group_with_members_is_described_and_refused_as_kafka_does(bs, groups_broker):  # noqa: F811
    three_partitions(bs, "busy")
    consumer = Consumer(bootstrap_servers=groups_broker.bootstrap_servers, group_id="live",
                        client_id="the-app", auto_offset_reset="earliest",
                        enable_auto_commit=False)

    def assigned() -> bool:
        consumer.poll(0.2)
        return len(consumer.assignment()) == 3

    try:
        consumer.subscribe(["busy"])
        wait_until(assigned, 30, "the consumer's assignment")
        consumer.commit({TopicPartition("busy", 0): 1})
        out = oncelog("groups", "describe", *bs, "--group", "live").stdout.splitlines()
        rows = [line.split() for line in out[2:]]
        assert [r[:3] + r[7:] for r in rows] == [
            ["live", "busy", str(p), "/127.0.0.1", "the-app"] for p in range(3)]
        assert rows[0][3:6] == ["1", "4", "3"]
        assert all(r[6].startswith("the-app-") for r in rows)  # the member id
        members = oncelog("groups", "describe", *bs, "--group", "live", "--members",
                          "--verbose").stdout.splitlines()
        assert members[1].split() == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID",
                                      "#PARTITIONS", "ASSIGNMENT"]
        assert members[2].split()[2:] == ["/127.0.0.1", "the-app", "3", "busy(0,1,2)"]
        state = json.loads(oncelog("groups", "describe", *bs, "--group", "live", "--state",
                                   "--output", "json").stdout)
        assert state[0]["state"] == "Stable" and state[0]["num_members"] == 1
        assert state[0]["assignment_strategy"] in ("range", "cooperative-sticky")

        refused = oncelog("groups", "reset-offsets", *bs, "--group", "live", "--all-topics",
                          "--to-earliest", "--execute", check=False)
        assert refused.returncode == 1
        assert "Error: Assignments can only be reset if the group 'live' is inactive, but " \
            "the current state is Stable." in refused.stderr
        # the broker refuses it too: an OffsetCommit without membership to a live group
        with Admin(bootstrap_servers=groups_broker.bootstrap_servers) as admin:
            with pytest.raises(UnknownMemberIdError):
                admin.alter_consumer_group_offsets("live", {TopicPartition("busy", 0): 0})
            assert admin.list_consumer_group_offsets("live")[TopicPartition("busy", 0)] == 1
        kept = oncelog("groups", "delete-offsets", *bs, "--group", "live", "--topic", "busy:0",
                       check=False)
        assert kept.returncode == 1
        assert kept.stdout.splitlines()[:2] == [
            "", "Error: Encounter some partition level error, see the follow-up details:"]
        assert kept.stdout.splitlines()[-1].split(None, 2) == [
            "busy", "0", "Error: :The consumer group is actively subscribed to the topic"]
        gone = oncelog("groups", "delete", *bs, "--group", "live", "--group", "nobody",
                       check=False)
        assert gone.returncode == 1
        assert gone.stdout.splitlines() == [
            "", "Error: Deletion of some consumer groups failed:",
            "* Group 'live' could not be deleted due to: The group is not empty.",
            "* Group 'nobody' could not be deleted due to: The group id does not exist."]
    finally:
        consumer.close()
    # once it has left: Empty, and deleted with its offsets
    deleted = oncelog("groups", "delete", *bs, "--group", "live")
    assert deleted.stdout == "Deletion of requested consumer groups ('live') was successful.\n"
    assert "live" not in oncelog("groups", "list", *bs).stdout.split()


def test_every_action_has_help():
    for action in ("list", "describe", "reset-offsets", "delete-offsets", "delete"):
        for command in ("groups", "consumer-groups"):  # the old name: an alias
            assert f"usage: oncelog groups {action}" in help_text(command, action)
