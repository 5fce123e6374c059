"""The Fetch response the consumer reads by hand (protocol/fetch_reader.py) says what kio reads
from the same bytes, in every version the client asks for; its record sets are views of the
frame; a truncated or lying response is a ProtocolError, never another exception."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.client.messages import build
from oncelog.protocol import (
    ApiKey,
    ProtocolError,
    decode_response,
    encode_response,
    response_class,
)
from oncelog.protocol.apis import SUPPORTED_VERSIONS
from oncelog.protocol.fetch_reader import MAX_VERSION, MIN_VERSION, decode_fetch_response
from oncelog.records import build_batch

BATCH = build_batch([(b"k", b"v" * 300, [("h", b"1")], 1000)] * 2)
IDS = [uuid.UUID(int=7), uuid.UUID(int=2**127 + 5)]


def kio_frame(version: int, correlation_id: int, topics: list, *, error: int = 0,
              session: int = 0, tagged: bool = False) -> bytes:
    """A Fetch response frame (no size prefix) as kio writes it."""
    by_id = version >= 13
    responses = []
    for i, (name, partitions) in enumerate(topics):
        parts = []
        for index, code, hw, lso, aborted, records in partitions:
            part = {"partition_index": index, "error_code": code, "high_watermark": hw,
                    "last_stable_offset": lso, "log_start_offset": 3,
                    "aborted_transactions": None if aborted is None else [
                        {"producer_id": pid, "first_offset": first} for first, pid in aborted],
                    "preferred_read_replica": -1, "records": records}
            if tagged:  # tagged fields the reader must skip
                part["diverging_epoch"] = {"epoch": 3, "end_offset": 40}
                part["current_leader"] = {"leader_id": 1, "leader_epoch": 9}
            parts.append(part)
        responses.append({"topic": name, "topic_id": IDS[i % 2], "partitions": parts}
                         if by_id else {"topic": name, "partitions": parts})
    values = {"throttle_time": 5, "error_code": error, "session_id": session,
              "responses": responses}
    if tagged and version >= 16:
        values["node_endpoints"] = [{"node_id": 1, "host": "h\u00e9", "port": 9, "rack": None}]
    response = build(response_class(ApiKey.FETCH, version), values)
    return encode_response(correlation_id, response)[4:]


def same(version: int, frame: bytes) -> None:
    kio_cid, theirs = decode_response(ApiKey.FETCH, version, frame)
    cid, ours = decode_fetch_response(version, frame)
    assert cid == kio_cid
    assert ours.error_code == int(getattr(theirs, "error_code", 0))
    assert ours.session_id == int(getattr(theirs, "session_id", 0))
    assert len(ours.responses) == len(theirs.responses)
    for t_ours, t_kio in zip(ours.responses, theirs.responses, strict=True):
        assert t_ours.topic == getattr(t_kio, "topic", None)
        assert t_ours.topic_id == getattr(t_kio, "topic_id", None)
        for p_ours, p_kio in zip(t_ours.partitions, t_kio.partitions, strict=True):
            assert p_ours.partition_index == p_kio.partition_index
            assert p_ours.error_code == int(p_kio.error_code)
            assert p_ours.high_watermark == p_kio.high_watermark
            assert p_ours.last_stable_offset == p_kio.last_stable_offset
            assert p_ours.log_start_offset == getattr(p_kio, "log_start_offset", -1)
            kio_aborted = None if p_kio.aborted_transactions is None else [
                (a.first_offset, a.producer_id) for a in p_kio.aborted_transactions]
            assert p_ours.aborted_transactions == kio_aborted
            if p_kio.records is None:
                assert p_ours.records is None
            else:
                assert isinstance(p_ours.records, memoryview)
                assert p_ours.records.obj is frame or p_ours.records.obj is getattr(
                    frame, "obj", None)  # a view of the frame, not a copy
                assert bytes(p_ours.records) == p_kio.records


def test_the_hand_read_versions_are_the_ones_the_client_asks_for():
    assert SUPPORTED_VERSIONS[ApiKey.FETCH] == (MIN_VERSION, MAX_VERSION)


@pytest.mark.parametrize("version", range(MIN_VERSION, MAX_VERSION + 1))
@pytest.mark.parametrize("tagged", [False, True])
def test_fetch_response_reads_as_kio_reads_it(version, tagged):
    topics = [("t\u00fcpic", [(0, 0, 100, 90, None, BATCH), (3, 1, -1, -1, None, None)]),
              ("x" * 200, [(1, 0, 5, 5, [(2, 77), (40, 2**40)], BATCH + BATCH),
                           (2, 0, 0, 0, [], b"")]),
              ("empty", [])]
    frame = kio_frame(version, 4242, topics, error=0, session=99, tagged=tagged)
    same(version, frame)
    same(version, memoryview(bytearray(frame)).toreadonly())  # as FrameReader hands it on
    same(version, kio_frame(version, 1, [], error=16, session=0, tagged=tagged))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(MIN_VERSION, MAX_VERSION + 1)), st.data())
def test_a_damaged_response_is_a_protocol_error(version, data):
    frame = bytearray(kio_frame(version, 3, [("t", [(0, 0, 9, 9, [(1, 2)], BATCH)])],
                                tagged=True))
    if data.draw(st.booleans()):
        frame = frame[: data.draw(st.integers(0, len(frame) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    try:
        decode_fetch_response(version, bytes(frame))
    except ProtocolError:
        pass
