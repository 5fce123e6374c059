"""kafka-console-producer and kafka-console-consumer against oncelog and against the real Kafka:
keys, headers, acks, the consumer's print.* properties, --partition/--offset, --group (its
offsets then in kafka-consumer-groups) and --isolation-level read_committed over transactions
committed and aborted by another client (confluent_kafka)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from support.interop import unique_topic
from support.kafka_tools_compare import BS, ToolPair, assert_same_output, assert_same_table

from oncelog.harness.broker_process import BrokerProcess


@pytest.fixture(scope="module")
def oncelog(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("oncelog") / "data",
                       settings={"group.initial.rebalance.delay.ms": "0"}) as broker:
        yield broker.bootstrap_servers


@pytest.fixture
def pair(kafka_tools, apache_kafka, oncelog):
    return ToolPair(kafka_tools, apache_kafka, oncelog)


def create(pair: ToolPair, topic: str, partitions: int = 1) -> None:
    k, o = pair.run("kafka-topics", "--bootstrap-server", BS, "--create", "--topic", topic,
                    "--partitions", str(partitions))
    assert (k.returncode, o.returncode) == (0, 0), (k.stderr, o.stderr)


def consume(pair: ToolPair, topic: str, *args: str):
    return pair.run("kafka-console-consumer", "--bootstrap-server", BS, "--topic", topic,
                    "--timeout-ms", "30000", *args)


LINES = "h1:v1\tk1:a\nh2:v2,h3:v3\tk2:b\nh4:\tk3:c\n"  # headers TAB key:value


def test_keys_headers_and_every_print_property(pair):
    t = unique_topic("kc-keys")
    create(pair, t)
    k, o = pair.run("kafka-console-producer", "--bootstrap-server", BS, "--topic", t,
                    "--reader-property", "parse.key=true", "--reader-property", "key.separator=:",
                    "--reader-property", "parse.headers=true",
                    "--command-property", "acks=all", input=LINES)
    assert_same_output(k, o)
    k, o = pair.run("kafka-console-producer", "--bootstrap-server", BS, "--topic", t,
                    "--request-required-acks", "1", input="plain1\nplain2\n")
    assert_same_output(k, o)
    # a header line without its separator: the same error, the same exit code
    k, o = pair.run("kafka-console-producer", "--bootstrap-server", BS, "--topic", t,
                    "--reader-property", "parse.headers=true", input="\tnoheader\n")
    assert (k.returncode, o.returncode) == (1, 1) and o.stderr.strip() == k.stderr.strip()

    printing = [a for p in ("print.key", "print.headers", "print.offset", "print.partition",
                            "print.timestamp") for a in ("--formatter-property", f"{p}=true")]
    k, o = consume(pair, t, "--partition", "0", "--offset", "1", "--max-messages", "3",
                   *printing)
    assert_same_output(k, o, stderr=True)
    assert [line.split("\t")[1:] for line in o.stdout.splitlines()] == [
        ["Partition:0", "Offset:1", "h2:v2,h3:v3", "k2", "b"],
        ["Partition:0", "Offset:2", "h4:", "k3", "c"],
        ["Partition:0", "Offset:3", "NO_HEADERS", "null", "plain1"]]
    assert all(line.startswith("CreateTime:") for line in o.stdout.splitlines())
    k, o = consume(pair, t, "--from-beginning", "--max-messages", "5",
                   "--formatter-property", "print.key=true",
                   "--formatter-property", "key.separator=|")
    assert_same_output(k, o, stderr=True)
    assert o.stdout.splitlines() == ["k1|a", "k2|b", "k3|c", "null|plain1", "null|plain2"]


def test_group_consumption_commits_offsets_seen_by_consumer_groups(pair):
    t = unique_topic("kc-group")
    group = unique_topic("kc-group-g")
    create(pair, t, partitions=2)
    lines = "".join(f"k{i}:v{i}\n" for i in range(10))
    k, o = pair.run("kafka-console-producer", "--bootstrap-server", BS, "--topic", t,
                    "--reader-property", "parse.key=true", "--reader-property", "key.separator=:",
                    input=lines)
    assert_same_output(k, o)
    k, o = consume(pair, t, "--group", group, "--from-beginning", "--max-messages", "10")
    assert (k.returncode, o.returncode) == (0, 0)
    assert sorted(k.stdout.split()) == sorted(o.stdout.split()) == \
        sorted(f"v{i}" for i in range(10))
    k, o = pair.run("kafka-consumer-groups", "--bootstrap-server", BS, "--describe",
                    "--group", group)
    rows = assert_same_table(k.stdout, o.stdout)
    # the console consumer commits on close: every partition at its end, no lag
    assert sum(int(r["CURRENT-OFFSET"]) for r in rows) == 10
    assert all(r["CURRENT-OFFSET"] == r["LOG-END-OFFSET"] and r["LAG"] == "0" for r in rows)
    # the same group again: nothing left to read
    k, o = consume(pair, t, "--group", group, "--max-messages", "1", "--timeout-ms", "3000")
    assert (k.stdout, o.stdout) == ("", "")


def _transactions(bootstrap: str, topic: str, txn_id: str) -> None:
    """Committed c1 c2, aborted a1 a2, committed c3: by confluent_kafka (librdkafka)."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    p.init_transactions(30)
    for values, commit in ((["c1", "c2"], True), (["a1", "a2"], False), (["c3"], True)):
        p.begin_transaction()
        for v in values:
            p.produce(topic, v.encode())
        p.flush(30)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)


def test_read_committed_hides_aborted_records(pair, apache_kafka, oncelog):
    t = unique_topic("kc-txn")
    create(pair, t)
    txn_id = unique_topic("kc-txn-id")
    for bootstrap in (apache_kafka, oncelog):
        _transactions(bootstrap, t, txn_id)
    k, o = consume(pair, t, "--from-beginning", "--isolation-level", "read_committed",
                   "--max-messages", "3", "--formatter-property", "print.offset=true")
    assert_same_output(k, o, stderr=True)
    # 2 and 5: the first two transactions' markers (commit, abort); 3 and 4: the aborted records
    assert o.stdout.splitlines() == ["Offset:0\tc1", "Offset:1\tc2", "Offset:6\tc3"]
    k, o = consume(pair, t, "--from-beginning", "--isolation-level", "read_uncommitted",
                   "--max-messages", "5")
    assert_same_output(k, o, stderr=True)
    assert o.stdout.split() == ["c1", "c2", "a1", "a2", "c3"]
