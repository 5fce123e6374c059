"""kafka-get-offsets, kafka-delete-records and the perf tools against oncelog and against the real
Kafka, the same commands side by side: offsets by --time -1/-2/-3 and a timestamp, per
--topic-partitions; records deleted up to an offset from an --offset-json-file; 20,000 records
by kafka-producer-perf-test (plain, and in transactions with --transactional-id and
--transaction-duration-ms) read back by kafka-consumer-perf-test."""

from __future__ import annotations

import json
import re
import time

import pytest
from confluent_kafka import Producer
from support.interop import unique_topic
from support.kafka_tools_compare import BS, ToolPair, assert_same_output

from oncelog.harness.broker_process import BrokerProcess


@pytest.fixture(scope="module")
def oncelog(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("oncelog") / "data",
                       settings={"group.initial.rebalance.delay.ms": "0"}) as broker:
        yield broker.bootstrap_servers


@pytest.fixture
def pair(kafka_tools, apache_kafka, oncelog):
    return ToolPair(kafka_tools, apache_kafka, oncelog)


# per partition, the records' timestamps (ms after a base a minute ago)
STAMPS = {0: [1000, 5000, 3000, 5000, 2000], 1: [1000, 2000, 3000, 4000, 4000]}


def offsets(pair: ToolPair, *args: str):
    k, o = pair.run("kafka-get-offsets", "--bootstrap-server", BS, *args)
    assert_same_output(k, o)
    return o.stdout.split()


def test_get_offsets_and_delete_records(pair, tmp_path):
    t = unique_topic("ko-offsets")
    k, o = pair.run("kafka-topics", "--bootstrap-server", BS, "--create", "--topic", t,
                    "--partitions", "2")
    assert (k.returncode, o.returncode) == (0, 0)
    # the same records, with the same timestamps, on both sides (by confluent_kafka)
    base = int(time.time() * 1000) - 60_000
    for bootstrap in (pair.kafka, pair.oncelog):
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100})
        for partition, stamps in STAMPS.items():
            for i, ts in enumerate(stamps):
                p.produce(t, f"v{i}".encode(), partition=partition, timestamp=base + ts)
        assert p.flush(30) == 0
    assert offsets(pair, "--topic", t) == [f"{t}:0:5", f"{t}:1:5"]
    assert offsets(pair, "--topic", t, "--time", "-1") == [f"{t}:0:5", f"{t}:1:5"]
    assert offsets(pair, "--topic", t, "--time", "-2") == [f"{t}:0:0", f"{t}:1:0"]
    # -3: the first record with the largest timestamp (KIP-734; KAFKA-16310 in Kafka 3.8)
    assert offsets(pair, "--topic", t, "--time", "-3") == [f"{t}:0:1", f"{t}:1:3"]
    # a timestamp: the first record at or after it
    assert offsets(pair, "--topic", t, "--time", str(base + 2500)) == [f"{t}:0:1", f"{t}:1:2"]
    assert offsets(pair, "--topic-partitions", f"{t}:1", "--time", "0") == [f"{t}:1:0"]
    # a timestamp after every record: no offset, nothing printed on either side
    assert offsets(pair, "--topic-partitions", f"{t}:0,{t}:1", "--time", "99999999999999") == []
    assert offsets(pair, "--topic-partitions", f"{t}:0") == [f"{t}:0:5"]

    plan = tmp_path / "delete.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": 0, "offset": 3}, {"topic": t, "partition": 1, "offset": -1}]}))
    k, o = pair.run("kafka-delete-records", "--bootstrap-server", BS,
                    "--offset-json-file", str(plan))
    assert (k.returncode, o.returncode) == (0, 0), (k.stderr, o.stderr)
    assert sorted(o.stdout.splitlines()) == sorted(k.stdout.splitlines())
    assert f"partition: {t}-0\tlow_watermark: 3" in o.stdout.splitlines()
    assert f"partition: {t}-1\tlow_watermark: 5" in o.stdout.splitlines()  # -1: the high watermark
    assert offsets(pair, "--topic", t, "--time", "-2") == [f"{t}:0:3", f"{t}:1:5"]
    # beyond the high watermark: the same refusal
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": 0, "offset": 99}]}))
    k, o = pair.run("kafka-delete-records", "--bootstrap-server", BS,
                    "--offset-json-file", str(plan))
    assert (o.returncode, o.stdout) == (k.returncode, k.stdout)
    assert "OffsetOutOfRangeException" in o.stdout


_PRODUCED = re.compile(r"^(\d+) records sent, [\d.]+ records/sec", re.MULTILINE)


def test_perf_tools_produce_and_read_back_20000_records(pair):
    t = unique_topic("ko-perf")
    k, o = pair.run("kafka-topics", "--bootstrap-server", BS, "--create", "--topic", t,
                    "--partitions", "2")
    assert (k.returncode, o.returncode) == (0, 0)
    k, o = pair.run("kafka-producer-perf-test", "--topic", t, "--num-records", "20000",
                    "--record-size", "100", "--throughput", "-1",
                    "--producer-props", f"bootstrap.servers={BS}", "acks=all")
    for r in (k, o):
        assert r.returncode == 0, r.stderr
        assert [int(n) for n in _PRODUCED.findall(r.stdout)][-1:] == [20000], r.stdout
    txn = unique_topic("ko-perf-txn")
    k, o = pair.run("kafka-producer-perf-test", "--topic", t, "--num-records", "2000",
                    "--record-size", "100", "--throughput", "-1",
                    "--producer-props", f"bootstrap.servers={BS}",
                    "--transactional-id", txn, "--transaction-duration-ms", "50")
    for r in (k, o):
        assert r.returncode == 0, r.stderr
        assert [int(n) for n in _PRODUCED.findall(r.stdout)][-1:] == [2000], r.stdout

    # every record there: 22,000 data records and the transactions' markers
    k, o = pair.run("kafka-get-offsets", "--bootstrap-server", BS, "--topic", t)
    for r in (k, o):
        ends = [int(x.rsplit(":", 1)[1]) for x in r.stdout.split()]
        assert sum(ends) > 22000, r.stdout
    k, o = pair.run("kafka-consumer-perf-test", "--bootstrap-server", BS, "--topic", t,
                    "--num-records", "22000", "--timeout", "60000",
                    "--command-property", "isolation.level=read_committed",
                    "--group", unique_topic("ko-perf-group"))
    for r in (k, o):
        assert r.returncode == 0, r.stdout + r.stderr
        header, row = r.stdout.strip().splitlines()[-2:]
        columns = dict(zip([c.strip() for c in header.split(",")],
                           [v.strip() for v in row.split(",")], strict=True))
        assert columns["data.consumed.in.nMsg"] == "22000", r.stdout
        assert float(columns["data.consumed.in.MB"]) == pytest.approx(22000 * 100 / 2**20,
                                                                       abs=0.001)
    assert k.stdout.strip().splitlines()[-2] == o.stdout.strip().splitlines()[-2]  # the header
