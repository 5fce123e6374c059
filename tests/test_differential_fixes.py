"""The differences the differential test (oncelog.harness.differential) found between oncelog
and Apache Kafka 4.3, each fixed in the broker and pinned here with the values Kafka answered
to the same requests. One embedded broker for the module; every test uses names of its own.

The requests are the differential test's own steps (``Side``), so each test reads as the
sequence that showed the difference."""

from __future__ import annotations

import struct
import time
import uuid

import pytest

from oncelog.harness.differential import ONCELOG_SETTINGS, S, Side, W
from oncelog.protocol import ApiKey, ProtocolError, decode_response, millis
from oncelog.server.embedded import EmbeddedBroker

NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION = 0, 1, 3
INVALID_TOPIC_EXCEPTION, CONCURRENT_TRANSACTIONS, INVALID_RECORD = 17, 51, 87
OUT_OF_ORDER_SEQUENCE = 45
ZERO_UUID = "0"  # the normaliser's "no topic id"; a real one is "id"


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config={**ONCELOG_SETTINGS,
                                "transaction.state.log.num.partitions": "2",
                                "offsets.topic.num.partitions": "2"}) as b:
        yield b


@pytest.fixture
def side(broker):
    s = Side("oncelog", broker.bootstrap_servers, f"fx{uuid.uuid4().hex[:8]}-",
             (int(time.time()) - 3600) * 1000)
    yield s
    s.close()


def run(side: Side, *steps):
    """The answer of the last step (the others must succeed or be settle steps)."""
    answer = None
    for step in steps:
        answer = side.step(step)
        if step.settle:
            assert answer is None, answer
    return answer


def topic(name: str, partitions: int = 1):
    return (S("create_topics", topics=[(name, partitions, 1, {})]),
            W("topic_ready", topic=name, partitions=partitions))


def partition(answer, i: int = 0):
    return answer["responses"][0]["partitions"][i]


def produced(answer):
    return answer["responses"][0]["partition_responses"][0]


def test_fetch_out_of_range_answers_no_offsets(side):
    """Kafka: a consumer's fetch that fails (OFFSET_OUT_OF_RANGE) carries no high watermark,
    last stable offset nor log start offset (-1 each), and no aborted transactions (null)
    at either isolation level; oncelog answered the partition's offsets."""
    run(side, *topic("oor"), S("produce", topic="oor", partition=0, batch={"n": 2}))
    for isolation in (0, 1):
        for offset in (50, -1):
            p = partition(side.step(S("fetch", topic="oor", partition=0, offset=offset,
                                      isolation=isolation)))
            assert (p["error_code"], p["high_watermark"], p["last_stable_offset"],
                    p["log_start_offset"], p["aborted_transactions"]) == (
                OFFSET_OUT_OF_RANGE, -1, -1, -1, None)
    # a fetch that reads keeps them: the list (empty) for read_committed, null otherwise
    ok = partition(side.step(S("fetch", topic="oor", partition=0, offset=0, isolation=1)))
    assert (ok["high_watermark"], ok["aborted_transactions"]) == (2, [])
    ok = partition(side.step(S("fetch", topic="oor", partition=0, offset=0, isolation=0)))
    assert (ok["high_watermark"], ok["aborted_transactions"]) == (2, None)


def test_fetch_of_unknown_partition_has_an_empty_aborted_list(side):
    """Kafka answers a partition it refuses before reading (UNKNOWN_TOPIC_OR_PARTITION) with
    an empty list of aborted transactions at both isolation levels (oncelog: null)."""
    run(side, *topic("unk"))
    for isolation in (0, 1):
        p = partition(side.step(S("fetch", topic="unk", partition=1, offset=0,
                                  isolation=isolation)))
        assert (p["error_code"], p["high_watermark"], p["aborted_transactions"]) == (
            UNKNOWN_TOPIC_OR_PARTITION, -1, [])


def test_list_offsets_by_timestamp_not_found_has_no_leader_epoch(side):
    """Kafka: no record at or after the timestamp is offset -1, timestamp -1 and leader epoch
    -1 (oncelog answered the leader's epoch, 0)."""
    answer = run(side, *topic("lo"), S("produce", topic="lo", partition=0, batch={"n": 2}),
                 S("list_offsets", topic="lo", partition=0, timestamp=5))
    p = answer["topics"][0]["partitions"][0]
    assert (p["error_code"], p["offset"], p["timestamp"], p["leader_epoch"]) == (
        NONE, -1, -1, -1)
    found = side.step(S("list_offsets", topic="lo", partition=0, timestamp=1))
    assert found["topics"][0]["partitions"][0]["leader_epoch"] == 0


def test_produce_errors_carry_the_log_start_offset_as_kafka(side):
    """Kafka's ReplicaManager answers a batch the log refuses (out of order, an old epoch, an
    inconsistent batch: INVALID_RECORD) with the partition's log start offset; a corrupt
    batch and a request-level refusal (a batch of the wrong magic) with -1."""
    run(side, *topic("ls"), S("init_pid", pid="p", txn=None),
        S("produce", topic="ls", partition=0, batch={"n": 2, "pid": "p", "seq": 0}))
    cases = [
        ({"n": 1, "pid": "p", "seq": 7}, OUT_OF_ORDER_SEQUENCE, 0),
        ({"n": 1, "mutate": "delta"}, INVALID_RECORD, 0),
        ({"n": 1, "mutate": "crc"}, 2, -1),  # CORRUPT_MESSAGE
        ({"n": 1, "mutate": "magic"}, INVALID_RECORD, -1),  # was CORRUPT_MESSAGE
    ]
    for batch, error, log_start in cases:
        p = produced(side.step(S("produce", topic="ls", partition=0, batch=batch)))
        assert (p["error_code"], p["base_offset"], p["log_start_offset"]) == (
            error, -1, log_start), batch


def test_acks_0_produce_that_fails_closes_the_connection(side):
    """Kafka tells an acks=0 producer its request failed by closing the connection; a good
    acks=0 produce leaves it open (the request behind it is answered)."""
    run(side, *topic("a0"))
    assert side.step(S("produce", topic="a0", partition=0, acks=0, batch={"n": 1})) == "open"
    assert side.step(S("produce", topic="a0", partition=0, acks=0,
                       batch={"n": 1, "mutate": "crc"})) == "closed"
    latest = side.step(S("list_offsets", topic="a0", partition=0, timestamp=-1))
    assert latest["topics"][0]["partitions"][0]["offset"] == 1


def test_duplicate_batch_is_answered_with_its_timestamp_as_log_append_time(side):
    """Kafka answers a duplicate of an idempotent batch with the first one's offset and the
    batch's max timestamp as log_append_time (oncelog: none)."""
    first = run(side, *topic("dup"), S("init_pid", pid="p", txn=None),
                S("produce", topic="dup", partition=0, batch={"n": 3, "pid": "p", "seq": 0}))
    assert produced(first)["log_append_time"] is None
    again = produced(side.step(S("produce", topic="dup", partition=0,
                                 batch={"n": 3, "pid": "p", "seq": 0})))
    assert (again["error_code"], again["base_offset"], again["log_append_time"]) == (
        NONE, 0, side.base_ms + 2000)  # the batch's third record's timestamp


def test_create_topics_refuses_a_name_colliding_on_dot_and_underscore(side):
    """Kafka: 'a.b' and 'a_b' collide in metric names, the second is INVALID_TOPIC_EXCEPTION
    (either way round); a validate-only create answers the id the topic would get."""
    answer = run(side, *topic("c.d"), S("create_topics", topics=[("c_d", 1, 1, {})]))
    t = answer["topics"][0]
    assert (t["error_code"], t["topic_id"], t["num_partitions"]) == (
        INVALID_TOPIC_EXCEPTION, ZERO_UUID, -1)
    answer = run(side, *topic("e_f"), S("create_topics", topics=[("e.f", 1, 1, {})]))
    assert answer["topics"][0]["error_code"] == INVALID_TOPIC_EXCEPTION
    checked = side.step(S("create_topics", topics=[("g.h", 2, 1, {})], validate_only=True))
    assert (checked["topics"][0]["error_code"], checked["topics"][0]["topic_id"]) == (
        NONE, "id")


def test_delete_topics_answers_the_deleted_topics_id(side):
    answer = run(side, *topic("del"), S("delete_topics", topics=["del", "nope"]))
    by_name = {r["name"]: r for r in answer["responses"]}
    assert (by_name["~del"]["error_code"], by_name["~del"]["topic_id"]) == (NONE, "id")
    assert (by_name["~nope"]["error_code"], by_name["~nope"]["topic_id"]) == (
        UNKNOWN_TOPIC_OR_PARTITION, ZERO_UUID)


@pytest.mark.parametrize("version", [4, 5])
def test_init_producer_id_retried_after_the_coordinator_fenced_the_open_transaction(
        side, version):
    """KIP-360 at transaction version 2, as Kafka 4.3: InitProducerId (with its id and epoch)
    while its transaction is open aborts it at epoch + 1 (CONCURRENT_TRANSACTIONS); the
    retry with the same epoch gets the bumped epoch (oncelog: PRODUCER_FENCED), and the next
    InitProducerId bumps again."""
    x = f"fence{version}"
    run(side, *topic(x), W("coordinator", key=x, key_type=1),
        S("init_pid", pid="a", txn=x, version=version),
        S("produce", topic=x, partition=0, txn=x, version=12 if version >= 5 else 9,
          batch={"n": 1, "pid": "a", "seq": 0, "txn": True})
        if version >= 5 else S("add_partitions", pid="a", txn=x, partitions=[(x, 0)]))
    first, last = side.step(S("init_pid", pid="a", txn=x, version=version, until_ok=True))
    assert first["error_code"] == CONCURRENT_TRANSACTIONS
    assert (last["error_code"], last["producer_epoch"]) == (NONE, 1)
    again = side.step(S("init_pid", pid="a", txn=x, version=version))
    assert (again["error_code"], again["producer_epoch"]) == (NONE, 2)
    described = side.step(S("describe_transactions", txn=x))
    assert (described["transaction_state"], described["producer_epoch"]) == ("Empty", 2)


def _describe_transactions_frame(start_ms: int) -> bytes:
    """A DescribeTransactions v0 answer as Kafka writes it (flexible: compact lengths + 1,
    empty tag buffers): one transactional id in state Empty, producer 5 epoch 0."""
    def compact(text: str) -> bytes:
        return bytes([len(text) + 1]) + text.encode()
    return (struct.pack(">i", 7) + b"\x00"             # header v1: correlation id, tags
            + struct.pack(">i", 0) + b"\x02"           # throttle, one state
            + struct.pack(">h", 0) + compact("tx") + compact("Empty")
            + struct.pack(">iqqh", 60_000, start_ms, 5, 0)
            + b"\x01" + b"\x00"                        # no topics, the state's tags
            + b"\x00")                                 # the body's tags


def test_describe_transactions_answer_without_a_start_time_is_read():
    """Kafka answers -1 as the start time of a transaction not open; kio refused it, so our
    admin client could not describe such an id on Kafka (the differential test read it). It is
    read as 0, which the Admin reports as no start time (protocol/negative_times.py)."""
    correlation, answer = decode_response(ApiKey.DESCRIBE_TRANSACTIONS, 0,
                                          _describe_transactions_frame(-1))
    (state,) = answer.transaction_states
    assert (correlation, state.transaction_state, state.producer_id, millis(
        state.transaction_start_time), millis(state.transaction_timeout)) == (
        7, "Empty", 5, 0, 60_000)
    # what kio reads itself is read as before
    _c, answer = decode_response(ApiKey.DESCRIBE_TRANSACTIONS, 0,
                                 _describe_transactions_frame(1_700_000_000_000))
    assert millis(answer.transaction_states[0].transaction_start_time) == 1_700_000_000_000
    with pytest.raises(ProtocolError):  # a broken frame stays an error
        decode_response(ApiKey.DESCRIBE_TRANSACTIONS, 0, _describe_transactions_frame(-1)[:-3])


def test_end_txn_v5_without_a_producer_id_is_invalid_producer_id_mapping(side):
    """EndTxn v5 naming no producer (-1) for a transactional id that has one: Kafka answers
    INVALID_PRODUCER_ID_MAPPING; oncelog took -1 for the id before the last one (no last id
    is -1 too) and answered PRODUCER_FENCED."""
    x = "nopid"
    run(side, *topic(x), W("coordinator", key=x, key_type=1),
        S("init_pid", pid="a", txn=x, version=5),
        S("produce", topic=x, partition=0, txn=x, version=12,
          batch={"n": 1, "pid": "a", "seq": 0, "txn": True}))
    answer = side.step(S("end_txn", pid="nobody", txn=x, commit=True, version=5))
    assert (answer["error_code"], answer["producer_id"]) == (49, -1)
