"""Producer delivery: idempotent sequences, retries in order, duplicates, errors, timeouts.

Run against FakeBroker (conftest.py), which checks sequences as Kafka does and lets a test lose
an answer or return an error for one particular batch.
"""

from __future__ import annotations

import threading

import pytest
from support.fake_broker import CLOSE

from oncelog import Producer
from oncelog.client import KafkaTimeoutError
from oncelog.errors import (
    InvalidRecordError,
    KafkaError,
    UnknownTopicOrPartitionError,
)
from oncelog.records import decode_batch

NOT_LEADER_OR_FOLLOWER = 6
UNKNOWN_PRODUCER_ID = 59
INVALID_RECORD = 87


def producer(broker, **kwargs) -> Producer:
    config = {"bootstrap_servers": broker.bootstrap_servers, "linger_ms": 0,
              "retry_backoff_ms": 10, "max_block_ms": 5000}
    config.update(kwargs)
    return Producer(**config)


def values_in_log(broker, topic="t", partition=0) -> list[bytes]:
    out = []
    for header, raw in broker.records(topic, partition):
        out += [r.value for r in decode_batch(raw)[1]]
    return out


def test_batches_carry_the_producer_id_and_consecutive_sequences(fake_broker):
    broker = fake_broker()
    with producer(broker, batch_size=1) as p:  # one record per batch
        results = [p.send("t", f"v{i}").result(5) for i in range(4)]
    assert [md.offset for md in results] == [0, 1, 2, 3]
    headers = [h for _, _, h in broker.produced]
    assert {(h.producer_id, h.producer_epoch) for h in headers} == {(1000, 0)}
    assert [h.base_sequence for h in headers] == [0, 1, 2, 3]


def test_a_retried_batch_keeps_its_sequence_and_is_written_once(fake_broker):
    broker = fake_broker()
    broker.produce_faults[("t", 0)].append(lambda conn: NOT_LEADER_OR_FOLLOWER)
    with producer(broker) as p:
        md = p.send("t", b"once").result(5)
    assert md.offset == 0
    first, retry = [h for _, _, h in broker.produced]
    assert (first.producer_id, first.base_sequence) == (retry.producer_id, retry.base_sequence)
    assert values_in_log(broker) == [b"once"]


def test_a_lost_answer_is_retried_and_the_duplicate_counts_as_success(fake_broker):
    broker = fake_broker()
    broker.produce_faults[("t", 0)].append(lambda conn: CLOSE)  # written, answer lost
    with producer(broker) as p:
        md = p.send("t", b"once").result(5)
        md2 = p.send("t", b"twice").result(5)
    assert md.offset == 0  # the broker's DUPLICATE_SEQUENCE_NUMBER answer carries it
    assert md2.offset == 1
    assert values_in_log(broker) == [b"once", b"twice"]


def test_five_in_flight_then_a_failure_retries_all_in_order(fake_broker):
    broker = fake_broker()
    most_in_flight = []

    def fail_first_when_five_are_in_flight(conn):
        assert conn.wait_queued(4)  # requests 2..5 sent while the first is unanswered
        # Absence cannot be awaited: give a sixth request a short chance to show up.
        conn.wait_queued(5, timeout=0.3)
        most_in_flight.append(1 + len(conn.frames))
        return NOT_LEADER_OR_FOLLOWER

    broker.produce_faults[("t", 0)].append(fail_first_when_five_are_in_flight)
    with producer(broker, batch_size=1) as p:
        futures = [p.send("t", f"v{i}") for i in range(8)]
        offsets = [f.result(5).offset for f in futures]
    assert most_in_flight == [5]
    assert offsets == list(range(8))
    assert values_in_log(broker) == [f"v{i}".encode() for i in range(8)]
    logged = [h for h, _ in broker.records("t")]
    assert [h.base_sequence for h in logged] == list(range(8))
    # every batch after the failed one was answered OUT_OF_ORDER and sent again, same sequence
    sent = [h.base_sequence for _, _, h in broker.produced]
    assert sorted(set(sent)) == list(range(8)) and sent.count(0) == 2


def test_a_non_retriable_error_fails_the_future_with_its_class(fake_broker):
    broker = fake_broker()
    broker.produce_faults[("t", 0)].append(lambda conn: INVALID_RECORD)
    with producer(broker) as p:
        with pytest.raises(InvalidRecordError):
            p.send("t", b"bad").result(5)
        # The lost sequence would put every later batch out of order: the producer takes a
        # new producer id and starts again at sequence 0.
        assert p.send("t", b"good").result(5).offset == 0
    last = broker.produced[-1][2]
    assert (last.producer_id, last.base_sequence) == (1001, 0)
    assert values_in_log(broker) == [b"good"]


def test_unknown_producer_id_is_retried_under_a_new_producer_id(fake_broker):
    broker = fake_broker()
    broker.produce_faults[("t", 0)].append(lambda conn: UNKNOWN_PRODUCER_ID)
    with producer(broker) as p:
        assert p.send("t", b"v").result(5).offset == 0
    pids = [h.producer_id for _, _, h in broker.produced]
    assert pids == [1000, 1001]


def test_retriable_errors_are_retried_until_the_delivery_timeout(fake_broker):
    broker = fake_broker()
    attempts = threading.Semaphore(0)

    def not_leader(conn):
        attempts.release()
        return NOT_LEADER_OR_FOLLOWER

    broker.produce_faults[("t", 0)].extend([not_leader] * 10_000)
    with producer(broker, delivery_timeout_ms=1500, request_timeout_ms=1000) as p:
        future = p.send("t", b"v")
        for _ in range(3):  # retried, not failed at the first error
            assert attempts.acquire(timeout=5)
        with pytest.raises(KafkaTimeoutError, match="NotLeaderOrFollower"):
            future.result(5)


def test_retries_zero_fails_at_the_first_retriable_error(fake_broker):
    broker = fake_broker()
    broker.produce_faults[("t", 0)].append(lambda conn: NOT_LEADER_OR_FOLLOWER)
    with (producer(broker, retries=0, enable_idempotence=False) as p,
          pytest.raises(KafkaError, match="NotLeaderOrFollower")):
        p.send("t", b"v").result(5)


def test_sending_to_an_unknown_topic_fails_after_max_block_ms(fake_broker):
    broker = fake_broker()
    with producer(broker, max_block_ms=200) as p:
        future = p.send("nope", b"v")
        with pytest.raises(UnknownTopicOrPartitionError, match="not present in metadata"):
            future.result(0)  # send() already waited max.block.ms


def test_an_explicit_partition_must_exist(fake_broker):
    broker = fake_broker({"t": 2})
    with producer(broker) as p:
        assert p.send("t", b"v", partition=1).result(5).partition == 1
        with pytest.raises(UnknownTopicOrPartitionError, match="partition 2"):
            p.send("t", b"v", partition=2).result(5)


def test_acks_zero_completes_without_an_answer(fake_broker):
    broker = fake_broker()
    with producer(broker, acks=0) as p:
        md = p.send("t", b"v").result(5)
    assert md.offset == -1
    with broker.changed:
        assert broker.changed.wait_for(lambda: broker.logs[("t", 0)], 5)
    assert broker.produced[0][2].producer_id == -1  # acks=0 turned idempotence off


def test_close_sends_what_is_queued_and_send_after_close_raises(fake_broker):
    broker = fake_broker()
    p = producer(broker, linger_ms=60000)  # nothing would leave before close
    futures = [p.send("t", f"v{i}") for i in range(3)]
    p.close(5)
    assert [f.result(0).offset for f in futures] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="closed"):
        p.send("t", b"late")


def test_flush_sends_batches_before_linger_ms(fake_broker):
    broker = fake_broker()
    with producer(broker, linger_ms=60000) as p:
        future = p.send("t", b"v")
        p.flush(5)
        assert future.done()


def test_flush_times_out_while_the_broker_does_not_answer(fake_broker):
    broker = fake_broker()
    broker.handlers[0] = lambda conn, header, request: None  # Produce: never answer
    p = producer(broker)
    p.send("t", b"v")
    with pytest.raises(KafkaTimeoutError, match="flush"):
        p.flush(0.2)
    p.close(0)


def test_records_too_large_for_a_request_fail_at_once(fake_broker):
    broker = fake_broker()
    with (producer(broker, max_request_size=1000) as p,
          pytest.raises(KafkaError, match="max.request.size")):
        p.send("t", b"x" * 2000).result(0)


def test_send_from_several_threads(fake_broker):
    broker = fake_broker()
    with producer(broker, linger_ms=5) as p:
        futures: list = []

        def send_many(n: int) -> None:
            futures.extend(p.send("t", f"{n}-{i}") for i in range(200))

        threads = [threading.Thread(target=send_many, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        offsets = sorted(f.result(10).offset for f in futures)
    assert offsets == list(range(800))
    assert sorted(values_in_log(broker)) == sorted(f"{n}-{i}".encode()
                                                   for n in range(4) for i in range(200))


def test_send_blocks_while_buffer_memory_is_full_then_fails(fake_broker):
    broker = fake_broker()
    broker.handlers[0] = lambda conn, header, request: None  # Produce: never answer
    p = producer(broker, buffer_memory=1000, max_block_ms=200)
    first = p.send("t", b"x" * 900)
    with pytest.raises(KafkaTimeoutError, match="buffer.memory"):
        p.send("t", b"y" * 900).result(0)
    assert not first.done()
    p.close(0)
    with pytest.raises(KafkaError, match="closed"):
        first.result(0)
