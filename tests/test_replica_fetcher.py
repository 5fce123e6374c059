"""The follower's Fetch on the wire (server/replica_fetcher.py): its requests byte for byte what
kio encodes for the same values, its parse of kio-encoded responses (record sets as views of the
received frame), malformed frames refused, and its connection reading frames in pieces, large
and small, from a real socket."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.tiers import sample_and_sweep

from oncelog.protocol import (
    ApiKey,
    ProtocolError,
    encode_request,
    encode_response,
    make,
    request_module,
    response_module,
)
from oncelog.server.interbroker import ChannelError
from oncelog.server.replica_fetcher import (
    FetchPartition,
    connect,
    encode_fetch_request,
    parse_fetch_response,
)

REQ = request_module(ApiKey.FETCH, 12)
RESP = response_module(ApiKey.FETCH, 12)

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                max_size=200)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
partitions = st.lists(st.builds(FetchPartition, int32, int32, int64, int64, int32), max_size=4)


@given(topics=st.lists(st.tuples(names, partitions), max_size=4), correlation_id=int32,
       replica_id=int32, max_wait=int32, min_bytes=int32, max_bytes=int32)
@settings(max_examples=200, deadline=None)
def test_the_request_is_what_kio_encodes(topics, correlation_id, replica_id, max_wait,
                                         min_bytes, max_bytes) -> None:
    ours = encode_fetch_request(correlation_id, "broker-2-fetcher", replica_id, max_wait,
                                min_bytes, max_bytes, topics)
    kio = make(REQ.FetchRequest, cluster_id=None, replica_id=replica_id, max_wait=max_wait,
               min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=0, session_id=0,
               session_epoch=-1, forgotten_topics_data=(), rack_id="", topics=tuple(
                   make(REQ.FetchTopic, topic=t, partitions=tuple(
                       make(REQ.FetchPartition, partition=p.partition,
                            current_leader_epoch=p.current_leader_epoch,
                            fetch_offset=p.fetch_offset, last_fetched_epoch=-1,
                            log_start_offset=p.log_start_offset,
                            partition_max_bytes=p.max_bytes) for p in ps))
                   for t, ps in topics))
    assert ours == encode_request(correlation_id, "broker-2-fetcher", kio)


partition_data = st.fixed_dictionaries({
    "partition_index": int32, "error_code": st.sampled_from([0, 1, 6, 74, 75]),
    "high_watermark": int64, "last_stable_offset": int64, "log_start_offset": int64,
    "aborted_transactions": st.none() | st.lists(st.tuples(int64, int64), max_size=3),
    "preferred_read_replica": int32,
    "records": st.none() | st.binary(max_size=600),
    # tagged fields a follower does not read, which it must skip
    "diverging_epoch": st.none() | st.tuples(int32, int64),
})


def response_frame(correlation_id, error_code, topics) -> bytes:
    def partition(d):
        extra = {}
        if d["diverging_epoch"] is not None:
            extra["diverging_epoch"] = make(RESP.EpochEndOffset, epoch=d["diverging_epoch"][0],
                                            end_offset=d["diverging_epoch"][1])
        aborted = d["aborted_transactions"]
        return make(RESP.PartitionData, partition_index=d["partition_index"],
                    error_code=d["error_code"], high_watermark=d["high_watermark"],
                    last_stable_offset=d["last_stable_offset"],
                    log_start_offset=d["log_start_offset"],
                    aborted_transactions=None if aborted is None else tuple(
                        make(RESP.AbortedTransaction, producer_id=a, first_offset=b)
                        for a, b in aborted),
                    preferred_read_replica=d["preferred_read_replica"], records=d["records"],
                    **extra)

    response = make(RESP.FetchResponse, throttle_time=3, error_code=error_code, session_id=0,
                    responses=tuple(make(RESP.FetchableTopicResponse, topic=t,
                                         partitions=tuple(partition(d) for d in ps))
                                    for t, ps in topics))
    return encode_response(correlation_id, response)[4:]  # without the size prefix


@pytest.mark.parametrize("examples", sample_and_sweep(50, 200))
def test_a_kio_encoded_response_parses_with_record_sets_as_views(examples) -> None:
    """The sweep: 200 responses; the unit tier's sample: 50, others each run."""

    @given(topics=st.lists(st.tuples(names, st.lists(partition_data, max_size=3)),
                           max_size=3),
           correlation_id=int32, error_code=st.sampled_from([0, 58]))
    @settings(max_examples=examples, deadline=None)
    def check(topics, correlation_id, error_code) -> None:
        frame = memoryview(response_frame(correlation_id, error_code, topics))
        got_id, got_error, got = parse_fetch_response(frame)
        assert (got_id, got_error) == (correlation_id, error_code)
        want = [(t, d) for t, ps in topics for d in ps]
        assert len(got) == len(want)
        for p, (topic, d) in zip(got, want, strict=True):
            assert (p.topic, p.partition, p.error_code, p.high_watermark,
                    p.log_start_offset) == \
                (topic, d["partition_index"], d["error_code"], d["high_watermark"],
                 d["log_start_offset"])
            if d["records"] is None:
                assert p.records is None
            else:
                assert isinstance(p.records, memoryview) and p.records.obj is frame.obj
                assert bytes(p.records) == d["records"]

    check()


def test_every_truncation_of_a_response_is_refused() -> None:
    frame = response_frame(7, 0, [("t", [{
        "partition_index": 0, "error_code": 0, "high_watermark": 300, "last_stable_offset": 300,
        "log_start_offset": 0, "aborted_transactions": [(5, 6)], "preferred_read_replica": -1,
        "records": b"r" * 300, "diverging_epoch": (1, 2)}])])
    parse_fetch_response(memoryview(frame))
    for n in range(len(frame)):
        with pytest.raises(ProtocolError):
            parse_fetch_response(memoryview(frame[:n]))


def test_a_records_length_past_the_frame_is_refused() -> None:
    frame = bytearray(response_frame(7, 0, [("t", [{
        "partition_index": 0, "error_code": 0, "high_watermark": 3, "last_stable_offset": 3,
        "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1,
        "records": b"r" * 10, "diverging_epoch": None}])]))
    at = bytes(frame).index(b"r" * 10) - 1
    assert frame[at] == 11  # compact length + 1
    frame[at] = 100
    with pytest.raises(ProtocolError):
        parse_fetch_response(memoryview(bytes(frame)))


async def serve(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def frame_of(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def test_the_connection_reads_frames_in_pieces_large_and_small() -> None:
    bodies = [b"\x00\x00\x00\x01" + b"a" * 10, b"\x00\x00\x00\x02" + bytes(range(256)) * 4000,
              b"\x00\x00\x00\x03" + b"c" * 100, b"\x00\x00\x00\x04" + b"d" * 70_000]

    async def main() -> None:
        async def handler(reader, writer):
            for body in bodies:
                request = await reader.readexactly(5)
                assert request == b"hello"
                data = frame_of(body)
                for i in range(0, len(data), 777):  # a trickle of writes
                    writer.write(data[i:i + 777])
                    await writer.drain()
            await reader.read()
            writer.close()

        server, port = await serve(handler)
        async with server:
            conn = await connect("127.0.0.1", port)
            try:
                for body in bodies:
                    got = await conn.request(b"hello", 10)
                    assert bytes(got) == body
                    assert got.readonly
            finally:
                conn.close()

    asyncio.run(main())


def test_a_silent_leader_times_the_request_out_and_a_closed_one_fails_it() -> None:
    async def main() -> None:
        async def silent(reader, writer):
            await reader.read()

        server, port = await serve(silent)
        async with server:
            conn = await connect("127.0.0.1", port)
            with pytest.raises(ChannelError, match="did not answer"):
                await conn.request(b"x", 0.2)
            assert conn.lost or conn.transport.is_closing()
            with pytest.raises(ChannelError):
                await conn.request(b"x", 0.2)

        async def half_frame(reader, writer):
            await reader.readexactly(1)
            writer.write(frame_of(b"\x00\x00\x00\x01" + b"z" * 100)[:50])
            await writer.drain()
            writer.close()

        server, port = await serve(half_frame)
        async with server:
            conn = await connect("127.0.0.1", port)
            with pytest.raises(ChannelError, match="closed"):
                await conn.request(b"x", 10)

    asyncio.run(main())


def test_bytes_nobody_asked_for_end_the_connection() -> None:
    async def main() -> None:
        async def chatty(reader, writer):
            await reader.readexactly(1)
            writer.write(frame_of(b"\x00\x00\x00\x01") + frame_of(b"\x00\x00\x00\x02"))
            await writer.drain()
            await reader.read()

        server, port = await serve(chatty)
        async with server:
            conn = await connect("127.0.0.1", port)
            try:  # both frames in one read: refused at once
                await conn.request(b"x", 10)
            except ChannelError as exc:
                assert "past the response" in str(exc)
            else:  # the second frame on its own: it closes the connection
                await asyncio.sleep(0.2)
                with pytest.raises(ChannelError):
                    await conn.request(b"x", 10)

    asyncio.run(main())
