"""Produce through a real broker process: a batch whose maxTimestamp is not its records' largest
is stored with the right one (Kafka's LogValidator rewrites it; librdkafka writes 0 over records
without timestamps, its test 0053), and a batch refused for single records names them in
record_errors (KIP-467), which librdkafka turns into INVALID_RECORD for those records and
_INVALID_DIFFERENT_RECORD for the rest of the batch (its test 0011)."""

from __future__ import annotations

import struct
import time

import pytest
from confluent_kafka import KafkaError, Producer
from support.interop import confluent_create_topic
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    fetch_request,
    list_offsets_request,
    produce,
)

from oncelog.harness.broker_process import BrokerProcess
from oncelog.records import build_batch
from oncelog.records.batch import (
    CRC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    batch_crc,
    decode_batch,
    iter_batches,
)

pytestmark = pytest.mark.slow

INVALID_RECORD = 87
MAX_TIMESTAMP = -3  # ListOffsets: the offset and timestamp of the largest timestamp (KIP-734)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("leader-validation") / "data") as b:
        yield b
        assert b.running, "the broker died\n" + b.log_tail()


def create(broker, topic: str, configs: dict[str, str] | None = None) -> None:
    with RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(create_topics_request(topic, configs=configs)
                            ).topics[0].error_code == 0


def with_max_timestamp(batch: bytes, max_timestamp: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">q", out, MAX_TIMESTAMP_OFFSET, max_timestamp)
    struct.pack_into(">I", out, CRC_OFFSET, batch_crc(out, 0, len(out)))
    return bytes(out)


def stored_batches(conn: RawConnection, topic: str):
    """(header, records) of every batch of partition 0, fetched (CRCs checked)."""
    pd = conn.request(fetch_request(topic, 0, 0)).responses[0].partitions[0]
    assert pd.error_code == 0, pd
    data = pd.records or b""
    return [decode_batch(data, pos) for pos, _h in iter_batches(data)]


def max_timestamp_offset(conn: RawConnection, topic: str) -> tuple[int, int]:
    p = conn.request(list_offsets_request(topic, 0, MAX_TIMESTAMP)).topics[0].partitions[0]
    assert p.error_code == 0, p
    return p.offset, p.timestamp


def test_a_batch_with_max_timestamp_0_is_stored_with_its_records_largest(broker):
    create(broker, "max-ts")
    now = int(time.time() * 1000)
    ts = [now - 300, now - 100, now - 200]
    batch = with_max_timestamp(build_batch([(b"k", b"v%d" % i, [], t)
                                            for i, t in enumerate(ts)]), 0)
    with RawConnection(broker.bootstrap_servers) as conn:
        r = produce(conn, "max-ts", 0, batch)  # Produce v9
        assert (r.error_code, r.base_offset) == (0, 0), r
        [(header, records)] = stored_batches(conn, "max-ts")
        assert header.max_timestamp == now - 100
        assert [rec.timestamp for rec in records] == ts
        assert max_timestamp_offset(conn, "max-ts") == (1, now - 100)


def test_librdkafkas_batch_of_records_without_timestamps_is_stored(broker):
    create(broker, "no-ts")
    batch = with_max_timestamp(build_batch([(b"k", b"v", [], -1)] * 4), 0)
    with RawConnection(broker.bootstrap_servers) as conn:
        assert produce(conn, "no-ts", 0, batch).error_code == 0
        [(header, records)] = stored_batches(conn, "no-ts")
        assert header.max_timestamp == -1
        assert [rec.timestamp for rec in records] == [-1] * 4


def test_raw_produce_to_a_compacted_topic_names_the_keyless_records(broker):
    create(broker, "compact-raw", {"cleanup.policy": "compact"})
    now = int(time.time() * 1000)
    batch = build_batch([(None if i in (1, 3) else b"k", b"v", [], now) for i in range(5)])
    with RawConnection(broker.bootstrap_servers) as conn:
        r = produce(conn, "compact-raw", 0, batch)
        assert r.error_code == INVALID_RECORD
        assert [e.batch_index for e in r.record_errors] == [1, 3]
        assert r.record_errors[0].batch_index_error_message == (
            "Compacted topic cannot accept message without key in topic partition "
            "compact-raw-0.")
        assert r.error_message.startswith("One or more records have been rejected due to 2 "
                                          "record errors in total")
        assert stored_batches(conn, "compact-raw") == []


def test_confluent_producer_fails_only_the_keyless_records_invalid_record(broker):
    """librdkafka's 0011 (test_message_single_partition_record_fail): 100 records in one
    batch, every tenth without a key, to a compacted topic."""
    topic = "compact-rdk"
    confluent_create_topic(broker.bootstrap_servers, topic, 1, {"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 1000,
                         "batch.num.messages": 10_000, "batch.size": 10_000_000})
    reports: dict[int, int | None] = {}

    def delivered(err, msg, i) -> None:
        reports[i] = err.code() if err is not None else None

    for i in range(100):
        producer.produce(topic, value=b"v%d" % i, key=None if i % 10 == 0 else b"k%d" % i,
                         partition=0, on_delivery=lambda err, msg, i=i: delivered(err, msg, i))
    assert producer.flush(30) == 0
    assert len(reports) == 100
    invalid = sorted(i for i, code in reports.items() if code == KafkaError.INVALID_RECORD)
    different = [i for i, code in reports.items()
                 if code == KafkaError._INVALID_DIFFERENT_RECORD]
    assert invalid == list(range(0, 100, 10))
    assert len(different) == 90
