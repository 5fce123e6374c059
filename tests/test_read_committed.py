"""Transactional data on the wire: Produce accepts transactional batches, WriteTxnMarkers ends
them, and read_committed readers (raw Fetch and ListOffsets, our Consumer, confluent-kafka's)
see committed records only, never an aborted or an open transaction (spec 000, "Broker",
"Consumer")."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import TopicPartition as ConfluentTP
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    fetch_request,
    idempotent_batch,
    init_producer_id_request,
    list_offsets_request,
    produce,
    write_txn_markers_request,
)

from oncelog import Consumer, TopicPartition
from oncelog.records import decode_batch, iter_batches

TOPIC = "txn-data"


@pytest.fixture
def conn(embedded_broker):
    with RawConnection(embedded_broker.bootstrap_servers) as c:
        assert c.request(create_topics_request(TOPIC, 1)).topics[0].error_code == 0
        yield c


def _pid(conn) -> int:
    r = conn.request(init_producer_id_request())
    assert r.error_code == 0
    return r.producer_id


def _txn(conn, pid, seq, values, epoch=0):
    r = produce(conn, TOPIC, 0, idempotent_batch(pid, epoch, seq, values, is_transactional=True))
    assert r.error_code == 0, r
    return r.base_offset


def _marker(conn, pid, commit, epoch=0, coordinator_epoch=0):
    r = conn.request(write_txn_markers_request(pid, epoch, commit, [(TOPIC, 0)],
                                               coordinator_epoch))
    return r.markers[0].topics[0].partitions[0].error_code


def _fetch(conn, offset=0, isolation=1):
    pd = conn.request(fetch_request(TOPIC, 0, offset, isolation_level=isolation)
                      ).responses[0].partitions[0]
    assert pd.error_code == 0
    data = pd.records or b""
    out = [decode_batch(data, pos) for pos, _ in iter_batches(data)]
    return pd, out


def _end(conn, isolation):
    r = conn.request(list_offsets_request(TOPIC, 0, -1, isolation_level=isolation))
    return r.topics[0].partitions[0].offset


def _scenario(conn):
    """committed (pid a), aborted (pid b), then pid c left open: values say which."""
    a, b, c = _pid(conn), _pid(conn), _pid(conn)
    _txn(conn, a, 0, [b"committed-1"])
    _txn(conn, b, 0, [b"aborted-1", b"aborted-2"])
    _txn(conn, a, 1, [b"committed-2"])
    assert _marker(conn, b, False) == 0
    assert _marker(conn, a, True) == 0
    _txn(conn, c, 0, [b"open-1"])
    produce(conn, TOPIC, 0, idempotent_batch(_pid(conn), 0, 0, [b"after-open"]))
    return a, b, c


def test_read_committed_fetch_stops_at_the_lso_and_lists_aborted_transactions(conn):
    a, b, c = _scenario(conn)
    # offsets: 0 a, 1-2 b, 3 a, 4 abort(b), 5 commit(a), 6 c (open), 7 non-transactional
    pd, batches = _fetch(conn, isolation=1)
    assert pd.high_watermark == 8 and pd.last_stable_offset == 6
    assert [h.base_offset for h, _ in batches] == [0, 1, 3, 4, 5]  # nothing at or past the LSO
    assert [(t.producer_id, t.first_offset) for t in pd.aborted_transactions] == [(b, 1)]
    assert _end(conn, 1) == 6 and _end(conn, 0) == 8
    pd, batches = _fetch(conn, isolation=0)  # read_uncommitted: everything, no aborted list
    assert [h.base_offset for h, _ in batches] == [0, 1, 3, 4, 5, 6, 7]
    assert pd.aborted_transactions is None
    assert _marker(conn, c, True) == 0
    pd, batches = _fetch(conn, offset=6, isolation=1)
    assert pd.last_stable_offset == 9 and list(pd.aborted_transactions) == []
    assert [r.value for h, rs in batches if not h.is_control for r in rs] == [b"open-1",
                                                                              b"after-open"]


def test_a_marker_from_an_older_coordinator_epoch_is_refused(conn):
    pid = _pid(conn)
    _txn(conn, pid, 0, [b"x"])
    assert _marker(conn, pid, True, coordinator_epoch=3) == 0
    _txn(conn, pid, 1, [b"y"])
    assert _marker(conn, pid, True, coordinator_epoch=2) == 52  # TRANSACTION_COORDINATOR_FENCED
    assert _marker(conn, pid, False, epoch=0, coordinator_epoch=3) == 0


def test_markers_on_unknown_partitions_answer_per_partition(conn):
    r = conn.request(write_txn_markers_request(5, 0, True, [(TOPIC, 0), (TOPIC, 7)]))
    errors = {p.partition_index: p.error_code for p in r.markers[0].topics[0].partitions}
    assert errors == {0: 0, 7: 3}  # 3: UNKNOWN_TOPIC_OR_PARTITION


def test_our_read_committed_consumer_sees_only_committed_records(embedded_broker, conn):
    _scenario(conn)
    values = {}
    for isolation in ("read_committed", "read_uncommitted"):
        with Consumer(bootstrap_servers=embedded_broker.bootstrap_servers,
                      isolation_level=isolation) as consumer:
            tp = TopicPartition(TOPIC, 0)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            got = []
            end = 6 if isolation == "read_committed" else 8
            deadline = time.monotonic() + 60  # fail, never hang, if the reader stalls
            while consumer.position(tp) < end:
                assert time.monotonic() < deadline, f"{isolation}: stuck at " \
                    f"{consumer.position(tp)} of {end}, read {got}"
                got.extend(r.value for r in consumer.poll(timeout=1.0))
            values[isolation] = got
            consumer.seek_to_end(tp)
            assert consumer.position(tp) == end  # the LSO for read_committed
    assert values["read_committed"] == [b"committed-1", b"committed-2"]
    assert values["read_uncommitted"] == [b"committed-1", b"aborted-1", b"aborted-2",
                                          b"committed-2", b"open-1", b"after-open"]


def test_confluent_read_committed_consumer_sees_only_committed_records(embedded_broker, conn):
    _scenario(conn)
    consumer = ConfluentConsumer({"bootstrap.servers": embedded_broker.bootstrap_servers,
                                  "group.id": "unused", "isolation.level": "read_committed",
                                  "enable.auto.commit": False})
    try:
        consumer.assign([ConfluentTP(TOPIC, 0, 0)])
        got = []
        for _ in range(20):
            msg = consumer.poll(0.5)
            if msg is None:
                if got:
                    break
                continue
            assert msg.error() is None, msg.error()
            got.append(msg.value())
        assert got == [b"committed-1", b"committed-2"]
        low, high = consumer.get_watermark_offsets(ConfluentTP(TOPIC, 0), timeout=10)
        assert (low, high) == (0, 6)  # read_committed: the high end is the LSO
    finally:
        consumer.close()


def test_describe_producers_shows_open_transactions(conn):
    from oncelog.protocol import ApiKey, make, request_module

    a, b, c = _scenario(conn)
    mod = request_module(ApiKey.DESCRIBE_PRODUCERS, 0)
    r = conn.request(make(mod.DescribeProducersRequest, topics=(
        make(mod.TopicRequest, name=TOPIC, partition_indexes=(0, 9)),)))
    part, missing = r.topics[0].partitions
    assert missing.error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
    state = {p.producer_id: (p.producer_epoch, p.last_sequence, p.current_txn_start_offset)
             for p in part.active_producers}
    assert state[a] == (0, 1, -1) and state[b] == (0, 1, -1)  # ended by their markers
    assert state[c] == (0, 0, 6)  # still open, from offset 6


def test_lag_is_measured_against_the_lso_for_read_committed(embedded_broker, conn):
    _scenario(conn)  # HW 8, LSO 6 (producer c's transaction is open)
    lags = {}
    for isolation in ("read_committed", "read_uncommitted"):
        with Consumer(bootstrap_servers=embedded_broker.bootstrap_servers,
                      isolation_level=isolation) as consumer:
            tp = TopicPartition(TOPIC, 0)
            consumer.assign([tp])
            consumer.seek(tp, 1)
            assert consumer.current_lag(tp) is None  # nothing fetched yet
            while consumer.current_lag(tp) is None:
                consumer.poll(timeout=0.2)
            consumer.seek(tp, 1)
            lags[isolation] = consumer.current_lag(tp)
    assert lags == {"read_committed": 5, "read_uncommitted": 7}
