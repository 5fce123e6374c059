"""The compaction topic configs through confluent-kafka's AdminClient (Kafka's names, defaults
and validation), the internal topics created compacted, and a compacted topic cleaned in the
background of an embedded broker (issue 18, section 4)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from support.compaction import partition_bytes

from oncelog.log.cleaner_manager import CHECKPOINT_FILE
from oncelog.server.embedded import EmbeddedBroker
from oncelog.server.metrics import collect


@pytest.fixture
def broker(tmp_path):
    with EmbeddedBroker(tmp_path / "data", config={"log.cleaner.backoff.ms": "50"}) as b:
        yield b


def _describe(admin: AdminClient, topic: str) -> dict[str, str]:
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return {k: v.value for k, v in admin.describe_configs([res])[res].result(10).items()}


def _create(admin: AdminClient, topic: str, config: dict[str, str]) -> None:
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(10)


def test_compaction_configs_are_accepted_described_and_validated(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    _create(admin, "both", {"cleanup.policy": "compact,delete", "delete.retention.ms": "1000",
                            "min.cleanable.dirty.ratio": "0.2", "min.compaction.lag.ms": "5",
                            "max.compaction.lag.ms": "60000"})
    got = _describe(admin, "both")
    assert got["cleanup.policy"] == "compact,delete"
    assert (got["delete.retention.ms"], got["min.cleanable.dirty.ratio"],
            got["min.compaction.lag.ms"], got["max.compaction.lag.ms"]) == (
        "1000", "0.2", "5", "60000")
    _create(admin, "plain", {})
    defaults = _describe(admin, "plain")
    assert (defaults["cleanup.policy"], defaults["delete.retention.ms"],
            defaults["min.cleanable.dirty.ratio"]) == ("delete", "86400000", "0.5")
    for bad in ({"cleanup.policy": "shred"}, {"min.cleanable.dirty.ratio": "1.5"},
                {"max.compaction.lag.ms": "0"}, {"delete.retention.ms": "-1"}):
        with pytest.raises(KafkaException) as err:
            _create(admin, "bad", bad)
        assert err.value.args[0].name() == "INVALID_CONFIG", bad


def test_the_internal_topics_are_created_compacted(broker):
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "g"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    _create(admin, "t", {})
    try:
        consumer.commit(offsets=[TopicPartition("t", 0, 1)], asynchronous=False)
    finally:
        consumer.close()
    assert _describe(admin, "__consumer_offsets")["cleanup.policy"] == "compact"
    txn = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "x"})
    txn.init_transactions(30)
    assert _describe(admin, "__transaction_state")["cleanup.policy"] == "compact"


def test_a_compacted_topic_is_cleaned_in_the_background(broker, tmp_path):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    _create(admin, "c", {"cleanup.policy": "compact", "segment.bytes": "2048",
                         "min.cleanable.dirty.ratio": "0.1"})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    for i in range(400):
        producer.produce("c", key=f"k{i % 5}".encode(), value=b"x" * 50 + str(i).encode(),
                         partition=0)
        if i % 10 == 9:
            assert producer.flush(10) == 0  # batches of 10: segments of a few batches
    checkpoint = tmp_path / "data" / "c-0" / CHECKPOINT_FILE
    deadline = time.monotonic() + 30
    while not checkpoint.exists():
        assert time.monotonic() < deadline, "no cleaning"
        time.sleep(0.05)
    # measured as the cleaner may be replacing segments (a listed file can vanish before its stat)
    log_bytes = partition_bytes(tmp_path / "data" / "c-0")
    assert log_bytes < 400 * 50  # uncompacted, it would be over 40 kB
    def samples() -> dict[str, float]:
        return {s.name: s.value for s in broker.call(collect, broker.broker)}

    while samples()["oncelog_log_cleaner_cleanings_total"] < 1:  # counted once the swap is back
        assert time.monotonic() < deadline, "no cleaning counted"
        time.sleep(0.05)
    got = samples()
    assert 0 < got["oncelog_log_cleaner_recopy_ratio"] < 1
    assert got["oncelog_log_cleaner_uncleanable_partitions"] == 0
    assert 0 <= got["oncelog_log_cleaner_max_dirty_ratio"] <= 1
    errors = []
    producer.produce("c", key=None, value=b"no key", partition=0,
                     on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(10)
    assert [e.name() for e in errors] == ["INVALID_RECORD"]


def test_an_older_data_dirs_internal_topics_become_compacted(tmp_path):
    import json

    data = tmp_path / "old"
    with EmbeddedBroker(data) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap_servers})
        _create(admin, "t", {})
        consumer = Consumer({"bootstrap.servers": b.bootstrap_servers, "group.id": "g"})
        try:
            consumer.commit(offsets=[TopicPartition("t", 0, 7)], asynchronous=False)
        finally:
            consumer.close()
    # What a broker before compaction stored for it.
    meta_path = data / ".topics" / "__consumer_offsets.json"
    meta = json.loads(meta_path.read_text())
    meta["configs"]["cleanup.policy"] = "delete"
    meta_path.write_text(json.dumps(meta))
    with EmbeddedBroker(data) as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap_servers})
        assert _describe(admin, "__consumer_offsets")["cleanup.policy"] == "compact"
        logs = b.call(lambda: [p.log.config.compact for p in
                               b.broker.topics.get("__consumer_offsets").partitions])
        assert logs and all(logs)
        check = Consumer({"bootstrap.servers": b.bootstrap_servers, "group.id": "g"})
        try:
            assert check.committed([TopicPartition("t", 0)], timeout=10)[0].offset == 7
        finally:
            check.close()
