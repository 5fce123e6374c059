"""The hand-written Produce response encoder (protocol/produce_response.py) against kio's,
byte for byte, for every version the broker answers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.tiers import sample_and_sweep

from oncelog.protocol import ApiKey, encode_response, encode_response_parts, make, response_module
from oncelog.protocol.produce_response import ProduceResponseWriter

I64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=20)
# kio keeps log_append_time as a datetime: -1 (none) or a time it can hold
APPEND_TIME = st.just(-1) | st.integers(0, 2**41)
partition = st.tuples(
    st.integers(0, 2**31 - 1), st.sampled_from([0, 2, 3, 10, 47, 87]), I64, APPEND_TIME, I64,
    st.lists(st.tuples(st.integers(0, 2**31 - 1), st.none() | text), max_size=3),
    st.none() | text,
)
topics = st.lists(st.tuples(st.text(alphabet="abc._-", min_size=1, max_size=20),
                            st.lists(partition, max_size=4)), max_size=4)


def kio_frame(version, tops):
    mod = response_module(ApiKey.PRODUCE, version)
    return encode_response(5, make(mod.ProduceResponse, throttle_time=0, responses=tuple(
        make(mod.TopicProduceResponse, name=name, partition_responses=tuple(
            make(mod.PartitionProduceResponse, index=i, error_code=e, base_offset=b,
                 log_append_time=t, log_start_offset=s,
                 record_errors=tuple(make(mod.BatchIndexAndErrorMessage, batch_index=bi,
                                          batch_index_error_message=m) for bi, m in errs),
                 error_message=msg)
            for i, e, b, t, s, errs, msg in parts))
        for name, parts in tops)))


@pytest.mark.parametrize("examples", sample_and_sweep(60, 300))
def test_every_version_writes_what_kio_writes(examples):
    """Versions 3 to 12 (the sweep: 300 responses; the unit tier's sample: 60, others each
    run)."""

    @settings(max_examples=examples, deadline=None)
    @given(version=st.integers(3, 12), tops=topics)
    def check(version, tops):
        if version < 8:  # no record errors nor message before KIP-467
            tops = [(n, [(i, e, b, t, s, [], None) for i, e, b, t, s, _x, _m in ps])
                    for n, ps in tops]
        if version < 5:  # no log start offset before v5
            tops = [(n, [(i, e, b, t, -1, x, m) for i, e, b, t, _s, x, m in ps])
                    for n, ps in tops]
        writer = ProduceResponseWriter(version, len(tops))
        for name, parts in tops:
            writer.topic(name, len(parts))
            for i, e, b, t, s, errs, msg in parts:
                writer.partition(i, e, b, t, s, errs, msg)
            writer.end_topic()
        assert b"".join(encode_response_parts(5, writer)) == kio_frame(version, tops)

    check()
