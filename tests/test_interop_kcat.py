"""kcat (Debian's package, its own librdkafka) against a real broker process: metadata, topic
auto-creation, idempotent produce with every codec, consume, offset queries, and kcat's records
read by the Python clients."""

from __future__ import annotations

import json

import pytest
from support.interop import (
    CODECS,
    CONSUMERS,
    KCAT,
    Rec,
    check_consumed,
    confluent_create_topic,
    confluent_produce,
    dataset,
    kcat,
    kcat_consume,
    kcat_dataset,
    kcat_produce,
    unique_topic,
)

from oncelog.harness.broker_process import BrokerProcess

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(KCAT is None, reason="kcat is not installed (Debian package kcat)")]

PARTITIONS = 3


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("kcat") / "data") as b:
        yield b
        assert b.running, b.log_tail()


def produce_runs(bootstrap, topic, codecs, partitions, per_run=80) -> list[Rec]:
    """One kcat run per (codec, partition), each with its own header set; returns the records
    with the partition they went to (kcat reports no offsets)."""
    produced = []
    n = 0
    for codec in codecs:
        for p in range(partitions):
            records = kcat_dataset(f"{codec}-p{p}", per_run, start=n)
            kcat_produce(bootstrap, topic, records, p, codec)
            produced += [Rec(r.key, r.value, r.headers, None, p) for r in records]
            n += per_run
    return produced


def test_metadata_lists_the_broker_and_topics(broker):
    topic = unique_topic("kcat-md")
    confluent_create_topic(broker.bootstrap_servers, topic, 2)
    md = json.loads(kcat(broker.bootstrap_servers, "-L", "-J"))
    assert md["brokers"] == [{"id": 1, "name": broker.bootstrap_servers}]
    (t,) = [t for t in md["topics"] if t["topic"] == topic]
    assert [(p["partition"], p["leader"]) for p in t["partitions"]] == [(0, 1), (1, 1)]


def test_produce_auto_creates_the_topic_and_consumes_back_every_codec(broker):
    topic = unique_topic("kcat-auto")  # never created: the producer's Metadata creates it
    produced = produce_runs(broker.bootstrap_servers, topic, CODECS["kcat"], partitions=1)
    consumed = kcat_consume(broker.bootstrap_servers, topic, 1)
    check_consumed(produced, consumed, partitions=1, with_timestamps=False,
                   offsets_known=False)
    assert [r.offset for r in consumed] == list(range(len(produced)))
    # in production order, since one partition and one producer at a time
    assert [r.value for r in consumed] == [r.value for r in produced]


def test_idempotent_produce_to_several_partitions(broker):
    topic = unique_topic("kcat-parts")
    confluent_create_topic(broker.bootstrap_servers, topic, PARTITIONS)
    produced = produce_runs(broker.bootstrap_servers, topic, ("zstd", "snappy"), PARTITIONS)
    consumed = kcat_consume(broker.bootstrap_servers, topic, PARTITIONS)
    check_consumed(produced, consumed, partitions=PARTITIONS, with_timestamps=False,
                   offsets_known=False)
    for p in range(PARTITIONS):
        assert {r.partition for r in consumed if r.value in
                {q.value for q in produced if q.partition == p and q.value}} == {p}


def test_consume_reads_records_of_confluent_and_queries_offsets_by_time(broker):
    topic = unique_topic("kcat-from-confluent")
    confluent_create_topic(broker.bootstrap_servers, topic, 1)
    produced = confluent_produce(broker.bootstrap_servers, topic,
                                 dataset("q", 50, text_only=True), 1, "lz4")
    check_consumed(produced, kcat_consume(broker.bootstrap_servers, topic, 1), partitions=1)
    r = produced[31]
    out = kcat(broker.bootstrap_servers, "-Q", "-t", f"{topic}:0:{r.timestamp}").decode()
    assert out.split() == [topic, "[0]", "offset", str(r.offset)]
    # Reading from an offset in the middle of a compressed batch starts exactly there.
    raw = kcat(broker.bootstrap_servers, "-C", "-t", topic, "-p", "0", "-o", "17", "-c", "3",
               "-J")
    assert [json.loads(line)["offset"] for line in raw.splitlines()] == [17, 18, 19]


@pytest.mark.parametrize("consumer", ["confluent", "kafka-python", "aiokafka"])
def test_records_produced_by_kcat_decode_in_other_clients(broker, consumer):
    topic = unique_topic(f"from-kcat-to-{consumer}")
    confluent_create_topic(broker.bootstrap_servers, topic, PARTITIONS)
    codecs = [c for c in CODECS["kcat"] if c in CODECS[consumer]]
    produced = produce_runs(broker.bootstrap_servers, topic, codecs, PARTITIONS, per_run=40)
    consumed = CONSUMERS[consumer](broker.bootstrap_servers, topic, PARTITIONS)
    check_consumed(produced, consumed, partitions=PARTITIONS, with_timestamps=False,
                   offsets_known=False)
