"""``oncelog produce`` and ``oncelog consume`` as Kafka's console producer and consumer, run as
users run them against one broker process for the module: the console consumer's print
format, kcat's --format, headers and timestamps both ways, --group (commits what was printed),
--include, and Ctrl-C: a real SIGINT to a real process."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from support.cli import ONCELOG, groups_broker, oncelog  # noqa: F401 (a fixture)
from support.waiting import wait_until

from oncelog import Admin
from oncelog.client import TopicPartition

TS = int(time.time() * 1000) - 60_000  # a CreateTime within any retention


@pytest.fixture(scope="module")
def bs(groups_broker):  # noqa: F811
    return ["--bootstrap-server", groups_broker.bootstrap_servers]


def read(bs, topic: str, n: int, *flags: str) -> list[str]:
    """The first ``n`` records' lines (a record may print as several, or run into the next)."""
    return oncelog("consume", *bs, "--topic", topic, "--from-beginning", "--max-messages",
                   str(n), "--timeout-ms", "10000", *flags).stdout.splitlines()


def test_kafkas_print_format_with_headers_keys_and_timestamps(bs):
    oncelog("topics", "create", *bs, "--topic", "shown")
    oncelog("produce", *bs, "--topic", "shown", "--timestamp", str(TS), "--property",
            "parse.headers=true", "--property", "parse.key=true", "--property",
            "null.marker=<null>",
            stdin="h1:a,h2:b\tk1\tv1\n<null>\tk2\tv2\nh:<null>\t<null>\t<null>\n")
    assert read(bs, "shown", 3, "--print-timestamp", "--print-partition", "--print-offset",
                "--print-headers", "--print-key") == [
        f"CreateTime:{TS}\tPartition:0\tOffset:0\th1:a,h2:b\tk1\tv1",
        f"CreateTime:{TS}\tPartition:0\tOffset:1\tNO_HEADERS\tk2\tv2",
        f"CreateTime:{TS}\tPartition:0\tOffset:2\th:null\tnull\tnull"]
    # the same through Kafka's --property names, and its separators
    assert read(bs, "shown", 3, "--property", "print.offset=true", "--property",
                "print.value=false", "--property", "key.separator=|", "--property",
                "print.key=true", "--property", "null.literal=NULL") == [
        "Offset:0|k1", "Offset:1|k2", "Offset:2|NULL"]
    assert read(bs, "shown", 3) == ["v1", "v2", "null"]
    # kcat's format string; a null prints as nothing, its length as -1
    assert oncelog("consume", *bs, "--topic", "shown", "--from-beginning", "--max-messages",
                   "3", "--format", r"%t [%p] @%o %T k=%k(%K) h=%h: %s(%S)\n"
                   ).stdout.splitlines() == [
        f"shown [0] @0 {TS} k=k1(2) h=h1=a,h2=b: v1(2)",
        f"shown [0] @1 {TS} k=k2(2) h=: v2(2)",
        f"shown [0] @2 {TS} k=(-1) h=h=: (-1)"]
    bad = oncelog("consume", *bs, "--topic", "shown", "--format", "%x", check=False)
    assert bad.returncode == 2 and "unsupported token %x" in bad.stderr


def test_produce_headers_as_kafkas_line_reader(bs):
    oncelog("topics", "create", *bs, "--topic", "headed")
    oncelog("produce", *bs, "--topic", "headed", "--header", "source=cli", "--property",
            "parse.headers=true", "--property", "headers.delimiter=|", "--property",
            "headers.separator=;", "--property", "headers.key.separator==",
            stdin="a=1;b=2|one\n")
    assert read(bs, "headed", 1, "--print-headers") == ["source:cli,a:1,b:2\tone"]
    refused = oncelog("produce", *bs, "--topic", "headed", "--property",
                      "parse.headers=true", stdin="nokey\tx\n", check=False)
    assert refused.returncode == 1
    assert "No header key separator found in pair 'nokey' on line number 1" in refused.stderr
    same = oncelog("produce", *bs, "--topic", "headed", "--property", "parse.headers=true",
                   "--property", "headers.delimiter=,", stdin="x\n", check=False)
    assert same.returncode == 2
    assert "headers.delimiter and headers.separator may not be equal" in same.stderr


@pytest.mark.slow  # three groups joined, a dozen commands
def test_a_group_resumes_where_it_stopped_and_include_subscribes_by_pattern(bs):
    for topic in ("metrics-a", "metrics-b", "other"):
        oncelog("topics", "create", *bs, "--topic", topic)
        oncelog("produce", *bs, "--topic", topic, stdin=f"{topic}-1\n{topic}-2\n")
    first = oncelog("consume", *bs, "--topic", "metrics-a", "--group", "g", "--from-beginning",
                    "--max-messages", "1")
    assert first.stdout == "metrics-a-1\n"
    # the group committed what was printed, not the fetched record after it
    second = oncelog("consume", *bs, "--topic", "metrics-a", "--group", "g",
                     "--max-messages", "1")
    assert second.stdout == "metrics-a-2\n"
    matched = oncelog("consume", *bs, "--include", "metrics-.*", "--from-beginning",
                      "--max-messages", "4", "--format", r"%t:%s\n")
    assert sorted(matched.stdout.splitlines()) == [
        "metrics-a:metrics-a-1", "metrics-a:metrics-a-2", "metrics-b:metrics-b-1",
        "metrics-b:metrics-b-2"]
    for args, message in (
            (["--topic", "other", "--include", "o.*"],
             "Exactly one of --include/--topic is required."),
            (["--topic", "other", "--group", "g", "--partition", "0"],
             "Options group and partition cannot be specified together."),
            (["--topic", "other", "--partition", "0", "--offset", "1", "--from-beginning"],
             "Options from-beginning and offset cannot be specified together.")):
        bad = oncelog("consume", *bs, *args, check=False)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr


@pytest.mark.slow  # two processes started and stopped
def test_ctrl_c_stops_both_cleanly(bs, groups_broker):  # noqa: F811
    oncelog("topics", "create", *bs, "--topic", "stopped")
    consumer = subprocess.Popen([*ONCELOG, "consume", *bs, "--topic", "stopped", "--group",
                                 "sig", "--from-beginning"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    producer = subprocess.Popen([*ONCELOG, "produce", *bs, "--topic", "stopped"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    producer.stdin.write("one\ntwo\nthree\n")
    producer.stdin.flush()  # stdin stays open: the producer waits for more
    tp = TopicPartition("stopped", 0)
    with Admin(bootstrap_servers=groups_broker.bootstrap_servers) as admin:
        wait_until(lambda: admin.list_offsets({tp: -1})[tp].offset == 3, 30,
                   "the three records")
        producer.send_signal(signal.SIGINT)
        _, err = producer.communicate(timeout=30)
        # as Kafka's tools, which the JVM ends with 128 + the signal's number
        assert producer.returncode == 130, err
        assert err == "Produced 3 records to stopped.\n"
        wait_until(lambda: consumer.stdout.readline() == "three\n", 30, "the consumer")
        consumer.send_signal(signal.SIGINT)
        _, err = consumer.communicate(timeout=30)
        assert consumer.returncode == 130, err
        assert err == "Processed a total of 3 messages\n"  # no traceback
        assert admin.list_consumer_group_offsets("sig") == {tp: 3}  # committed on the way out
