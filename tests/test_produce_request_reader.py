"""The hand-written Produce request reader (protocol/produce_request.py) against kio's reading,
for every version the broker answers, and against truncated and lying frames."""

from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol import (
    ApiKey,
    ProtocolError,
    decode_request_body,
    encode_request,
    make,
    parse_request_header,
    request_module,
)
from oncelog.protocol.produce_request import ProduceRequestError, read_produce_request

partition = st.tuples(st.integers(-(2**31), 2**31 - 1), st.none() | st.binary(max_size=300))
topics = st.lists(st.tuples(st.text(min_size=1, max_size=20), st.lists(partition, max_size=3)),
                  max_size=3)


def frame_of(version, txn_id, acks, timeout_ms, tops):
    mod = request_module(ApiKey.PRODUCE, version)
    request = make(mod.ProduceRequest, transactional_id=txn_id, acks=acks,
                   timeout=dt.timedelta(milliseconds=timeout_ms), topic_data=tuple(
                       make(mod.TopicProduceData, name=name, partition_data=tuple(
                           make(mod.PartitionProduceData, index=i, records=r) for i, r in parts))
                       for name, parts in tops))
    return encode_request(9, "client", request)[4:]  # without the size prefix


@settings(max_examples=300, deadline=None)
@given(version=st.integers(3, 12), txn_id=st.none() | st.text(min_size=1, max_size=10),
       acks=st.sampled_from([-1, 0, 1, 7]), timeout_ms=st.integers(0, 2**31 - 1), tops=topics)
def test_every_version_reads_what_kio_reads(version, txn_id, acks, timeout_ms, tops):
    frame = frame_of(version, txn_id, acks, timeout_ms, tops)
    header = parse_request_header(frame)
    ours = decode_request_body(header, frame)  # the broker's entry: the hand reader
    assert type(ours).__module__ == "oncelog.protocol.produce_request"
    assert (ours.transactional_id, ours.acks, ours.timeout) == \
        (txn_id, acks, dt.timedelta(milliseconds=timeout_ms))
    assert [(t.name, [(p.index, None if p.records is None else bytes(p.records))
                      for p in t.partition_data]) for t in ours.topic_data] == tops
    for t in ours.topic_data:
        for p in t.partition_data:
            assert p.records is None or p.records.readonly  # a view of the frame


@settings(max_examples=100, deadline=None)
@given(version=st.integers(3, 12), tops=topics.filter(bool), cut=st.integers(1, 400))
def test_a_truncated_request_is_refused_not_misread(version, tops, cut):
    frame = frame_of(version, "t", -1, 1000, tops)
    header = parse_request_header(frame)
    short = frame[:max(header.body_offset, len(frame) - cut)]
    try:
        read_produce_request(version, short, header.body_offset)
    except ProduceRequestError:
        return
    # A cut that only lost trailing tagged fields' absence cannot be read as a request.
    raise AssertionError(f"{len(frame) - len(short)} bytes short, read anyway")


def test_counts_and_lengths_the_frame_cannot_hold_are_refused():
    frame = bytearray(frame_of(12, None, -1, 1000, [("t", [(0, b"x" * 10)])]))
    header = parse_request_header(bytes(frame))
    body = header.body_offset
    # transactional_id null (0), acks, timeout, then the topic count: claim 2^28 topics
    lying = bytes(frame[:body + 7]) + b"\x80\x80\x80\x80\x01" + bytes(frame[body + 8:])
    try:
        decode_request_body(header, lying)
    except ProtocolError as exc:
        assert "topic_data" in str(exc)
    else:
        raise AssertionError("a count of 2^28 topics was trusted")
