"""Fetch decoding: fetch position, control batches, aborted transactions, partial batches, CRCs."""

from __future__ import annotations

import pytest

from oncelog import Consumer, TopicPartition
from oncelog.client.consumer.fetcher import decode_records
from oncelog.errors import CorruptMessageError
from oncelog.protocol import ApiKey
from oncelog.records import CONTROL_ABORT, CONTROL_COMMIT, build_batch, build_control_batch

TP = TopicPartition("t", 0)
TS = 1_700_000_000_000


def txn(pid: int, base_offset: int, values: list[bytes], seq: int = 0) -> bytes:
    return build_batch([(None, v, (), TS) for v in values], base_offset=base_offset,
                       producer_id=pid, producer_epoch=0, base_sequence=seq,
                       is_transactional=True)


def marker(kind: int, pid: int, offset: int) -> bytes:
    return build_control_batch(kind, producer_id=pid, producer_epoch=0, coordinator_epoch=0,
                               timestamp=TS, base_offset=offset)


# offsets: 0-1 pid 7 (aborted later), 2 pid 8 (committed), 3 plain, 4 ABORT(7), 5 COMMIT(8),
# 6 pid 7 again, in a new transaction that is not aborted
LOG = (txn(7, 0, [b"a0", b"a1"]) + txn(8, 2, [b"c2"]) + build_batch([(None, b"p3", (), TS)],
       base_offset=3) + marker(CONTROL_ABORT, 7, 4) + marker(CONTROL_COMMIT, 8, 5)
       + txn(7, 6, [b"n6"], seq=2))
ABORTED = [(0, 7)]  # (first offset, producer id), as the broker lists it


def values(records):
    return [(r.offset, r.value) for r in records]


def test_read_committed_skips_aborted_transactions_and_markers():
    records, next_offset = decode_records(TP, LOG, 0, read_committed=True, aborted=ABORTED,
                                          check_crcs=True)
    assert values(records) == [(2, b"c2"), (3, b"p3"), (6, b"n6")]
    assert next_offset == 7


def test_read_uncommitted_returns_everything_but_markers():
    records, _ = decode_records(TP, LOG, 0, read_committed=False, aborted=None,
                                check_crcs=True)
    assert values(records) == [(0, b"a0"), (1, b"a1"), (2, b"c2"), (3, b"p3"), (6, b"n6")]


def test_records_below_the_fetch_position_are_skipped():
    records, next_offset = decode_records(TP, LOG, 1, read_committed=False, aborted=None,
                                          check_crcs=True)
    assert values(records)[0] == (1, b"a1")
    records, next_offset = decode_records(TP, LOG, 5, read_committed=False, aborted=None,
                                          check_crcs=True)
    assert values(records) == [(6, b"n6")] and next_offset == 7


def test_a_trailing_partial_batch_is_left_for_the_next_fetch():
    last = build_batch([(None, b"x" * 100, (), TS)], base_offset=7)
    records, next_offset = decode_records(TP, LOG + last[:80], 0, read_committed=False,
                                          aborted=None, check_crcs=True)
    assert records[-1].offset == 6 and next_offset == 7


def test_a_corrupt_batch_raises_unless_crcs_are_not_checked():
    data = bytearray(build_batch([(None, b"value", (), TS)]))
    data[-2] ^= 0xFF  # the last byte of the value (the very last is the header count)
    with pytest.raises(CorruptMessageError, match="CRC"):
        decode_records(TP, bytes(data), 0, read_committed=False, aborted=None, check_crcs=True)
    records, _ = decode_records(TP, bytes(data), 0, read_committed=False, aborted=None,
                                check_crcs=False)
    assert len(records) == 1


def test_consumer_reads_committed_through_fetch_and_list_offsets(fake_broker):
    broker = fake_broker({"t": 1})
    seen: dict[str, list[int]] = {"fetch": [], "list_offsets": []}

    def list_offsets(conn, header, request):
        seen["list_offsets"].append(request.isolation_level)
        return broker.response(ApiKey.LIST_OFFSETS, header.api_version, {
            "throttle_time": 0, "topics": [{"name": "t", "partitions": [{
                "partition_index": 0, "error_code": 0, "timestamp": -1, "offset": 0,
                "leader_epoch": 0}]}]})

    def fetch(conn, header, request):
        seen["fetch"].append(request.isolation_level)
        offset = request.topics[0].partitions[0].fetch_offset
        return broker.response(ApiKey.FETCH, header.api_version, {
            "throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [{
                "topic": "t", "partitions": [{
                    "partition_index": 0, "error_code": 0, "high_watermark": 7,
                    "last_stable_offset": 7, "log_start_offset": 0,
                    "aborted_transactions": [{"producer_id": pid, "first_offset": first}
                                             for first, pid in ABORTED],
                    "preferred_read_replica": -1,
                    "records": LOG if offset == 0 else b""}]}]})

    broker.handlers[ApiKey.LIST_OFFSETS] = list_offsets
    broker.handlers[ApiKey.FETCH] = fetch
    with Consumer(bootstrap_servers=broker.bootstrap_servers, isolation_level="read_committed",
                  auto_offset_reset="earliest", fetch_max_wait_ms=10) as consumer:
        consumer.assign([TP])
        records = consumer.poll(timeout=5)
        assert values(records) == [(2, b"c2"), (3, b"p3"), (6, b"n6")]
        assert consumer.position(TP) == 7
    assert set(seen["fetch"]) == {1} and seen["list_offsets"] == [1]
