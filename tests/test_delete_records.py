"""DeleteRecords (API 21, KIP-107) against a broker process: through confluent-kafka's
AdminClient, our Admin and ``oncelog delete-records``. The log start offset it moves is honoured
by Fetch (OFFSET_OUT_OF_RANGE below it), ListOffsets earliest, consumers from earliest,
retention (the segments wholly below it go) and the producer state, and survives a restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient
from support.cli import oncelog
from support.interop import confluent_create_topic
from support.raw_wire import RawConnection, fetch_request, list_offsets_request
from support.waiting import wait_until

from oncelog import Admin, Consumer, Producer, TopicPartition
from oncelog.errors import (
    InvalidTopicError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from oncelog.harness.broker_process import BrokerProcess

EARLIEST = -2
OFFSET_OUT_OF_RANGE = 1


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("delete-records") / "data") as b:
        yield b


def _produce(bootstrap: str, topic: str, n: int, partition: int = 0) -> None:
    with Producer(bootstrap_servers=bootstrap, linger_ms=0) as p:
        for i in range(n):
            p.send(topic, f"v{i}".encode(), partition=partition).result(timeout=30)


def _earliest(bootstrap: str, topic: str, partition: int = 0) -> int:
    with RawConnection(bootstrap) as conn:
        (t,) = conn.request(list_offsets_request(topic, partition, EARLIEST)).topics
        (p,) = t.partitions
        assert p.error_code == 0
        return p.offset


def _fetch_error(bootstrap: str, topic: str, offset: int) -> int:
    with RawConnection(bootstrap) as conn:
        (t,) = conn.request(fetch_request(topic, 0, offset)).responses
        return int(t.partitions[0].error_code)


def _read_from_earliest(bootstrap: str, topic: str, expect: int) -> list:
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, 0)])
        records: list = []
        wait_until(lambda: records.extend(c.poll(0.2)) or len(records) >= expect, 30,
                   "records")
        return records


def test_confluent_admin_moves_the_log_start(broker):
    bootstrap = broker.bootstrap_servers
    confluent_create_topic(bootstrap, "dr", 1)
    _produce(bootstrap, "dr", 10)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([CKTopicPartition("dr", 0, 4)], operation_timeout=10)
    deleted = futures[CKTopicPartition("dr", 0, 4)].result(timeout=30)
    assert deleted.low_watermark == 4
    assert _earliest(bootstrap, "dr") == 4
    # Below the log start: out of range; at it: records from 4 on.
    assert _fetch_error(bootstrap, "dr", 3) == OFFSET_OUT_OF_RANGE
    assert _fetch_error(bootstrap, "dr", 4) == 0
    records = _read_from_earliest(bootstrap, "dr", 6)
    assert [r.offset for r in records] == list(range(4, 10))
    # librdkafka's consumer from earliest starts there too, and sees the watermarks.
    consumer = CKConsumer({"bootstrap.servers": bootstrap, "group.id": "dr-readers",
                           "auto.offset.reset": "earliest"})
    try:
        assert consumer.get_watermark_offsets(CKTopicPartition("dr", 0), timeout=10) == (4, 10)
        consumer.assign([CKTopicPartition("dr", 0)])
        msg = None
        for _ in range(100):
            msg = consumer.poll(0.3)
            if msg is not None and not msg.error():
                break
        assert msg is not None and msg.offset() == 4
    finally:
        consumer.close()
    # Past the high watermark: OFFSET_OUT_OF_RANGE; -1: up to the high watermark.
    beyond = admin.delete_records([CKTopicPartition("dr", 0, 11)], operation_timeout=10)
    with pytest.raises(KafkaException) as info:
        beyond[CKTopicPartition("dr", 0, 11)].result(timeout=30)
    assert info.value.args[0].code() == CKError.OFFSET_OUT_OF_RANGE
    to_end = admin.delete_records([CKTopicPartition("dr", 0, -1)], operation_timeout=10)
    assert to_end[CKTopicPartition("dr", 0, -1)].result(timeout=30).low_watermark == 10
    # Moving it back is no change.
    back = admin.delete_records([CKTopicPartition("dr", 0, 2)], operation_timeout=10)
    assert back[CKTopicPartition("dr", 0, 2)].result(timeout=30).low_watermark == 10


def test_our_admin_the_cli_and_the_producer_state(broker, tmp_path):
    bootstrap = broker.bootstrap_servers
    confluent_create_topic(bootstrap, "ours-dr", 2)
    _produce(bootstrap, "ours-dr", 6, partition=0)
    _produce(bootstrap, "ours-dr", 6, partition=1)
    with Admin(bootstrap_servers=bootstrap) as admin:
        tp0, tp1 = TopicPartition("ours-dr", 0), TopicPartition("ours-dr", 1)
        assert len(admin.describe_producers([tp0])[tp0]) == 1
        assert admin.delete_records({tp0: 2}) == {tp0: 2}
        assert len(admin.describe_producers([tp0])[tp0]) == 1  # its batches from 2 on remain
        with pytest.raises(OffsetOutOfRangeError):
            admin.delete_records({tp0: 100})
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_records({TopicPartition("ours-dr", 7): 1})
        # The coordinators' logs are not for deleting (a commit creates __consumer_offsets).
        with Consumer(bootstrap_servers=bootstrap, group_id="dr-group") as c:
            c.commit({tp0: 1})
        with pytest.raises(InvalidTopicError):
            admin.delete_records({TopicPartition("__consumer_offsets", 0): -1})
        # All of the producer's records gone: the partition still knows it (Kafka >= 2.5), so
        # that it can carry on with its next sequence number.
        assert admin.delete_records({tp1: -1}) == {tp1: 6}
        assert len(admin.describe_producers([tp1])[tp1]) == 1
    out = oncelog("delete-records", "--bootstrap-server", bootstrap, "--topic", "ours-dr",
                  "--partition", "0", "--offset", "3")
    assert "partition: ours-dr-0\tlow_watermark: 3" in out.stdout
    plan = tmp_path / "offsets.json"
    plan.write_text(json.dumps({"partitions": [{"topic": "ours-dr", "partition": 0,
                                                "offset": 5}], "version": 1}))
    out = oncelog("delete-records", "--bootstrap-server", bootstrap, "--offset-json-file",
                  str(plan))
    assert "partition: ours-dr-0\tlow_watermark: 5" in out.stdout
    assert _earliest(bootstrap, "ours-dr") == 5
    failed = oncelog("delete-records", "--bootstrap-server", bootstrap, "--topic", "ours-dr",
                     "--partition", "0", "--offset", "99", check=False)
    assert failed.returncode == 1 and "OFFSET_OUT_OF_RANGE" in failed.stderr
    bad = oncelog("delete-records", "--bootstrap-server", bootstrap, "--topic", "ours-dr",
                  check=False)
    assert bad.returncode == 2 and "--offset" in bad.stderr


def _segments(data: Path, topic: str) -> list[int]:
    return sorted(int(p.name[:-4]) for p in (data / f"{topic}-0").glob("*.log"))


def test_the_log_start_survives_a_restart_and_retention_deletes_below_it(tmp_path):
    settings = {"log.segment.bytes": "1024", "log.retention.check.interval.ms": "200"}
    with BrokerProcess(tmp_path / "data", settings=settings) as b:
        confluent_create_topic(b.bootstrap_servers, "kept", 1)
        _produce(b.bootstrap_servers, "kept", 60)
        before = _segments(tmp_path / "data", "kept")
        assert len(before) > 3
        start = before[2] + 1  # inside the third segment
        with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
            tp = TopicPartition("kept", 0)
            assert admin.delete_records({tp: start}) == {tp: start}
        # Retention deletes the two segments wholly below it, keeps the one it starts in.
        wait_until(lambda: _segments(tmp_path / "data", "kept") == before[2:], 30,
                   "segments below the log start deleted")
        b.restart()
        assert _earliest(b.bootstrap_servers, "kept") == start
        assert _fetch_error(b.bootstrap_servers, "kept", start - 1) == OFFSET_OUT_OF_RANGE
        records = _read_from_earliest(b.bootstrap_servers, "kept", 60 - start)
        assert records[0].offset == start and records[-1].offset == 59
