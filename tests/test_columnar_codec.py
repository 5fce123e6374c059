"""The compiled column codec (records/columnar.py, records/_columnar.c) against the Python
record codec of records/batch.py: encode from columns, decode into columns, the key
partitioner, and malformed input."""

from __future__ import annotations

from array import array

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.tiers import sample_and_sweep

from oncelog.client.producer.accumulator import ProducerBatch
from oncelog.client.producer.partitioner import partition_for_key
from oncelog.client.types import TopicPartition
from oncelog.records import Compression, CorruptRecordError, build_batch, decode_batch
from oncelog.records.batch import HEADER_SIZE, decode_record_set, encode_record
from oncelog.records.columnar import (
    RecordColumns,
    encode_records,
    encode_sections,
    group_rows,
    partition_for_keys,
)

maybe_bytes = st.one_of(st.none(), st.binary(max_size=300))
big = st.one_of(maybe_bytes, st.binary(min_size=5000, max_size=70000))
header = st.tuples(st.text(max_size=10), maybe_bytes)
headers_st = st.one_of(st.none(), st.lists(header, max_size=3))
rows_st = st.lists(st.tuples(maybe_bytes, maybe_bytes, headers_st,
                             st.integers(min_value=0, max_value=2**41)), max_size=40)
ARROW_TYPES = [pa.binary(), pa.large_binary()]


def python_section(rows) -> bytes:
    """records/batch.py's encoding of ``rows`` (key, value, headers, timestamp)."""
    if not rows:
        return b""
    base = rows[0][3]
    return b"".join(encode_record(i, ts - base, k, v, h or [])
                    for i, (k, v, h, ts) in enumerate(rows))


def as_arrow(column, kind, pad: int):
    """``column`` as an Arrow array of ``kind`` that is a slice (nonzero offset) of a longer
    one, with a validity bitmap when it has nulls."""
    padded = [b"pad"] * pad + list(column) + [None, b"tail"]
    return pa.array(padded, kind).slice(pad, len(column))


@pytest.mark.parametrize("examples", sample_and_sweep(50, 200))
def test_encode_equals_the_python_encoder(examples):
    """The sweep: 200 row sets; the unit tier's sample: 50, others each run."""

    @settings(max_examples=examples, deadline=None)
    @given(rows_st, st.sampled_from(["list", *range(len(ARROW_TYPES))]), st.integers(0, 9))
    def check(rows, form, pad):
        keys = [r[0] for r in rows]
        values = [r[1] for r in rows]
        if form != "list":
            keys = as_arrow(keys, ARROW_TYPES[form], pad)
            values = as_arrow(values, ARROW_TYPES[1 - form], pad + 1)
        got = encode_records(values, keys, timestamps=[r[3] for r in rows],
                             headers=[r[2] for r in rows])
        assert got == python_section(rows)

    check()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(maybe_bytes, st.text(max_size=20)), min_size=1, max_size=20),
       st.sampled_from([pa.string(), pa.large_string()]))
def test_string_columns_encode_as_utf8(rows, kind):
    keys = [r[0] for r in rows]
    texts = [r[1] for r in rows]
    as_bytes = [(k, t.encode(), None, 0) for k, t in rows]
    assert encode_records(texts, keys) == python_section(as_bytes)
    assert encode_records(pa.array(texts, kind), pa.array(keys)) == python_section(as_bytes)


@settings(max_examples=100, deadline=None)
@given(rows_st, st.data())
def test_indices_encode_a_subset_in_their_order(rows, data):
    order = data.draw(st.lists(st.integers(0, max(len(rows) - 1, 0)), max_size=30)) \
        if rows else []
    got = encode_records([r[1] for r in rows], [r[0] for r in rows],
                         timestamps=[r[3] for r in rows], headers=[r[2] for r in rows],
                         indices=array("i", order))
    assert got == python_section([rows[i] for i in order])


def test_indices_outside_the_rows_are_refused():
    with pytest.raises(ValueError, match="outside"):
        encode_records([b"a", b"b"], indices=[0, 2])
    with pytest.raises(ValueError, match="outside"):
        encode_records([b"a", b"b"], indices=[-1])


@pytest.mark.parametrize("examples", sample_and_sweep(25, 100))
def test_sections_split_at_max_bytes_as_kafka_batches_do(examples):
    """The sweep: 100 value lists; the unit tier's sample: 25, others each run. Values up to
    70,000 bytes are what this test is for: hypothesis's size health check is off."""

    @settings(max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.data_too_large])
    @given(st.lists(big, min_size=1, max_size=30), st.integers(100, 20000))
    def check(values, max_bytes):
        chunks, largest = encode_sections(values, default_timestamp=9, max_bytes=max_bytes)
        rows = [(None, v, None, 9) for v in values]
        sizes = [len(python_section([r])) for r in rows]
        assert largest == max(sizes)
        i = 0
        for section, count, base_ts, max_ts in chunks:
            assert (base_ts, max_ts) == (9, 9)
            assert section == python_section(rows[i : i + count])
            # full: the next record would not have fit; only a lone record may exceed
            # max_bytes
            assert count == 1 or len(section) <= max_bytes
            if i + count < len(rows):
                assert len(section) + sizes[i + count] > max_bytes
            i += count
        assert i == len(values)

    check()


def test_a_section_has_the_timestamp_range_of_its_records():
    chunks, _ = encode_sections([b"a", b"b", b"c"], timestamps=array("q", [50, 20, 90]))
    assert [c[1:] for c in chunks] == [(3, 50, 90)]
    # timestamp deltas are against the first record: one negative, as Kafka allows
    decoded = decode_record_set(chunks[0][0], 3, 0, 50)
    assert [r.timestamp for r in decoded] == [50, 20, 90]


def test_arrow_timestamps_and_one_timestamp_for_all():
    ts = pa.array([1000, 2000], pa.timestamp("ms"))
    assert encode_records([b"a", b"b"], timestamps=ts) == \
        encode_records([b"a", b"b"], timestamps=[1000, 2000])
    assert encode_records([b"a", b"b"], timestamps=7) == \
        python_section([(None, b"a", None, 7), (None, b"b", None, 7)])


def test_wrong_shapes_are_type_errors():
    with pytest.raises(TypeError):
        encode_records([1, 2])
    with pytest.raises(TypeError):
        encode_records(pa.array([1, 2]))
    with pytest.raises(ValueError, match="rows"):
        encode_records([b"a"], keys=[b"a", b"b"])
    with pytest.raises(TypeError):
        encode_records([b"a"], headers=[[(b"not str", b"v")]])


# --- decoding -------------------------------------------------------------------------------


def expected_columns(records):
    return {
        "offset": [r.offset for r in records],
        "timestamp": [r.timestamp for r in records],
        "key": [r.key for r in records],
        "value": [r.value for r in records],
        "headers": [[{"key": k, "value": v} for k, v in r.headers] or None for r in records],
    }


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(maybe_bytes, maybe_bytes, st.lists(header, max_size=3),
                                   st.integers(0, 2**41)), min_size=1, max_size=15),
                max_size=6),
       st.booleans())
def test_decode_appends_what_the_python_decoder_reads(batches, log_append):
    columns = RecordColumns("t", 3)
    expected = []
    offset = 1000
    for rows in batches:
        data = build_batch(rows, base_offset=offset)
        _, records = decode_batch(data)
        lat = 777 if log_append else None
        if lat is not None:
            for r in records:
                r.timestamp = lat
        expected += records
        section = memoryview(data)[HEADER_SIZE:]
        appended = columns.append_records(section, len(rows), offset, rows[0][3],
                                          log_append_time=lat, timestamp_type=int(log_append))
        assert appended == len(rows)
        offset += len(rows) + 3
    assert columns.count == len(expected)
    arrow = columns.to_arrow()
    for array_ in arrow.values():
        array_.validate(full=True)
    got = {name: arrow[name].to_pylist() for name in expected_columns([])}
    assert got == expected_columns(expected)
    assert arrow["timestamp_type"].to_pylist() == [int(log_append)] * len(expected)
    # the Python views ConsumerRecords are built from
    assert columns.keys() == [r.key for r in expected]
    assert columns.values() == [r.value for r in expected]
    assert columns.headers() == [r.headers for r in expected]
    assert columns.offsets().tolist() == [r.offset for r in expected]


def test_arrays_keep_their_rows_when_more_are_appended():
    rows = [(b"k", b"v" * 10, [], 5)] * 3
    section = memoryview(build_batch(rows))[HEADER_SIZE:]
    columns = RecordColumns()
    columns.append_records(section, 3, 0, 5)
    first = columns.to_arrow()
    for _ in range(200):  # forces the buffers to grow (and be copied away from the arrays)
        columns.append_records(section, 3, 10, 5)
    assert first["offset"].to_pylist() == [0, 1, 2]
    assert first["value"].to_pylist() == [b"v" * 10] * 3
    assert columns.count == 603
    assert columns.to_arrow()["offset"].to_pylist()[-3:] == [10, 11, 12]


def test_min_offset_skips_the_records_below_it():
    rows = [(None, bytes([i]), [("h", b"x")], 5) for i in range(5)]
    columns = RecordColumns()
    section = memoryview(build_batch(rows))[HEADER_SIZE:]
    assert columns.append_records(section, 5, 100, 5, min_offset=103) == 2
    assert columns.offsets().tolist() == [103, 104]
    assert columns.values() == [b"\x03", b"\x04"]
    assert columns.headers() == [[("h", b"x")], [("h", b"x")]]


def test_undecodable_header_keys_become_replacement_characters():
    # attributes, deltas, null key, value "v", one header: key b"\xffa", null value
    raw = bytes([0, 0, 0, 1, 2, ord("v"), 2, 4, 0xFF, ord("a"), 1])
    data = bytes([len(raw) * 2]) + raw
    columns = RecordColumns()
    columns.append_records(data, 1, 0, 0)
    expected = decode_record_set(data, 1, 0, 0)[0].headers
    assert columns.headers() == [expected]
    assert columns.to_arrow()["headers"].to_pylist() == [[{"key": "\ufffda", "value": None}]]


def _valid_section():
    rows = [(b"key", b"value" * 3, [("h", b"v"), ("n", None)], 10), (None, None, [], 11),
            (b"", b"x" * 200, [], 12)]
    return memoryview(build_batch(rows))[HEADER_SIZE:].tobytes(), len(rows)


def _python_refuses(data: bytes, count: int) -> bool:
    try:
        decode_record_set(data, count, 0, 0)
    except (CorruptRecordError, IndexError, ValueError):
        return True
    return False


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_corrupt_or_truncated_sections_are_refused_cleanly(data):
    section, count = _valid_section()
    kind = data.draw(st.sampled_from(["truncate", "flip", "count", "splice"]))
    if kind == "truncate":
        section = section[: data.draw(st.integers(0, len(section) - 1))]
    elif kind == "flip":
        i = data.draw(st.integers(0, len(section) - 1))
        section = section[:i] + bytes([data.draw(st.integers(0, 255))]) + section[i + 1 :]
    elif kind == "count":
        count = data.draw(st.one_of(st.integers(-5, 10), st.integers(2**20, 2**31 - 1)))
    else:
        i = data.draw(st.integers(0, len(section)))
        section = section[:i] + data.draw(st.binary(min_size=1, max_size=12)) + section[i:]
    columns = RecordColumns()
    columns.append_records(_valid_section()[0], 3, 0, 0)
    before = {k: v.to_pylist() for k, v in columns.to_arrow().items()}
    try:
        columns.append_records(section, count, 50, 0)
    except CorruptRecordError:
        # nothing of a refused section is kept
        assert {k: v.to_pylist() for k, v in columns.to_arrow().items()} == before
        # the Python decoder refuses it too (it decodes the same bytes to the same records
        # otherwise: the last assertion)
        assert _python_refuses(section, count)
        return
    assert not _python_refuses(section, count)
    records = decode_record_set(section, count, 50, 0)
    arrow = columns.to_arrow()
    assert arrow["value"].to_pylist()[3:] == [r.value for r in records]
    assert arrow["key"].to_pylist()[3:] == [r.key for r in records]


@pytest.mark.parametrize("count", [2**31 - 1, 10**9])
def test_a_lying_record_count_is_refused_before_anything_is_sized_by_it(count):
    with pytest.raises(CorruptRecordError, match="cannot fit"):
        RecordColumns().append_records(b"\x00" * 20, count, 0, 0)


def test_a_lying_header_count_is_refused():
    body = bytes([0, 0, 0, 1, 1]) + b"\xfe\xff\xff\xff\x0f"  # 2**31-1 headers claimed
    data = bytes([len(body) * 2]) + body
    with pytest.raises(CorruptRecordError):
        RecordColumns().append_records(data, 1, 0, 0)


# --- partitioning ---------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(maybe_bytes, max_size=50), st.integers(1, 1000), st.booleans())
def test_key_partitions_are_the_default_partitioners(keys, n, arrow):
    column = pa.array(keys, pa.binary()) if arrow else keys
    got = array("i", partition_for_keys(column, n)).tolist()
    assert got == [-1 if k is None else partition_for_key(k, n) for k in keys]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-1, 6), max_size=60))
def test_group_rows_is_a_stable_sort_by_partition(parts):
    rows, starts = group_rows(array("i", parts).tobytes(), 7, null_partition=2)
    rows_ = array("i", rows).tolist()
    resolved = [2 if p == -1 else p for p in parts]
    assert rows_ == sorted(range(len(parts)), key=lambda i: resolved[i])
    for p in range(7):
        assert all(resolved[i] == p for i in rows_[starts[p] : starts[p + 1]])


def test_group_rows_names_a_partition_out_of_range():
    with pytest.raises(ValueError, match="row 1: partition 7"):
        group_rows(array("i", [0, 7]).tobytes(), 7)
    with pytest.raises(ValueError, match="partition -1"):
        group_rows(array("i", [-1]).tobytes(), 7)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(maybe_bytes, maybe_bytes, st.lists(header, max_size=3),
                          st.integers(0, 2**41)), min_size=1, max_size=30),
       st.sampled_from(list(Compression)), st.booleans())
def test_the_producers_batches_are_build_batchs(rows, codec, transactional):
    batch = ProducerBatch(TopicPartition("t", 0), 0.0)
    for key, value, headers, ts in rows:
        assert batch.try_append(key, value, headers, ts, 1, 2**30) is not None
    batch.set_producer_state(5, 1, 100, transactional)
    expected = build_batch(rows, producer_id=5, producer_epoch=1, base_sequence=100,
                           is_transactional=transactional, compression=codec)
    if codec == Compression.NONE:
        assert batch.encode(codec) == expected
    else:  # compressors need not be deterministic across calls: compare what they hold
        assert decode_batch(batch.encode(codec)) == decode_batch(expected)


HEADERS_TYPES = [pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
                 pa.large_list(pa.struct([("value", pa.large_binary()),
                                          ("key", pa.large_string())]))]


@settings(max_examples=150, deadline=None)
@given(rows_st, st.sampled_from(HEADERS_TYPES), st.integers(0, 5))
def test_arrow_headers_encode_as_the_list_form(rows, kind, pad):
    """Spark's Kafka headers column (list<struct<key, value>>), sliced, with null rows and
    null values, in either field order and offset width."""
    as_dicts = [None if h is None else [{"key": k, "value": v} for k, v in h]
                for _, _, h, _ in rows]
    padded = [[{"key": "pad", "value": b"p"}]] * pad + as_dicts + [[{"key": "z", "value": None}]]
    column = pa.array(padded, kind).slice(pad, len(rows))
    values = [r[1] for r in rows]
    timestamps = [r[3] for r in rows]
    assert encode_records(values, headers=column, timestamps=timestamps) == \
        encode_records(values, headers=[r[2] for r in rows], timestamps=timestamps)


def test_arrow_headers_must_have_keys():
    column = pa.array([[{"key": None, "value": b"v"}]],
                      pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    with pytest.raises(ValueError, match="header key is null"):
        encode_records([b"v"], headers=column)
    with pytest.raises(TypeError):
        encode_records([b"v"], headers=pa.array([[1]]))


def test_a_null_headers_row_has_none_whatever_its_offsets_span():
    entries = pa.array([{"key": "a", "value": b"1"}, {"key": "b", "value": b"2"}],
                       pa.struct([("key", pa.string()), ("value", pa.binary())]))
    column = pa.ListArray.from_arrays(pa.array([0, 1, 2], pa.int32()), entries,
                                      mask=pa.array([True, False]))
    assert column.to_pylist() == [None, [{"key": "b", "value": b"2"}]]
    assert encode_records([b"x", b"y"], headers=column) == \
        encode_records([b"x", b"y"], headers=[None, [("b", b"2")]])
