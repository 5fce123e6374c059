"""Apache Kafka's Java client (kafka-clients 4.x, the reference client) against oncelog, running
the exactly-once scenarios of the other interop tests (tests/test_interop_transactions.py,
tests/test_exactly_once_app.py, tests/test_kip890.py) from one small program,
tests/java/JavaClient.java, compiled in the test run:

1. idempotent produce (acks=all) and read-back: records, keys, headers; none twice, in order;
2. transactions committed and aborted, read by the Java client's read_committed and
   read_uncommitted consumers, and by ours;
3. a consume-transform-produce copier (sendOffsetsToTransaction with the consumer's group
   metadata) SIGKILLed twice mid-run and restarted: exactly once, checked by ``oncelog verify``;
4. a zombie fenced by a new producer with the same transactional.id;
5. the AdminClient calls;
6. transaction version 2 (KIP-890): which request versions the client sent, read from its own
   request log and, on oncelog, from the broker's ``oncelog_requests_total``; both brokers
   finalize transaction.version 2 (kafka-features describe), and where oncelog finalizes 1 the
   client falls back to AddPartitionsToTxn (so the check can tell the two apart).

Scenarios 1, 2, 4, 5 and 6 run against the session's real Apache Kafka too: both brokers pass the
same program with the same checks. One JVM per group of scenarios.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.interop import unique_topic
from support.java_client import JavaClient, events_by_name, requests_sent
from support.metrics import families, metrics_url

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.harness.broker_process import BrokerProcess
from oncelog.verify.history import History, PartitionEnd, Read, ReaderEnd, Txn, Write

pytestmark = pytest.mark.slow

SETTINGS = {"metrics.port": "0", "transaction.state.log.num.partitions": "3",
            "offsets.topic.num.partitions": "3", "group.initial.rebalance.delay.ms": "0"}
BROKERS = ("oncelog", "kafka")


@pytest.fixture(scope="module")
def java(kafka_jars, tmp_path_factory) -> Iterator[JavaClient]:
    from support.apache_kafka import shared_dir

    client = JavaClient(kafka_jars, shared_dir() / "java-client-classes",
                        tmp_path_factory.mktemp("java-client"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def oncelog_broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("java-client-broker") / "data",
                       settings=SETTINGS) as broker:
        broker.metrics_url = metrics_url(broker)
        yield broker


def request_counts(broker) -> Counter[tuple[str, int]]:
    """oncelog's own count of the requests it decoded, by API and version."""
    counts: Counter[tuple[str, int]] = Counter()
    family = families(broker.metrics_url).get("oncelog_requests")  # none before a request
    for sample in family.samples if family else ():
        if sample.name == "oncelog_requests_total":
            counts[(sample.labels["request"], int(sample.labels["version"]))] += int(sample.value)
    return counts


def bootstrap_of(which: str, request: pytest.FixtureRequest) -> str:
    if which == "kafka":
        return request.getfixturevalue("apache_kafka")
    return request.getfixturevalue("oncelog_broker").bootstrap_servers


def eos_run(which: str, request: pytest.FixtureRequest, java: JavaClient,
            tmp_path: Path) -> dict[str, Any]:
    """Scenarios 1, 2 and 4 in one JVM, against one broker: its events, the client's request
    log, and (oncelog) the broker's request counts around the run."""
    bootstrap = bootstrap_of(which, request)
    broker = request.getfixturevalue("oncelog_broker") if which == "oncelog" else None
    log = tmp_path / "requests.log"
    before = request_counts(broker) if broker else None
    prefix = unique_topic("java-eos")
    events = events_by_name(java.run("eos", bootstrap, prefix, request_log=log))
    after = request_counts(broker) if broker else None
    return {"broker": which, "bootstrap": bootstrap, "prefix": prefix, "events": events,
            "requests": requests_sent(log),
            "broker_requests": (after - before) if broker else None}


# -- our client reading what the Java client wrote ---------------------------------------------


def python_read(bootstrap: str, topic: str, partitions: int, isolation: str,
                timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every record of ``topic`` to its end as our client reads it, in the Java program's
    shape: partition by partition, in offset order."""
    return python_read_to_end(bootstrap, topic, partitions, isolation, timeout)[0]


def python_read_to_end(bootstrap: str, topic: str, partitions: int, isolation: str,
                       timeout: float = 30.0
                       ) -> tuple[list[dict[str, Any]], dict[int, int], dict[int, int]]:
    """``python_read``'s records, and where the reader stopped and the end it had to reach
    (the last stable offset for read_committed), per partition."""
    with Consumer(bootstrap_servers=bootstrap, isolation_level=isolation) as c:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, (got, ends)
            got.extend(r for r in c.poll(timeout=0.5) if r.offset < ends[TopicPartition(
                topic, r.partition)])
        positions = {tp.partition: c.position(tp) for tp in tps}
    got.sort(key=lambda r: (r.partition, r.offset))
    return [{"partition": r.partition, "offset": r.offset,
             "key": None if r.key is None else r.key.decode(),
             "value": None if r.value is None else r.value.decode(),
             "headers": [[k, None if v is None else v.decode()] for k, v in r.headers]}
            for r in got], positions, {tp.partition: o for tp, o in ends.items()}


# -- 1: idempotent produce and read-back ----------------------------------------------------


@pytest.mark.parametrize("which", BROKERS)
def test_idempotence_transactions_fencing_and_transaction_version_2(which, request, java,
                                                                    tmp_path):
    """One JVM runs scenarios 1, 2 and 4 against the broker; each is checked in turn."""
    run = eos_run(which, request, java, tmp_path)
    check_idempotent_produce_reads_back_every_record_once_in_order(run)
    check_transactions_committed_and_aborted_read_committed_and_uncommitted(run)
    check_a_zombie_producer_is_fenced_and_its_transaction_never_commits(run)
    check_the_java_client_uses_transaction_version_2(run)


def check_idempotent_produce_reads_back_every_record_once_in_order(eos_run):
    e = eos_run["events"]["idempotent"]
    sent, read = e["sent"], e["read"]
    assert len(sent) == 300 and len({s["value"] for s in sent}) == 300
    # every acknowledged record is where its acknowledgement said, with its key and headers
    at = {(r["partition"], r["offset"]): r for r in read}
    assert len(at) == len(read) == 300  # none twice, none missing
    for n, s in enumerate(sent):
        r = at[(s["partition"], s["offset"])]
        assert (r["key"], r["value"]) == (s["key"], s["value"])
        assert r["headers"] == [["seq", str(n)], ["client", "java"]]
    # per partition: offsets 0..n-1 with no gap, in the order the records were sent
    for p in range(3):
        mine = [s for s in sent if s["partition"] == p]
        assert [s["offset"] for s in mine] == list(range(len(mine)))
        assert [r["value"] for r in read if r["partition"] == p] == [s["value"] for s in mine]
    # a key always lands on the same partition (the Java client's murmur2 partitioner)
    assert len({(s["key"], s["partition"]) for s in sent}) == len({s["key"] for s in sent})
    # our client reads the same records, keys and headers
    assert python_read(eos_run["bootstrap"], e["topic"], 3, "read_uncommitted") == read
    # the producer was idempotent: it took a producer id before producing
    sent_by = {api for (client, api, _), _n in eos_run["requests"].items()
               if client == f"{eos_run['prefix']}-idem-producer"}
    assert {"INIT_PRODUCER_ID", "PRODUCE"} <= sent_by, sent_by


# -- 2: transactions committed and aborted --------------------------------------------------


def _values(records: list[dict[str, Any]]) -> list[str]:
    return [r["value"] for r in records]


def _in_partition_order(values: list[str]) -> list[str]:
    return sorted(values, key=lambda v: (int(v.split(":")[0]), int(v.split(":")[1][:-2])))


def check_transactions_committed_and_aborted_read_committed_and_uncommitted(eos_run):
    e = eos_run["events"]["transactions"]
    committed, aborted = e["committed"], e["aborted"]
    assert (len(committed), len(aborted)) == (30, 20)
    # read_committed: exactly the committed records, in order per partition
    assert _values(e["read_committed"]) == _in_partition_order(committed)
    # read_uncommitted: the aborted records too (they are in the log), in order
    assert _values(e["read_uncommitted"]) == _in_partition_order(committed + aborted)
    # each partition's offsets leave room for the transaction markers (one per transaction)
    for p in range(2):
        offsets = [r["offset"] for r in e["read_uncommitted"] if r["partition"] == p]
        assert offsets == sorted(offsets) and offsets[-1] == 25 + 4 - 1  # 25 records, 4 markers
    # our client agrees with the Java client at both isolation levels
    bootstrap = eos_run["bootstrap"]
    assert python_read(bootstrap, e["topic"], 2, "read_committed") == e["read_committed"]
    assert python_read(bootstrap, e["topic"], 2, "read_uncommitted") == e["read_uncommitted"]


# -- 4: zombie fencing --------------------------------------------------------------------------

FENCED = ("org.apache.kafka.common.errors.ProducerFencedException",
          "org.apache.kafka.common.errors.InvalidProducerEpochException")


def check_a_zombie_producer_is_fenced_and_its_transaction_never_commits(eos_run):
    e = eos_run["events"]["fencing"]
    # the zombie's next send and its commit fail with a fencing error (KIP-890: the epoch
    # the successor bumped makes the zombie's produce an old epoch)
    assert e["send_error"] and e["send_error"][0].split(":")[0] in FENCED, e["send_error"]
    assert e["commit_error"] and e["commit_error"][0].split(":")[0] in FENCED, e
    assert _values(e["read_committed"]) == ["0:1-successor"]
    # the zombie's first record is in the log, aborted by the successor's InitProducerId; its
    # later send was refused
    assert _values(e["read_uncommitted"]) == ["0:0-zombie", "0:1-successor"]
    assert _values(python_read(eos_run["bootstrap"], e["topic"], 1, "read_committed")) == [
        "0:1-successor"]


# -- 6: transaction version 2 -------------------------------------------------------------------


def check_the_java_client_uses_transaction_version_2(eos_run):
    """KIP-890's second version: EndTxn v5 (the coordinator bumps the epoch on every commit and
    abort), Produce v12 (the partition leader adds the partition to the transaction), no
    AddPartitionsToTxn from the client. The client's own request log says which versions it
    sent; on oncelog the broker's request counts say the same."""
    prefix = eos_run["prefix"]
    sent = eos_run["requests"]
    producers = {f"{prefix}-txn-producer": 5, f"{prefix}-fence-successor": 1,
                 f"{prefix}-fence-zombie": 1}
    for client, end_txns in producers.items():
        mine = {(api, v): n for (c, api, v), n in sent.items() if c == client}
        assert mine.get(("END_TXN", 5)) == end_txns, (client, mine)
        assert not any(api == "END_TXN" and v != 5 for api, v in mine), mine
        assert not any(api in ("ADD_PARTITIONS_TO_TXN", "ADD_OFFSETS_TO_TXN")
                       for api, _ in mine), mine
        produce = {v for api, v in mine if api == "PRODUCE"}
        assert produce and min(produce) >= 12, mine
    broker = eos_run["broker_requests"]
    if broker is not None:
        assert broker[("EndTxn", 5)] == sum(producers.values())
        assert sum(n for (api, v), n in broker.items() if api == "EndTxn" and v < 5) == 0
        assert sum(n for (api, _), n in broker.items() if api == "AddPartitionsToTxn") == 0
        assert sum(n for (api, v), n in broker.items() if api == "Produce" and v >= 12) >= 7


def test_both_brokers_finalize_transaction_version_2(oncelog_broker, apache_kafka, kafka_tools):
    """The Java client turns transaction version 2 on only when the broker's ApiVersions
    finalizes the feature transaction.version at level 2 (KIP-890, KIP-1022): kafka-features
    describe reads it from both brokers."""
    for bootstrap in (oncelog_broker.bootstrap_servers, apache_kafka):
        out = kafka_tools.run("kafka-features", "--bootstrap-server", bootstrap,
                              "describe").check().stdout
        line = next(x for x in out.splitlines() if "Feature: transaction.version" in x)
        fields = dict(re.findall(r"(\w+): (\S+)", line))
        assert fields["SupportedMinVersion"] == "0", line
        assert int(fields["SupportedMaxVersion"]) >= 2, line
        assert fields["FinalizedVersionLevel"] == "2", line


# -- 3: the copier, SIGKILLed twice -------------------------------------------------------------

COPY_COUNT = 3000
COPY_PARTITIONS = 3


def test_copier_killed_twice_copies_each_record_exactly_once(java, oncelog_broker, tmp_path):
    bootstrap = oncelog_broker.bootstrap_servers
    source, sink = unique_topic("java-copy-in"), unique_topic("java-copy-out")
    group = unique_topic("java-copier")
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(source, COPY_PARTITIONS, 1),
                             NewTopic(sink, COPY_PARTITIONS, 1)])
    with Producer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5) as p:
        for n in range(COPY_COUNT):
            p.send(source, key=f"k{n}", value=f"in-{n}", partition=n % COPY_PARTITIONS)
    before = request_counts(oncelog_broker)
    err = tmp_path / "copier.err"
    copier = ("copier", bootstrap, source, sink, group, f"{group}-txn")

    # 1st run: after three commits it flushes a fourth transaction's copies (and its offsets)
    # and holds it open: killed there, with uncommitted copies in the log
    run = java.start(*copier, "3", stderr=err)
    held = run.next_event("holding")
    assert run.sigkill() == -9
    # 2nd run: killed while it copies freely, a few hundred records in
    run = java.start(*copier, "-1", stderr=err)
    first = run.next_event("committed")
    progress = run.next_event("committed", lambda e: e["copied"] >= first["copied"] + 500)
    assert run.sigkill() == -9
    assert 3 * 50 + progress["copied"] < COPY_COUNT  # both kills landed mid-run
    # 3rd run: to the end of the input
    run = java.start(*copier, "-1", stderr=err)
    done = run.next_event("done")
    assert run.wait(60) == 0, err.read_text()[-3000:]
    assert done["copied"] > 0  # the second kill, too, left records to copy

    # the group's committed offsets are the input's ends
    with Admin(bootstrap_servers=bootstrap) as admin:
        offsets = admin.list_consumer_group_offsets(group)
    assert {tp.partition: o for tp, o in offsets.items()} == {
        p: COPY_COUNT // COPY_PARTITIONS for p in range(COPY_PARTITIONS)}

    # the output, read by the Java client (both isolation levels) and by ours
    reads = {e["isolation"]: e for e in java.run("read", bootstrap, sink, "read_committed",
                                                 "read_uncommitted")}
    java_read = reads["read_committed"]
    ours, positions, ends = python_read_to_end(bootstrap, sink, COPY_PARTITIONS,
                                               "read_committed")
    # the held transaction's copies are in the log, aborted: read_uncommitted sees them
    assert len(reads["read_uncommitted"]["records"]) >= COPY_COUNT + held["records"]

    # exactly once, as oncelog verify judges a history: every copy that had to be written
    # (one per input record, committed) read once, nothing else read
    ops: list[Any] = []
    for n in range(COPY_COUNT):
        ops.append(Write("copier", n, f"out-{n}", sink, n % COPY_PARTITIONS, "ok"))
        ops.append(Txn("copier", n, "committed"))
    java_ends = ({int(p): o for p, o in java_read["positions"].items()},
                 {int(p): o for p, o in java_read["ends"].items()})
    for reader, records, (reached, end) in (("java", java_read["records"], java_ends),
                                            ("oncelog", ours, (positions, ends))):
        ops.extend(Read(reader, sink, r["partition"], r["offset"], r["value"]) for r in records)
        ops.append(ReaderEnd(reader, tuple(PartitionEnd(sink, p, reached[p], end[p])
                                           for p in range(COPY_PARTITIONS))))
    history = tmp_path / "copier.jsonl"
    History(ops).save(history)
    verdict = subprocess.run([sys.executable, "-m", "oncelog.cli.main", "verify", "--check",
                              str(history), "--json"], capture_output=True, text=True,
                             timeout=120, check=False)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    result = json.loads(verdict.stdout)
    assert result["ok"] and result["stats"]["reads"] == 2 * COPY_COUNT, result
    assert len(java_read["records"]) == COPY_COUNT

    # transaction version 2 on the copier's path: offsets go into the transaction by
    # TxnOffsetCommit v5 alone (no AddOffsetsToTxn), partitions by Produce v12
    used = request_counts(oncelog_broker) - before
    assert used[("TxnOffsetCommit", 5)] >= COPY_COUNT // 50
    assert sum(n for (api, _), n in used.items()
               if api in ("AddOffsetsToTxn", "AddPartitionsToTxn")) == 0, used
    assert used[("EndTxn", 5)] >= COPY_COUNT // 50



# -- 5: the AdminClient calls -------------------------------------------------------------------

def _admin_expected(prefix: str) -> dict[str, Any]:
    """Each AdminClient call's outcome ({"ok": result} or {"error": exception}), the same on
    both brokers."""
    a = f"{prefix}-a"
    return {
        "createTopics": {"ok": "created"},
        "createTopics again": {"error": "TopicExistsException"},
        "listTopics": {"ok": {"a": True, "b": True}},
        "describeTopics": {"ok": {"name": a, "internal": False, "topic_id_set": True,
                                  "partitions": [{"partition": p, "leader": LEADER,
                                                  "replicas": 1, "isr": 1}
                                                 for p in range(3)]}},
        "describeTopics missing": {"error": "UnknownTopicOrPartitionException"},
        "describeConfigs": {"ok": {
            "cleanup.policy": {"value": "delete", "source": "DYNAMIC_TOPIC_CONFIG"},
            "retention.ms": {"value": "123456789", "source": "DYNAMIC_TOPIC_CONFIG"},
            "segment.bytes": {"value": "1073741824", "source": "DEFAULT_CONFIG"}}},
        "incrementalAlterConfigs": {"ok": {
            "cleanup.policy": {"value": "delete", "source": "DEFAULT_CONFIG"},
            "max.message.bytes": {"value": "200000", "source": "DYNAMIC_TOPIC_CONFIG"},
            "retention.ms": {"value": "987654321", "source": "DYNAMIC_TOPIC_CONFIG"}}},
        "incrementalAlterConfigs invalid": {"error": "InvalidConfigurationException"},
        "listOffsets": {"ok": {"earliest": {"0": 0, "1": 0, "2": 0},
                               "latest": {"0": 10, "1": 0, "2": 0},
                               "max_timestamp": {"0": 9}, "for_timestamp": {"0": 5}}},
        "listConsumerGroups": {"ok": {"listed": True, "state": "Empty", "simple": True}},
        "describeConsumerGroups": {"ok": {"state": "Empty", "members": 0,
                                          "coordinator_set": True}},
        "listConsumerGroupOffsets": {"ok": {f"{a}-0": {"offset": 7, "metadata": "m"},
                                            f"{a}-1": {"offset": 0, "metadata": ""}}},
        "alterConsumerGroupOffsets": {"ok": {f"{a}-0": 3, f"{a}-1": 0, f"{a}-2": 0}},
        "deleteConsumerGroups": {"ok": "deleted"},
        "deleteConsumerGroups again": {"error": "GroupIdNotFoundException"},
        "listTransactions": {"ok": {"listed": True, "state": "Ongoing",
                                    "producer_id_set": True}},
        "describeTransactions": {"ok": {"state": "Ongoing", "timeout_ms": 30000,
                                        "partitions": [f"{prefix}-b-0"], "started": True}},
        "describeProducers": {"ok": [{"epoch_set": True, "last_sequence": 0,
                                      "txn_start_offset": 0}]},
        # commitTransaction returns once PrepareCommit is logged; the markers follow
        "describeTransactions committed": ({"ok": "PrepareCommit"}, {"ok": "CompleteCommit"}),
        "deleteRecords": {"ok": {"low_watermark": 4, "earliest": {"0": 4}}},
        "deleteRecords past the end": {"error": "OffsetOutOfRangeException"},
        "createPartitions": {"ok": 3},
        "createPartitions fewer": {"error": "InvalidPartitionsException"},
        "alterUserScramCredentials SCRAM-SHA-256": {"ok": "altered"},
        "alterUserScramCredentials SCRAM-SHA-512": {"ok": "altered"},
        "describeUserScramCredentials": {"ok": {"SCRAM-SHA-256": 8192, "SCRAM-SHA-512": 4096}},
        "alterUserScramCredentials delete": {"ok": "deleted"},
        "describeUserScramCredentials one left": {"ok": {"SCRAM-SHA-512": 4096}},
        "alterUserScramCredentials delete missing": {"error": "ResourceNotFoundException"},
        "alterUserScramCredentials delete last": {"ok": "deleted"},
        "describeUserScramCredentials deleted": {"error": "ResourceNotFoundException"},
    }


LEADER = object()  # any broker id: oncelog's and Kafka's node ids differ


@pytest.mark.parametrize("which", BROKERS)
def test_admin_client_calls_give_kafkas_outcomes(java, which, request):
    prefix = unique_topic("java-admin")
    events = java.run("admin", bootstrap_of(which, request), prefix)
    got = {e["event"]: e["result"] for e in events}
    expected = _admin_expected(prefix)
    assert list(got) == list(expected)
    leaders = {p.pop("leader") for p in got["describeTopics"]["ok"]["partitions"]}
    assert len(leaders) == 1 and isinstance(leaders.pop(), int)
    for p in expected["describeTopics"]["ok"]["partitions"]:
        del p["leader"]
    wrong = {call: (got[call], want) for call, want in expected.items()
             if got[call] != want and not (isinstance(want, tuple) and got[call] in want)}
    assert not wrong, wrong


def test_the_java_client_falls_back_to_transaction_version_1_where_oncelog_finalizes_1(
        java, tmp_path):
    """The feature level oncelog finalizes is what the Java client goes by: at
    transaction.version=1 it adds each partition with AddPartitionsToTxn and ends with EndTxn
    below v5, and the transactions still commit and abort as they should."""
    with BrokerProcess(tmp_path / "data", settings={**SETTINGS,
                                                    "transaction.version": "1"}) as broker:
        broker.metrics_url = metrics_url(broker)
        prefix = unique_topic("java-tv1")
        log = tmp_path / "requests.log"
        before = request_counts(broker)
        e = events_by_name(java.run("txn", broker.bootstrap_servers, prefix,
                                    request_log=log))["transactions"]
        used = request_counts(broker) - before
    assert _values(e["read_committed"]) == _in_partition_order(e["committed"])
    mine = {(api, v): n for (c, api, v), n in requests_sent(log).items()
            if c == f"{prefix}-txn-producer"}
    assert sum(n for (api, v), n in mine.items() if api == "END_TXN" and v < 5) == 5, mine
    assert not any(api == "END_TXN" and v >= 5 for api, v in mine), mine
    assert sum(n for (api, _), n in mine.items() if api == "ADD_PARTITIONS_TO_TXN") >= 5, mine
    assert max(v for api, v in mine if api == "PRODUCE") <= 11, mine
    assert sum(n for (api, v), n in used.items() if api == "EndTxn" and v < 5) == 5, used
    assert sum(n for (api, _), n in used.items() if api == "AddPartitionsToTxn") >= 5, used
