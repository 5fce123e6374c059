"""Responses leave the broker as a list of parts (protocol.encode_response_parts): the record
sets of a Fetch response are written by reference, not copied into one buffer, and the parts
joined are exactly the frame encode_response gives."""

from __future__ import annotations

import os
import struct

from oncelog.protocol import (
    ApiKey,
    decode_response,
    encode_response,
    encode_response_parts,
    make,
    response_module,
)
from oncelog.records import build_batch


def _fetch_response(version: int, record_sets: list[bytes]):
    mod = response_module(ApiKey.FETCH, version)
    parts = tuple(
        make(mod.PartitionData, partition_index=i, error_code=0, high_watermark=10,
             last_stable_offset=10, log_start_offset=0, aborted_transactions=None,
             preferred_read_replica=-1, records=records)
        for i, records in enumerate(record_sets)
    )
    topic = make(mod.FetchableTopicResponse, topic="t", partitions=parts)
    return make(mod.FetchResponse, throttle_time=0, error_code=0, session_id=7,
                responses=(topic,))


def test_large_record_sets_are_kept_by_reference_and_the_frame_is_exact():
    big = [build_batch([(None, os.urandom(40_000), [], 1)]) for _ in range(2)]
    small = build_batch([(b"k", b"v", [], 1)])
    for version in (4, 11, 12):  # non-flexible and flexible (tagged fields, compact bytes)
        response = _fetch_response(version, [big[0], small, big[1]])
        parts = encode_response_parts(99, response)
        assert any(p is big[0] for p in parts) and any(p is big[1] for p in parts)
        frame = b"".join(parts)
        assert frame == encode_response(99, response)
        (size,) = struct.unpack_from(">i", frame)
        assert size == len(frame) - 4
        cid, decoded = decode_response(ApiKey.FETCH, version, frame[4:])
        assert cid == 99
        got = [p.records for p in decoded.responses[0].partitions]
        assert got == [big[0], small, big[1]]


def test_small_and_mutable_writes_are_copied():
    records = bytearray(build_batch([(None, b"x" * 50_000, [], 1)]))
    response = _fetch_response(12, [records])  # a bytearray may change later: copied
    parts = encode_response_parts(1, response)
    assert all(type(p) is bytes for p in parts) and not any(p is records for p in parts)
    records[-1] ^= 0xFF
    _, decoded = decode_response(ApiKey.FETCH, 12, b"".join(parts)[4:])
    assert decoded.responses[0].partitions[0].records != bytes(records)
