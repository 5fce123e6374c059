"""The leader's record validation (log/validator.py, Kafka's LogValidator): a CreateTime batch's
maxTimestamp is rewritten from its records rather than refused (librdkafka writes 0 over records
without timestamps), and refusals about single records list them (KIP-467's record_errors)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest
from kio.schema.errors import ErrorCode

from oncelog.log.validator import KEYLESS_MESSAGE, RecordsError, validate_records
from oncelog.records import build_batch
from oncelog.records.batch import (
    CRC_OFFSET,
    INT64_MAX,
    MAX_TIMESTAMP_OFFSET,
    batch_crc,
    decode_batch,
    parse_header,
    split_batches,
    validate_batch,
)

NOW = 1_800_000_000_000
HOUR = 3600 * 1000


@dataclass
class Config:
    message_timestamp_type: str = "CreateTime"
    message_timestamp_before_max_ms: int = INT64_MAX
    message_timestamp_after_max_ms: int = HOUR
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    cleanup_policy: frozenset[str] = frozenset({"delete"})


def with_max_timestamp(batch: bytes, max_timestamp: int) -> bytearray:
    """``batch`` with another maxTimestamp and a CRC that matches it (as a producer sends)."""
    out = bytearray(batch)
    struct.pack_into(">q", out, MAX_TIMESTAMP_OFFSET, max_timestamp)
    struct.pack_into(">I", out, CRC_OFFSET, batch_crc(out, 0, len(out)))
    return out


def validate(data: bytearray, config: Config | None = None, now: int = NOW):
    out, batches = validate_records(config or Config(), data, split_batches(data), now, "t-0")
    assert out is data  # a bytearray is rewritten in place
    return batches


def test_a_right_batch_is_left_alone():
    data = bytearray(build_batch([(b"k", b"v", [], NOW - 5), (b"k", b"v", [], NOW)]))
    before = bytes(data)
    batches = split_batches(data)
    assert validate_records(Config(), data, batches, NOW) == (data, batches)
    assert validate_records(Config(), data, batches, NOW)[1] is batches
    assert bytes(data) == before


def test_the_requests_bytes_are_copied_only_to_be_rewritten():
    right = build_batch([(b"k", b"v", [], NOW)])
    batches = split_batches(right)
    out, same = validate_records(Config(), right, batches, NOW)
    assert out is right and same is batches  # nothing to rewrite: no copy
    wrong = bytes(with_max_timestamp(build_batch([(b"k", b"v", [], NOW - 7)]), 0))
    out, [(_pos, h)] = validate_records(Config(), wrong, split_batches(wrong), NOW)
    assert type(out) is bytearray and h.max_timestamp == NOW - 7 == parse_header(out).max_timestamp
    assert parse_header(wrong).max_timestamp == 0  # the request's bytes as they came


def test_librdkafkas_max_timestamp_0_over_records_without_timestamps_becomes_minus_1():
    data = with_max_timestamp(build_batch([(b"k", b"v", [], -1)] * 3), 0)
    [(_pos, h)] = validate(data)
    assert h.max_timestamp == -1 == parse_header(data).max_timestamp
    assert validate_batch(data).crc == h.crc  # the CRC was redone over the new header


@pytest.mark.parametrize("claimed", [0, NOW - HOUR, NOW + 10, -1])
def test_a_wrong_max_timestamp_becomes_the_largest_record_timestamp(claimed):
    ts = [NOW - 30, NOW - 10, NOW - 20]
    first = bytearray(build_batch([(b"k", b"v", [], t) for t in ts]))
    data = first + with_max_timestamp(build_batch([(b"k", b"v", [], NOW - 1)]), claimed)
    out = validate(data)
    assert [h.max_timestamp for _pos, h in out] == [NOW - 10, NOW - 1]
    assert split_batches(data) == out  # every CRC right, headers as the data says
    assert data[:len(first)] == first  # the right batch untouched


def test_a_log_append_time_topic_leaves_max_timestamp_to_the_append():
    data = with_max_timestamp(build_batch([(b"k", b"v", [], -1)]), 0)
    [(_pos, h)] = validate(data, Config(message_timestamp_type="LogAppendTime"))
    assert h.max_timestamp == 0


def test_keyless_records_on_a_compacted_topic_are_listed_by_batch_index():
    records = [(None if i % 10 == 9 else b"k%d" % i, b"v", [], NOW) for i in range(100)]
    data = bytearray(build_batch(records))
    with pytest.raises(RecordsError) as caught:
        validate(data, Config(cleanup_policy=frozenset({"compact"})))
    exc = caught.value
    assert exc.error_name == ErrorCode.invalid_record
    assert [i for i, _m in exc.record_errors] == list(range(9, 100, 10))
    assert {m for _i, m in exc.record_errors} == {KEYLESS_MESSAGE.format("t-0")}
    assert str(exc).startswith("One or more records have been rejected due to 10 record "
                               "errors in total, and only showing the first three errors at "
                               "most: [RecordError(batchIndex=9, message='Compacted topic")


def test_the_record_indexes_are_within_the_refused_batch():
    keyed = build_batch([(b"k", b"v", [], NOW)] * 3)
    keyless = build_batch([(b"k", b"v", [], NOW), (None, b"v", [], NOW)])
    with pytest.raises(RecordsError) as caught:
        validate(bytearray(keyed + keyless), Config(cleanup_policy=frozenset({"compact"})))
    assert [i for i, _m in caught.value.record_errors] == [1]


def test_a_compacted_topic_takes_keyed_records():
    data = bytearray(build_batch([(b"k%d" % i, None, [], NOW) for i in range(5)]))
    assert validate(data, Config(cleanup_policy=frozenset({"compact", "delete"})))


def test_timestamps_out_of_range_are_listed_and_records_without_one_pass():
    config = Config(message_timestamp_before_max_ms=HOUR)
    ts = [NOW, -1, NOW + 2 * HOUR, NOW - 2 * HOUR, NOW - HOUR, NOW + HOUR]
    data = bytearray(build_batch([(b"k", b"v", [], t) for t in ts]))
    with pytest.raises(RecordsError) as caught:
        validate(data, config)
    exc = caught.value
    assert exc.error_name == ErrorCode.invalid_timestamp
    assert [i for i, _m in exc.record_errors] == [2, 3]
    assert exc.record_errors[0][1].startswith(f"Timestamp {NOW + 2 * HOUR} of message with "
                                              "offset 2 is out of range")


def test_an_old_record_behind_one_without_timestamp_is_found():
    """The batch's smallest timestamp is -1 there: the walk over the records still runs."""
    config = Config(message_timestamp_before_max_ms=HOUR)
    data = bytearray(build_batch([(b"k", b"v", [], -1), (b"k", b"v", [], NOW - 2 * HOUR)]))
    with pytest.raises(RecordsError) as caught:
        validate(data, config)
    assert [i for i, _m in caught.value.record_errors] == [1]
    ok = bytearray(build_batch([(b"k", b"v", [], -1), (b"k", b"v", [], NOW - 60_000)]))
    assert validate(ok, config)


def test_keyless_and_timestamp_errors_together_are_invalid_timestamp():
    config = Config(cleanup_policy=frozenset({"compact"}))
    data = bytearray(build_batch([(None, b"v", [], NOW), (b"k", b"v", [], NOW + 2 * HOUR)]))
    with pytest.raises(RecordsError) as caught:
        validate(data, config)
    assert caught.value.error_name == ErrorCode.invalid_timestamp
    assert [i for i, _m in caught.value.record_errors] == [0, 1]


def test_a_refused_batch_is_not_rewritten():
    data = with_max_timestamp(build_batch([(None, b"v", [], NOW)]), 0)
    before = bytes(data)
    with pytest.raises(RecordsError):
        validate(data, Config(cleanup_policy=frozenset({"compact"})))
    assert bytes(data) == before
    assert [r.key for r in decode_batch(data)[1]] == [None]
