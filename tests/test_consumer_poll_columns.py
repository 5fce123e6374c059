"""Consumer.poll_columns: the records poll() returns, decoded in bulk into columns. The fetch
decoding against decode_records (every fetch position and isolation level of a log with
transactions, markers, compression, LogAppendTime, a corrupt batch), then against a real
broker: the same records as poll(), positions advanced, read_committed, poll() and
poll_columns() mixed."""

from __future__ import annotations

import time

import pytest
from support.interop import dataset, unique_topic

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.client.consumer.fetcher import consumer_records, decode_columns, decode_records
from oncelog.errors import CorruptMessageError
from oncelog.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    Compression,
    build_batch,
    build_control_batch,
)
from oncelog.records.batch import set_log_append_time
from oncelog.server.embedded import EmbeddedBroker

TP = TopicPartition("t", 0)
TS = 1_700_000_000_000


def txn(pid: int, base_offset: int, values: list[bytes], seq: int = 0) -> bytes:
    return build_batch([(b"k", v, [("h", v)], TS + 1) for v in values],
                       base_offset=base_offset, producer_id=pid, producer_epoch=0,
                       base_sequence=seq, is_transactional=True, compression=Compression.GZIP)


def marker(kind: int, pid: int, offset: int) -> bytes:
    return build_control_batch(kind, producer_id=pid, producer_epoch=0, coordinator_epoch=0,
                               timestamp=TS, base_offset=offset)


def log_append_time_batch(base_offset: int) -> bytes:
    data = bytearray(build_batch([(None, b"l%d" % i, (), TS) for i in range(3)],
                                 base_offset=base_offset, compression=Compression.LZ4))
    set_log_append_time(data, 0, len(data), TS + 99)
    return bytes(data)


# 0-1 pid 7 (aborted), 2 pid 8 (committed), 3 plain, 4 ABORT(7), 5 COMMIT(8), 6 pid 7 again
# (not aborted), 7-9 LogAppendTime, then a trailing partial batch
LOG = (txn(7, 0, [b"a0", b"a1"]) + txn(8, 2, [b"c2"]) + build_batch([(None, b"p3", (), TS)],
       base_offset=3) + marker(CONTROL_ABORT, 7, 4) + marker(CONTROL_COMMIT, 8, 5)
       + txn(7, 6, [b"n6"], seq=2) + log_append_time_batch(7)
       + build_batch([(None, b"x" * 100, (), TS)], base_offset=10)[:80])
ABORTED = [(0, 7)]


@pytest.mark.parametrize("read_committed", [False, True])
@pytest.mark.parametrize("fetch_offset", range(11))
def test_decode_columns_reads_what_decode_records_reads(read_committed, fetch_offset):
    kwargs = {"read_committed": read_committed, "aborted": ABORTED, "check_crcs": True}
    records, next_offset = decode_records(TP, LOG, fetch_offset, **kwargs)
    columns, next_columns = decode_columns(TP, LOG, fetch_offset, **kwargs)
    assert next_columns == next_offset
    assert consumer_records(columns) == records
    arrow = columns.to_arrow()
    assert arrow["offset"].to_pylist() == [r.offset for r in records]
    assert arrow["timestamp_type"].to_pylist() == [r.timestamp_type for r in records]
    assert arrow["timestamp"].to_pylist() == [r.timestamp for r in records]


def test_decode_columns_refuses_a_corrupt_batch_unless_crcs_are_not_checked():
    data = bytearray(build_batch([(None, b"value", (), TS)]))
    data[-2] ^= 0xFF
    with pytest.raises(CorruptMessageError, match="CRC"):
        decode_columns(TP, bytes(data), 0, read_committed=False, aborted=None, check_crcs=True)
    columns, _ = decode_columns(TP, bytes(data), 0, read_committed=False, aborted=None,
                                check_crcs=False)
    assert columns.count == 1
    data[-7] = 0x7F  # the record's length now overruns: refused, CRC or not
    with pytest.raises(CorruptMessageError):
        decode_columns(TP, bytes(data), 0, read_committed=False, aborted=None,
                       check_crcs=False)


# --- against a broker -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker() as b:
        yield b


def consumer(broker, **config) -> Consumer:
    return Consumer(bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                    **config)


def drain_columns(c: Consumer, expect: int) -> dict:
    """Every (partition, offset) -> (timestamp, type, key, value, headers) poll_columns
    returns until ``expect`` records came."""
    out = {}
    deadline = time.monotonic() + 20
    while len(out) < expect and time.monotonic() < deadline:
        for tp, columns in c.poll_columns(0.2).items():
            assert (columns.topic, columns.partition) == tuple(tp)
            arrow = columns.to_arrow()
            rows = zip(*(arrow[name].to_pylist() for name in
                         ("offset", "timestamp", "timestamp_type", "key", "value", "headers")),
                       strict=True)
            for offset, ts, tt, k, v, h in rows:
                assert (tp.partition, offset) not in out
                out[tp.partition, offset] = (ts, tt, k, v, [(e["key"], e["value"])
                                                           for e in h or []])
    return out


def drain(c: Consumer, expect: int) -> dict:
    out = {}
    deadline = time.monotonic() + 20
    while len(out) < expect and time.monotonic() < deadline:
        for r in c.poll(0.2):
            out[r.partition, r.offset] = (r.timestamp, r.timestamp_type, r.key, r.value,
                                          r.headers)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_poll_columns_returns_what_poll_returns(broker, codec):
    topic = unique_topic("columns")
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 3, 1, {"message.timestamp.type": "LogAppendTime"}
                                      if codec == "zstd" else {})])
    records = dataset("cols", 400)
    with Producer(bootstrap_servers=broker.bootstrap_servers, compression_type=codec,
                  batch_size=4096) as producer:
        producer.send_batch(topic, [r.value for r in records], [r.key for r in records],
                            partition=[i % 3 for i in range(len(records))],
                            timestamps=[r.timestamp for r in records],
                            headers=[list(r.headers) for r in records]).result(20)
    with consumer(broker) as by_columns, consumer(broker) as by_records:
        by_columns.assign([(topic, p) for p in range(3)])
        by_records.assign([(topic, p) for p in range(3)])
        got = drain_columns(by_columns, len(records))
        assert len(got) == len(records)
        assert got == drain(by_records, len(records))
        ends = {p: max(o for pp, o in got if pp == p) + 1 for p in range(3)}
        assert {p: by_columns.position((topic, p)) for p in range(3)} == ends
        assert by_columns.poll_columns(0.3) == {}
    assert {v[1] for v in got.values()} == {1 if codec == "zstd" else 0}


@pytest.mark.slow
def test_read_committed_columns_leave_out_aborted_transactions(broker):
    topic = unique_topic("columns-txn")
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    with Producer(bootstrap_servers=broker.bootstrap_servers,
                  transactional_id=unique_topic("t")) as producer:
        producer.init_transactions(20)
        for i in range(6):
            producer.begin_transaction()
            producer.send_batch(topic, [b"t%d-%d" % (i, j) for j in range(50)], partition=0)
            if i % 2:
                producer.abort_transaction(20)
            else:
                producer.commit_transaction(20)
    with consumer(broker, isolation_level="read_committed") as c:
        c.assign([(topic, 0)])
        got = drain_columns(c, 150)
        assert sorted(v[3] for v in got.values()) == \
            sorted(b"t%d-%d" % (i, j) for i in (0, 2, 4) for j in range(50))
        assert c.poll_columns(0.3) == {}
        assert c.position((topic, 0)) == 6 * 51  # past the last marker
    with consumer(broker, isolation_level="read_uncommitted") as c:
        c.assign([(topic, 0)])
        assert len(drain_columns(c, 300)) == 300


@pytest.mark.slow
def test_poll_then_poll_columns_continue_where_the_other_stopped(broker):
    topic = unique_topic("columns-mixed")
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    with Producer(bootstrap_servers=broker.bootstrap_servers) as producer:
        producer.send_batch(topic, [b"%d" % i for i in range(100)], partition=0).result(20)
    with consumer(broker, max_poll_records=7) as c:
        c.assign([(topic, 0)])
        first: list = []
        deadline = time.monotonic() + 20
        while not first and time.monotonic() < deadline:
            first = c.poll(0.2)
        assert [r.offset for r in first] == list(range(7))
        rest = drain_columns(c, 93)
        assert sorted(o for _, o in rest) == list(range(7, 100))
        assert c.position((topic, 0)) == 100
