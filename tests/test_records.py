"""The v2 record batch codec: round trips, and agreement with kafka-python's reader/writer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from support.tiers import sample_and_sweep

from oncelog.records import (
    CONTROL_COMMIT,
    Compression,
    CorruptRecordError,
    build_batch,
    build_control_batch,
    decode_batch,
    increment_sequence,
    iter_batches,
    parse_control_record,
    set_base_offset,
    set_log_append_time,
    split_batches,
    validate_batch,
)

maybe_bytes = st.one_of(st.none(), st.binary(max_size=200))
header = st.tuples(st.text(max_size=20), maybe_bytes)
record = st.tuples(maybe_bytes, maybe_bytes, st.lists(header, max_size=3),
                   st.integers(min_value=0, max_value=2**41))
records_st = st.lists(record, min_size=1, max_size=20)
codecs = st.sampled_from(list(Compression))


@settings(max_examples=150, deadline=None)
@given(records_st, codecs, st.integers(-1, 2**40), st.integers(-1, 32767),
       st.integers(-1, 2**31 - 1), st.booleans())
def test_round_trip_preserves_every_field(records, codec, pid, epoch, seq, txn):
    data = build_batch(records, base_offset=7, compression=codec, producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq, is_transactional=txn)
    header, decoded = decode_batch(data)
    assert header.compression == codec
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (pid, epoch, seq)
    assert header.is_transactional == txn and not header.is_control
    assert header.records_count == len(records) == header.last_offset_delta + 1
    assert header.max_timestamp == max(r[3] for r in records)
    for i, (r, d) in enumerate(zip(records, decoded)):
        assert d.offset == 7 + i
        assert (d.key, d.value, d.timestamp) == (r[0], r[1], r[3])
        assert d.headers == [(k, v) for k, v in r[2]]


@settings(max_examples=100, deadline=None)
@given(records_st, st.sampled_from([Compression.NONE, Compression.GZIP]))
def test_kafka_python_reads_our_batches(records, codec):
    data = build_batch(records, base_offset=100, compression=codec, producer_id=9,
                       producer_epoch=2, base_sequence=40)
    theirs = DefaultRecordBatch(bytearray(data))
    assert theirs.validate_crc()
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (9, 2, 40)
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs]
    want = [(100 + i, ts, k, v, [(hk, hv) for hk, hv in hs])
            for i, (k, v, hs, ts) in enumerate(records)]
    assert got == want


@settings(max_examples=100, deadline=None)
@given(records_st, st.sampled_from([0, 1]), st.booleans())
def test_we_read_kafka_pythons_batches(records, codec, txn):
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=txn,
                                        producer_id=5, producer_epoch=1, base_sequence=3,
                                        batch_size=2**30)
    for i, (k, v, hs, ts) in enumerate(records):
        assert builder.append(i, timestamp=ts, key=k, value=v,
                              headers=[(hk, hv) for hk, hv in hs]) is not None
    data = bytes(builder.build())
    header, decoded = decode_batch(data)
    assert header.is_transactional == txn
    assert header.base_sequence == 3 and header.last_sequence == 3 + len(records) - 1
    assert [(d.key, d.value, d.timestamp, d.headers) for d in decoded] == [
        (k, v, ts, [(hk, hv) for hk, hv in hs]) for k, v, hs, ts in records
    ]


def test_crc_detects_a_flipped_bit_anywhere_after_the_crc_field():
    data = bytearray(build_batch([(b"k", b"value", [], 1)]))
    for pos in range(21, len(data)):
        corrupt = bytearray(data)
        corrupt[pos] ^= 0x01
        with pytest.raises(CorruptRecordError):
            validate_batch(corrupt)


def test_base_offset_rewrite_keeps_the_crc_valid():
    data = bytearray(build_batch([(None, b"a", [], 1), (None, b"b", [], 2)]))
    set_base_offset(data, 0, 12345)
    header, records = decode_batch(data)
    assert header.base_offset == 12345 and [r.offset for r in records] == [12345, 12346]


def test_log_append_time_rewrites_timestamps_and_crc():
    data = bytearray(build_batch([(None, b"a", [], 1), (None, b"b", [], 2)]))
    set_log_append_time(data, 0, len(data), 999)
    header, records = decode_batch(data)
    assert header.timestamp_type == 1
    assert [r.timestamp for r in records] == [999, 999]


def test_record_count_must_match_last_offset_delta():
    data = bytearray(build_batch([(None, b"a", [], 1)]))
    data[57:61] = (2).to_bytes(4, "big")  # recordsCount lies
    from oncelog.records.batch import CRC_OFFSET, batch_crc

    data[CRC_OFFSET:CRC_OFFSET + 4] = batch_crc(data, 0, len(data)).to_bytes(4, "big")
    with pytest.raises(CorruptRecordError, match="record count"):
        validate_batch(data)


def test_truncated_and_trailing_batches():
    a = build_batch([(None, b"a", [], 1)])
    b = build_batch([(None, b"b", [], 1)], base_offset=1)
    assert [h.base_offset for _, h in iter_batches(a + b[:-3])] == [0]
    with pytest.raises(CorruptRecordError):
        split_batches(a + b[:-3])
    assert len(split_batches(a + b)) == 2


def test_control_batch():
    data = build_control_batch(CONTROL_COMMIT, producer_id=4, producer_epoch=1,
                               coordinator_epoch=7, timestamp=5)
    header, records = decode_batch(data)
    assert header.is_control and header.is_transactional
    assert parse_control_record(records[0]) == (CONTROL_COMMIT, 7)


def test_sequence_wraps_at_int32_max():
    assert increment_sequence(2**31 - 1, 1) == 0
    assert increment_sequence(2**31 - 2, 3) == 1
    data = build_batch([(None, b"a", [], 1), (None, b"b", [], 1)], producer_id=1,
                       producer_epoch=0, base_sequence=2**31 - 1)
    header, _ = decode_batch(data)
    assert header.last_sequence == 0


def test_snappy_reads_raw_and_xerial_framing():
    import cramjam

    from oncelog.records.compression import decompress

    payload = b"hello " * 1000
    raw = bytes(cramjam.snappy.compress_raw(payload))
    assert decompress(Compression.SNAPPY, raw) == payload
    from oncelog.records.compression import compress

    framed = compress(Compression.SNAPPY, payload)
    assert framed.startswith(b"\x82SNAPPY\x00")
    assert decompress(Compression.SNAPPY, framed) == payload


def test_corrupt_compressed_payload_is_a_clear_error():
    from oncelog.records.compression import CompressionError, decompress

    with pytest.raises(CompressionError, match="cannot decompress"):
        decompress(Compression.ZSTD, b"not zstd at all")


def test_error_classes_stub_is_current():
    """errors.pyi lets type checkers see the exception classes errors.py makes at import."""
    from pathlib import Path

    from oncelog import errors

    stub = Path(errors.__file__).with_suffix(".pyi").read_text()
    assert stub == errors.stub_text()
    assert errors.error_for_code(45).__name__ == "OutOfOrderSequenceNumberError"
    assert issubclass(errors.error_for_code(47), errors.FatalError)  # INVALID_PRODUCER_EPOCH
    assert issubclass(errors.error_for_code(6), errors.RetriableError)  # NOT_LEADER


@settings(max_examples=150, deadline=None)
@given(records_st, codecs)
def test_check_records_accepts_every_valid_batch_and_finds_its_timestamps(records, codec):
    from oncelog.records.batch import check_records, parse_header

    data = build_batch(records, compression=codec)
    ts = [r[3] for r in records]
    assert check_records(data, 0, parse_header(data)) == (min(ts), max(ts))


@settings(max_examples=150, deadline=None)
@given(records_st, st.integers(0, 2**16))
def test_check_records_refuses_every_truncation_or_extension_of_the_records(records, cut):
    """Any change to the payload's length (the CRC made right again) is refused: the records
    no longer fill the batch exactly."""
    import struct

    from oncelog.records.batch import (
        CRC_OFFSET,
        HEADER_SIZE,
        batch_crc,
        check_records,
        parse_header,
    )

    good = build_batch(records)
    body = good[HEADER_SIZE:]
    new_body = body[: cut % len(body)] if cut % 2 else body + bytes([cut % 256])
    out = bytearray(good[:HEADER_SIZE] + new_body)
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, CRC_OFFSET, batch_crc(out, 0, len(out)))
    with pytest.raises(CorruptRecordError):
        check_records(out, 0, parse_header(out))


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4,
                                   Compression.ZSTD])
def test_decompress_refuses_output_past_its_limit(codec):
    from oncelog.records.compression import CompressionError, compress, decompress

    payload = bytes(range(256)) * 400
    packed = compress(codec, payload)
    assert decompress(codec, packed, len(payload)) == payload
    with pytest.raises(CompressionError, match="limit"):
        decompress(codec, packed, len(payload) - 1)


def test_raw_snappy_is_refused_by_its_stated_length_before_inflating():
    import cramjam

    from oncelog.records.compression import CompressionError, decompress

    raw = bytes(cramjam.snappy.compress_raw(bytes(100_000)))
    assert decompress(Compression.SNAPPY, raw, 100_000) == bytes(100_000)
    with pytest.raises(CompressionError, match="limit"):
        decompress(Compression.SNAPPY, raw, 99_999)


def _walk_verdict(walk, data: bytes, count: int):
    from oncelog.records.batch import InvalidRecordError

    try:
        return walk(data, count)
    except (InvalidRecordError, CorruptRecordError):
        return "refused"


@st.composite
def record_payloads(draw):
    """The records of a valid batch, then maybe pushed out of shape: bytes flipped, cut,
    inserted, or varints at their extremes, and a record count that may be off."""
    from oncelog.records.batch import HEADER_SIZE

    records = draw(records_st)
    data = bytearray(build_batch(records)[HEADER_SIZE:])
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(["flip", "cut", "insert", "extreme"]))
        if how == "flip" and data:
            data[min(at, len(data) - 1)] ^= draw(st.integers(1, 255))
        elif how == "cut":
            del data[at:]
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        else:
            data[at:at + 2] = draw(st.sampled_from(
                [b"\xff" * 10 + b"\x01", b"\xff" * 11, b"\x01", b"\x03", b"\xfe\xff\xff\xff\x0f",
                 b"\x80" * 9 + b"\x01"]))
    count = len(records) + draw(st.sampled_from([0, 0, 0, -1, 1, -len(records) - 1]))
    return bytes(data), count


@pytest.mark.parametrize("examples", sample_and_sweep(250, 1500))
def test_the_c_record_walk_agrees_with_the_python_reference(examples):
    """records/_recordwalk.c (what the broker runs on every produced batch) against the Python
    walk it replaced: the same verdict and the same timestamps, on valid records and on
    records pushed out of shape. (The C walk also refuses varints past 64 bits, which the
    Python one decodes into numbers no record holds; none are drawn here.)"""
    from oncelog.records.batch import _scan_records, _scan_records_py

    @settings(max_examples=examples, deadline=None)
    @given(record_payloads())
    def check(payload):
        data, count = payload
        assert _walk_verdict(_scan_records, data, count) == \
            _walk_verdict(_scan_records_py, data, count)

    check()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(-2, 8))
def test_the_c_record_walk_agrees_on_random_bytes(data, count):
    from oncelog.records.batch import _scan_records, _scan_records_py

    assert _walk_verdict(_scan_records, data, count) == \
        _walk_verdict(_scan_records_py, data, count)
