"""Kafka's own kafka-transactions (list, describe, describe-producers, find-hanging, abort,
forceTerminateTransaction) against oncelog and against a real Apache Kafka, with the same
transactions set up on both: committed, aborted, open, and hanging.

A hanging transaction (KIP-664) is one a partition holds open while no transaction coordinator
knows of it. Kafka 3.6+ prevents them with partition verification (KIP-890 part 1), so both
brokers here run with ``transaction.partition.verification.enable=false``: a dedicated Kafka
(the session's one keeps verification on) and a dedicated oncelog broker. The hanging write is
an idempotent producer id writing a transactional batch, stamped two hours ago so that
find-hanging's default --max-transaction-timeout (15 minutes) counts it.

Every table is compared column by column; producer ids are compared by their order of
allocation, timestamps by the window in which the test made them."""

from __future__ import annotations

import time

import pytest
from support.interop import unique_topic
from support.kafka_tools_b import (
    columns,
    hanging_write,
    table,
    transactional_producer,
    write_in_transaction,
)
from support.waiting import wait_until

from oncelog import Admin
from oncelog.harness.apache_kafka import ApacheKafka
from oncelog.harness.broker_process import BrokerProcess

NO_VERIFICATION = {"transaction.partition.verification.enable": "false"}
HANG_AGE_MS = 2 * 3600 * 1000


@pytest.fixture(scope="module")
def kafka_nv(tmp_path_factory, kafka_jars):
    with ApacheKafka(tmp_path_factory.mktemp("kafka-txn"), heap="384M",
                     settings=NO_VERIFICATION) as kafka:
        yield kafka.bootstrap_servers


@pytest.fixture(scope="module")
def oncelog_nv(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("oncelog-txn") / "data",
                       settings=NO_VERIFICATION, die_with_parent=True) as broker:
        yield broker.bootstrap_servers


class Setup:
    """The same transactions on one broker: ids, producers and the times they were made in."""

    def __init__(self, tools, bootstrap: str) -> None:
        self.tools, self.bs = tools, bootstrap
        self.topic = unique_topic("tx")
        self.ids = {end: f"{self.topic}-{end}" for end in ("commit", "abort", "open")}
        self.before = int(time.time() * 1000)
        tools.run("kafka-topics", "--bootstrap-server", bootstrap, "--create", "--topic",
                  self.topic, "--partitions", "2").check()
        self.producers = {}
        for end, values in (("commit", [b"c1", b"c2"]), ("abort", [b"a1"]), ("open", [b"o1"])):
            p = transactional_producer(bootstrap, self.ids[end])
            write_in_transaction(p, self.topic, values, None if end == "open" else end)
            self.producers[end] = p
        # offsets of partition 0: c1 c2 COMMIT a1 ABORT o1 | hanging at 6
        self.hanging = [hanging_write(bootstrap, self.topic, p, HANG_AGE_MS, f"{self.topic}-h{p}")
                        for p in (0, 1)]
        self.after = int(time.time() * 1000)

    def txn(self, *args: str):
        return self.tools.run("kafka-transactions", "--bootstrap-server", self.bs, *args)

    def close(self) -> None:
        self.producers.clear()  # librdkafka's producers end with their last reference


@pytest.fixture
def both(kafka_nv, oncelog_nv, kafka_tools):
    """The transactions, on each broker (topics and ids of their own: each test has its own;
    the brokers are the module's)."""
    setups = {"kafka": Setup(kafka_tools, kafka_nv), "oncelog": Setup(kafka_tools, oncelog_nv)}
    # the commit and abort have finished writing their markers on both
    for s in setups.values():
        wait_until(lambda s=s: {r["TransactionState"] for r in table(s.txn("list").stdout)
                                if r["TransactionalId"].startswith(s.topic)}
                   == {"CompleteCommit", "CompleteAbort", "Ongoing"}, 30, "markers")
    yield setups
    for s in setups.values():
        s.close()


def rank(values):
    """Producer ids by order of allocation: 0 for the first one, ..."""
    order = sorted({int(v) for v in values})
    return {str(v): str(i) for i, v in enumerate(order)}


def test_list_describe_describe_producers_and_force_terminate_as_on_kafka(both):
    check_list(both)
    check_describe(both)
    check_describe_producers(both)
    check_force_terminate(both)


def check_list(both):
    out = {}
    for name, s in both.items():
        r = s.txn("list").check()
        assert columns(r.stdout) == ["TransactionalId", "Coordinator", "ProducerId",
                                     "TransactionState"], name
        rows = [row for row in table(r.stdout) if row["TransactionalId"].startswith(s.topic)]
        ids = rank(row["ProducerId"] for row in rows)
        out[name] = sorted((row["TransactionalId"].removeprefix(s.topic), row["Coordinator"],
                            ids[row["ProducerId"]], row["TransactionState"]) for row in rows)
    assert out["oncelog"] == out["kafka"]
    assert {row[3] for row in out["kafka"]} == {"CompleteCommit", "CompleteAbort", "Ongoing"}


def describe_row(s: Setup, end: str) -> dict[str, str]:
    r = s.txn("describe", "--transactional-id", s.ids[end]).check()
    assert columns(r.stdout) == [
        "CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
        "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
        "TopicPartitions"]
    (row,) = table(r.stdout)
    return row


def check_describe(both):
    out = {}
    for name, s in both.items():
        for end in ("open", "commit", "abort"):
            row = describe_row(s, end)
            # the open and the completed transactions keep the time they began (Kafka's
            # prepareComplete keeps txnStartTimestamp) and how long ago that was
            start = int(row["CurrentTransactionStartTimeMs"])
            assert s.before <= start <= s.after, (name, end, row)
            assert 0 <= int(row["TransactionDurationMs"]) <= int(time.time() * 1000) - start
            out[name, end] = (row["CoordinatorId"], row["ProducerEpoch"],
                              row["TransactionState"], row["TransactionTimeoutMs"],
                              row["TopicPartitions"].replace(s.topic, "T"))
    for end in ("open", "commit", "abort"):
        assert out["oncelog", end] == out["kafka", end], end
    assert out["kafka", "open"][2:] == ("Ongoing", "60000", "T-0")
    # an id no coordinator knows: the same error, exit code 1
    errors = {}
    for name, s in both.items():
        r = s.txn("describe", "--transactional-id", f"{s.topic}-nobody")
        assert r.returncode == 1
        errors[name] = r.stderr.replace(s.topic, "T").strip()
    assert errors["oncelog"] == errors["kafka"]
    assert "could not be found" in errors["kafka"]


def producer_rows(s: Setup, partition: int) -> list[dict[str, str]]:
    r = s.txn("describe-producers", "--topic", s.topic, "--partition", str(partition)).check()
    assert columns(r.stdout) == ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch",
                                 "LastSequence", "LastTimestamp",
                                 "CurrentTransactionStartOffset"]
    return table(r.stdout)


def normalised_producers(s: Setup, partition: int) -> list[tuple[str, ...]]:
    rows = producer_rows(s, partition)
    ids = rank(r["ProducerId"] for r in rows)
    hanging_ids = {str(pid) for pid, _ in s.hanging}
    out = []
    for r in rows:
        ts = int(r["LastTimestamp"])
        if r["ProducerId"] in hanging_ids:
            # its write, two hours old; or the abort marker written since
            assert (s.before - HANG_AGE_MS <= ts <= s.after - HANG_AGE_MS
                    or s.before <= ts <= time.time() * 1000)
        else:  # a write of the setup, or a marker written since
            assert s.before <= ts <= time.time() * 1000
        out.append((ids[r["ProducerId"]], r["ProducerEpoch"], r["LatestCoordinatorEpoch"],
                    r["LastSequence"], r["CurrentTransactionStartOffset"]))
    return sorted(out)


def check_describe_producers(both):
    for partition in (0, 1):
        got = {name: normalised_producers(s, partition) for name, s in both.items()}
        assert got["oncelog"] == got["kafka"], partition
    # committed, aborted, open (start 5) and hanging (start 6) on partition 0
    assert [r[4] for r in normalised_producers(both["kafka"], 0)] == ["None", "None", "5", "6"]


def hanging_rows(s: Setup, *scope: str) -> list[tuple[str, ...]]:
    r = s.txn("find-hanging", *scope).check()
    assert columns(r.stdout) == ["Topic", "Partition", "ProducerId", "ProducerEpoch",
                                 "CoordinatorEpoch", "StartOffset", "LastTimestamp",
                                 "Duration(min)"]
    rows = [row for row in table(r.stdout) if row["Topic"] == s.topic]
    pids = {str(pid): f"h{i}" for i, (pid, _) in enumerate(s.hanging)}
    out = []
    for row in rows:
        assert int(row["Duration(min)"]) >= HANG_AGE_MS // 60_000
        out.append((row["Partition"], pids[row["ProducerId"]], row["ProducerEpoch"],
                    row["CoordinatorEpoch"], row["StartOffset"]))
    return sorted(out)


def test_find_hanging_by_topic_and_by_broker_then_abort_them(both):
    for scope in (["--topic"], ["--broker-id", "1"]):
        got = {}
        for name, s in both.items():
            args = ["--topic", s.topic] if scope == ["--topic"] else scope
            got[name] = hanging_rows(s, *args)
        assert got["oncelog"] == got["kafka"], scope
        # only the two hanging ones: the open transaction is known to its coordinator
        assert got["kafka"] == [("0", "h0", "0", "-1", "6"), ("1", "h1", "0", "-1", "0")]
    # --partition narrows the search; it needs --topic
    for name, s in both.items():
        assert [r[0] for r in hanging_rows(s, "--topic", s.topic, "--partition", "1")] == ["1"]
        r = s.txn("find-hanging", "--partition", "1", "--broker-id", "1")
        assert (r.returncode, r.stderr.strip()) == (
            1, "The --partition argument requires --topic to be provided"), name

    errors = {}
    for name, s in both.items():
        # a start offset at which no transaction starts: refused, as by Kafka
        r = s.txn("abort", "--topic", s.topic, "--partition", "0", "--start-offset", "3")
        assert r.returncode == 1
        errors[name] = r.stderr.replace(s.topic, "T").strip()
        # by its start offset (brokers 3.0+)...
        s.txn("abort", "--topic", s.topic, "--partition", "0", "--start-offset", "6").check()
        # ...and by producer id, epoch and coordinator epoch (older brokers' way)
        pid, epoch = s.hanging[1]
        s.txn("abort", "--topic", s.topic, "--partition", "1", "--producer-id", str(pid),
              "--producer-epoch", str(epoch), "--coordinator-epoch", "-1").check()
    assert errors["oncelog"] == errors["kafka"] == (
        "Could not find any open transactions starting at offset 3 on partition T-0")
    for name, s in both.items():
        assert hanging_rows(s, "--topic", s.topic) == [], name
        assert [r["CurrentTransactionStartOffset"] for r in producer_rows(s, 1)] == ["None"]
    got = {name: normalised_producers(s, 0) for name, s in both.items()}
    assert got["oncelog"] == got["kafka"]
    assert [r[4] for r in got["kafka"]] == ["None", "None", "5", "None"]  # the open one stays


def check_force_terminate(both):
    rows = {}
    for name, s in both.items():
        s.txn("forceTerminateTransaction", "--transactionalId", s.ids["open"]).check()
        row = wait_until(lambda s=s: (r := describe_row(s, "open"))["TransactionState"]
                         not in ("PrepareAbort", "PrepareEpochFence") and r, 30, "aborted")
        # an Empty transaction has no start time: DescribeTransactions answers -1 on both
        rows[name] = (row["ProducerEpoch"], row["TransactionState"],
                      row["TransactionTimeoutMs"], row["CurrentTransactionStartTimeMs"],
                      row["TransactionDurationMs"], row["TopicPartitions"])
        # the open transaction's data is aborted: its start offset is gone from partition 0
        assert [r[4] for r in normalised_producers(s, 0)] == ["None", "None", "None", "6"], \
            name
    assert rows["oncelog"] == rows["kafka"]
    assert rows["kafka"][1:2] + rows["kafka"][3:5] == ("Empty", "None", "None")
    errors = {}
    for name, s in both.items():
        r = s.txn("forceTerminateTransaction", "--transactionalId", f"{s.topic}-nobody")
        errors[name] = (r.returncode, r.stderr.replace(s.topic, "T").strip())
    assert errors["oncelog"] == errors["kafka"]


def test_oncelogs_admin_reads_kafkas_answer_for_a_transaction_not_begun(apache_kafka,
                                                                        oncelog_nv):
    """Kafka answers DescribeTransactions with start time -1 for an id with no transaction
    begun; oncelog's Admin reads it as none (kio refuses negative timestamps), and oncelog's
    broker answers -1 the same way."""
    for bs in (apache_kafka, oncelog_nv):
        txn_id = unique_topic("empty-txn")
        producer = transactional_producer(bs, txn_id)
        with Admin(bootstrap_servers=bs) as admin:
            d = admin.describe_transactions([txn_id])[txn_id]
        assert (d.state, d.start_ms, d.partitions) == ("Empty", None, frozenset()), bs
        del producer
