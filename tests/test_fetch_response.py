"""The hand-written Fetch response encoder (protocol/fetch_response.py) against kio's, byte for
byte, for every version the broker answers, and a real client reading what it writes."""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.tiers import sample_and_sweep

from oncelog.protocol import (
    ApiKey,
    encode_response,
    encode_response_parts,
    make,
    response_module,
)
from oncelog.protocol.fetch_response import FetchResponseWriter
from oncelog.records.region import FileRegion

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
ERRORS = st.sampled_from([0, 1, 3, 6, 29, 74, 100])

partition = st.tuples(
    st.integers(0, 2**31 - 1), ERRORS, I64, I64, I64,
    st.lists(st.tuples(I64, I64), max_size=3),
    st.one_of(st.binary(max_size=40), st.binary(min_size=16 * 1024, max_size=16 * 1024 + 3)),
)
topic_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz._-", min_size=1, max_size=30)
topics = st.lists(st.tuples(topic_name, st.lists(partition, max_size=4)), max_size=4)


def kio_frame(version, session_id, error, read_committed, tops):
    mod = response_module(ApiKey.FETCH, version)
    by_id = version >= 13
    fields = {"error_code": error, "session_id": session_id} if version >= 7 else {}
    response = make(mod.FetchResponse, throttle_time=0, **fields, responses=tuple(
        make(mod.FetchableTopicResponse,
             **({"topic_id": key} if by_id else {"topic": key}),
             partitions=tuple(make(
                 mod.PartitionData, partition_index=index, error_code=err, high_watermark=hw,
                 last_stable_offset=lso, log_start_offset=start,
                 aborted_transactions=tuple(make(mod.AbortedTransaction, producer_id=p,
                                                 first_offset=f) for p, f in aborted)
                 if read_committed else None,
                 preferred_read_replica=-1, records=records)
                 for index, err, hw, lso, start, aborted, records in parts))
        for key, parts in tops), node_endpoints=())
    return encode_response(7, response)


def hand_frame(version, session_id, error, read_committed, tops):
    writer = FetchResponseWriter(version, 0, error, session_id, len(tops))
    for key, parts in tops:
        writer.topic(key, len(parts))
        for index, err, hw, lso, start, aborted, records in parts:
            writer.partition(index, err, hw, lso, start, aborted if read_committed else None,
                             records)
        writer.end_topic()
    return b"".join(p.read() if type(p) is FileRegion else p
                    for p in encode_response_parts(7, writer))


LARGE = b"x" * (16 * 1024 + 1)


@pytest.mark.parametrize("examples", sample_and_sweep(60, 300))
def test_every_version_writes_what_kio_writes(examples):
    """Versions 4 to 17 (the sweep: 300 responses; the unit tier's sample: 60, others each
    run), and two responses with record sets past the writer's inline size every run."""

    @settings(max_examples=examples, deadline=None)
    @example(version=16, session_id=1, error=0, read_committed=True,
             tops=[("a", [(0, 0, 5, 5, 0, [(1, 2)], LARGE), (1, 0, 5, 5, 0, [], b"ab")]),
                   ("bb", [(2, 0, 5, 5, 0, [], LARGE)])])
    @example(version=11, session_id=1, error=0, read_committed=False,
             tops=[("a", [(0, 0, 5, 5, 0, [], LARGE), (1, 0, 5, 5, 0, [], b"ab")])])
    @given(version=st.integers(4, 17), session_id=I32, error=ERRORS,
           read_committed=st.booleans(), tops=topics)
    def check(version, session_id, error, read_committed, tops):
        if version < 5:  # no log start offset in v4: kio does not write it either
            tops = [(k, [(i, e, hw, lso, -1, ab, r) for i, e, hw, lso, _s, ab, r in ps])
                    for k, ps in tops]
        if version >= 13:  # topics by id (KIP-516); the all-zero id is None to kio
            tops = [(uuid.UUID(int=hash(k) & (2**128 - 1)) if len(k) > 1 else None, ps)
                    for k, ps in tops]
        if version < 7:
            session_id, error = 0, 0
        assert hand_frame(version, session_id, error, read_committed, tops) == \
            kio_frame(version, session_id, error, read_committed, tops)

    check()


def test_record_sets_in_files_stay_parts_of_their_own(tmp_path):
    path = tmp_path / "segment"
    data = os.urandom(100_000)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        region = FileRegion(fd, 1000, 50_000)
        writer = FetchResponseWriter(16, 0, 0, 0, 1)
        writer.topic(uuid.uuid4(), 2)
        writer.partition(0, 0, 10, 10, 0, None, region)
        writer.partition(1, 0, 10, 10, 0, None, b"tiny")
        writer.end_topic()
        parts = writer.frame(1)
        assert parts.count(region) == 1  # not read into memory
        assert sum(len(p) for p in parts) - 4 == int.from_bytes(parts[0][:4], "big")
        joined = b"".join(p.read() if type(p) is FileRegion else p for p in parts)
        assert data[1000:51000] in joined and b"tiny" in joined
        region.close()
    finally:
        os.close(fd)
