"""Producer.send_batch against a real broker: what it writes is what confluent-kafka and our
consumer read back, at the partitions ``send`` would pick; idempotent and transactional (two
phase); a call with a bad partition or too large a record fails whole, nothing written."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from support.interop import (
    BASE_TIMESTAMP,
    Rec,
    check_consumed,
    confluent_consume,
    dataset,
    unique_topic,
)

from oncelog import Admin, Consumer, NewTopic, Producer
from oncelog.client.errors import TransactionError
from oncelog.errors import MessageTooLargeError, UnknownTopicOrPartitionError
from oncelog.server.embedded import EmbeddedBroker

pytestmark = pytest.mark.slow

BROKER_CONFIG = {"transaction.two.phase.commit.enable": "true",
                 "transaction.state.log.num.partitions": "2",
                 "auto.create.topics.enable": "false"}


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config=BROKER_CONFIG) as b:
        yield b


def new_topic(broker, partitions: int) -> str:
    topic = unique_topic("bulk")
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    return topic


def consume(broker, topic: str, partitions: int, expect: int, **config) -> list[Rec]:
    """Every record of ``topic`` by our consumer (read_committed unless told otherwise)."""
    c = Consumer(bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                 isolation_level=config.pop("isolation_level", "read_committed"), **config)
    out: list[Rec] = []
    try:
        c.assign([(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 20
        while len(out) < expect and time.monotonic() < deadline:
            out += [Rec(r.key, r.value, tuple(r.headers), r.timestamp, r.partition, r.offset)
                    for r in c.poll(0.2)]
        out += [Rec(r.key, r.value, tuple(r.headers), r.timestamp, r.partition, r.offset)
                for r in c.poll(0.3)]
    finally:
        c.close()
    return out


def with_positions(records: list[Rec], result, partitions_of: list[int]) -> list[Rec]:
    """``records`` with the partition and offset send_batch's result implies: its batches
    are partition by partition, each partition's rows in the call's order."""
    by_partition: dict[int, list[int]] = {}
    for i, p in enumerate(partitions_of):
        by_partition.setdefault(p, []).append(i)
    out = list(records)
    queue = {p: list(rows) for p, rows in by_partition.items()}
    bases = {}
    for p, base in result:
        bases.setdefault(p, base)
    for p, rows in queue.items():
        for n, i in enumerate(rows):
            r = records[i]
            out[i] = Rec(r.key, r.value, r.headers, r.timestamp, p, bases[p] + n)
    return out


def test_round_trip_read_by_confluent_kafka_and_our_consumer(broker):
    topic = new_topic(broker, 3)
    records = dataset("bulk", 300)
    parts = [i % 3 for i in range(len(records))]
    with Producer(bootstrap_servers=broker.bootstrap_servers, batch_size=4096,
                  compression_type="gzip", linger_ms=0) as producer:
        result = producer.send_batch(
            topic, [r.value for r in records], [r.key for r in records], partition=parts,
            timestamps=[r.timestamp for r in records],
            headers=[list(r.headers) for r in records]).result(20)
    assert len(result) > 3  # several batches per partition at a 4 KiB batch.size
    produced = with_positions(records, result, parts)
    check_consumed(produced, confluent_consume(broker.bootstrap_servers, topic, 3),
                   partitions=3)
    check_consumed(produced, consume(broker, topic, 3, len(records)), partitions=3)


def test_arrow_columns_and_a_record_larger_than_batch_size(broker):
    topic = new_topic(broker, 1)
    values = [b"v%03d" % i for i in range(50)] + [b"x" * 20000] + [None, b""]
    keys = [None if i % 3 else b"k%d" % i for i in range(len(values))]
    arrow_values = pa.array([b"pad", *values], pa.large_binary()).slice(1)
    arrow_keys = pa.array(["pad", *[None if k is None else k.decode() for k in keys]]).slice(1)
    headers = [None if i % 4 else [("i", b"%d" % i), ("n", None)] for i in range(len(values))]
    arrow_headers = pa.array(  # Spark's Kafka headers column
        [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers],
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    with Producer(bootstrap_servers=broker.bootstrap_servers, batch_size=1024) as producer:
        result = producer.send_batch(topic, arrow_values, arrow_keys, partition=0,
                                     timestamps=BASE_TIMESTAMP, headers=arrow_headers).result(20)
    got = consume(broker, topic, 1, len(values))
    assert [(r.key, r.value, r.timestamp, list(r.headers)) for r in got] == \
        [(k, v, BASE_TIMESTAMP, h or []) for k, v, h in zip(keys, values, headers, strict=True)]
    assert [r.offset for r in got] == list(range(len(values)))
    # the 20 kB record is alone in its batch
    bases = [base for _, base in result]
    assert 50 in bases and 51 in bases


@pytest.mark.parametrize("arrow", [False, True], ids=["list", "arrow"])
def test_keys_go_where_send_puts_them_and_null_keys_stick_together(broker, arrow):
    topic = new_topic(broker, 5)
    keys = [b"key-%d" % i for i in range(200)] + [None] * 20
    with Producer(bootstrap_servers=broker.bootstrap_servers) as producer:
        # Arrow keys: the Spark sink's case (a key column, no partition column)
        producer.send_batch(topic, [b"bulk"] * len(keys),
                            pa.array(keys, pa.binary()) if arrow else keys).result(20)
        for k in keys[:200]:
            producer.send(topic, b"single", key=k)
        producer.flush(20)
    got = consume(broker, topic, 5, 2 * 200 + 20)
    bulk = {r.key: r.partition for r in got if r.value == b"bulk" and r.key is not None}
    single = {r.key: r.partition for r in got if r.value == b"single"}
    assert len(bulk) == 200
    assert bulk == single
    assert len({r.partition for r in got if r.key is None}) == 1


def test_idempotent_transactional_two_phase_commit_and_abort(broker):
    topic = new_topic(broker, 4)
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id=unique_topic("t"),
                  transaction_two_phase_commit_enable=True, batch_size=2048) as producer:
        producer.init_transactions(20)
        producer.begin_transaction()
        aborted = producer.send_batch(topic, [b"aborted-%d" % i for i in range(500)],
                                      [b"%d" % i for i in range(500)])
        assert len(aborted.result(20)) >= 4
        producer.abort_transaction(20)
        producer.begin_transaction()
        values = [b"committed-%d" % i for i in range(1000)]
        keys = [b"%d" % i for i in range(1000)]
        future = producer.send_batch(topic, values, keys)
        producer.send(topic, b"single", key=b"0")
        producer.prepare_transaction(20)
        producer.commit_transaction(20)
        assert future.done() and not future.exception()
    committed = consume(broker, topic, 4, 1001)
    assert sorted(r.value for r in committed) == sorted([*values, b"single"])
    everything = consume(broker, topic, 4, 1501, isolation_level="read_uncommitted")
    assert len(everything) == 1501


@pytest.mark.parametrize("bad", ["partition", "too large", "unknown topic"])
def test_a_bad_row_fails_the_call_and_nothing_of_it_is_written(broker, bad):
    topic = new_topic(broker, 2)
    values = [b"v%d" % i for i in range(100)]
    parts = [i % 2 for i in range(100)]
    kwargs = {}
    name = topic
    if bad == "partition":
        parts[57] = 2
        error = UnknownTopicOrPartitionError
    elif bad == "too large":
        values[80] = b"x" * 3000
        error = MessageTooLargeError
    else:
        name = unique_topic("missing")
        error = UnknownTopicOrPartitionError
        kwargs["max_block_ms"] = 1000
    with Producer(bootstrap_servers=broker.bootstrap_servers, max_request_size=2000,
                  batch_size=200, **kwargs) as producer:
        future = producer.send_batch(name, values, partition=parts)
        with pytest.raises(error):
            future.result(20)
        producer.send(topic, b"after", partition=0).result(20)
        producer.send(topic, b"after", partition=1).result(20)
    assert [r.value for r in consume(broker, topic, 2, 2)] == [b"after", b"after"]


def test_a_failed_call_fails_its_transaction(broker):
    topic = new_topic(broker, 2)
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id=unique_topic("t"),
                  transaction_two_phase_commit_enable=True) as producer:
        producer.init_transactions(20)
        producer.begin_transaction()
        producer.send_batch(topic, [b"ok"], partition=0).result(20)
        assert producer.send_batch(topic, [b"bad"], partition=[9]).exception(5) is not None
        with pytest.raises(TransactionError):
            producer.prepare_transaction(20)
        producer.abort_transaction(20)
    assert consume(broker, topic, 2, 0) == []


def test_wrong_columns_raise_at_once(broker):
    topic = new_topic(broker, 1)
    with Producer(bootstrap_servers=broker.bootstrap_servers) as producer:
        with pytest.raises(TypeError):
            producer.send_batch(topic, [1, 2, 3])
        with pytest.raises(ValueError, match="rows"):
            producer.send_batch(topic, [b"a"], keys=[b"a", b"b"])
        with pytest.raises(ValueError, match="rows"):
            producer.send_batch(topic, [b"a"], partition=[0, 0])
        assert producer.send_batch(topic, []).result(5) == []
