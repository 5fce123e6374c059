"""The sans-IO framing and correlation class (protocol/framing.py), and the inter-broker channel
that uses it against a real broker."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.tiers import sample_and_sweep

from oncelog.harness.relay import Relay
from oncelog.loop_thread import new_event_loop
from oncelog.protocol import ApiKey, make, request_class
from oncelog.protocol.framing import (
    NEED_DATA,
    ClientFraming,
    CorrelationError,
    FrameSizeError,
    Framing,
)
from oncelog.server.embedded import EmbeddedBroker
from oncelog.server.interbroker import BrokerChannel, ChannelError

_SIZE = struct.Struct(">i")


def frame(body: bytes) -> bytes:
    return _SIZE.pack(len(body)) + body


def test_frames_come_out_whole_however_the_bytes_arrive():
    stream = frame(b"one") + frame(b"") + frame(b"three" * 1000)
    for step in (1, 3, 4, 7, len(stream)):
        f = Framing()
        out = []
        for i in range(0, len(stream), step):
            f.receive_data(stream[i:i + step])
            while (event := f.next_event()) is not NEED_DATA:
                out.append(event)
        assert out == [b"one", b"", b"three" * 1000]
        assert f.buffered == 0


@pytest.mark.parametrize("examples", sample_and_sweep(40, 150))
def test_any_chunking_of_any_frames_gives_them_back_in_order_and_whole(examples):
    """Small reads go to the tail buffer, large ones are kept as chunks, frames span both;
    callers may hand in a reusable buffer (bytearray, memoryview): frames are always bytes.
    The sweep: 150 streams; the unit tier's sample: 40, others each run."""

    @given(bodies=st.lists(st.binary(max_size=300) | st.sampled_from([b"x" * 70_000, b""]),
                           max_size=12),
           cuts=st.lists(st.integers(1, 90_000), max_size=40),
           kinds=st.lists(st.sampled_from([bytes, bytearray, memoryview]), min_size=1,
                          max_size=5))
    @settings(max_examples=examples, deadline=None)
    def check(bodies, cuts, kinds):
        stream = b"".join(frame(b) for b in bodies)
        f = Framing()
        out, pos, i = [], 0, 0
        while pos < len(stream):
            step = cuts[i % len(cuts)] if cuts else len(stream)
            piece = stream[pos:pos + step]
            f.receive_data(kinds[i % len(kinds)](piece))
            pos += len(piece)
            i += 1
            while (event := f.next_event()) is not NEED_DATA:
                assert type(event) is bytes
                out.append(event)
            assert f.buffered == pos - sum(4 + len(b) for b in out)
        assert out == bodies
        assert f.buffered == 0

    check()


def test_a_frame_trickled_a_byte_at_a_time_is_held_compactly():
    # One object per received byte would let a slow client make the broker hold ~50 times the
    # frame's size; the tail buffer keeps it near the size itself.
    body = bytes(range(256)) * 2000
    stream = frame(body)
    f = Framing()
    for i in range(len(stream) - 1):
        f.receive_data(stream[i:i + 1])
        assert f.next_event() is NEED_DATA
    assert len(f._chunks) < 20
    f.receive_data(stream[-1:])
    assert f.next_event() == body


def test_a_size_out_of_bounds_is_refused_before_the_body_arrives():
    f = Framing(max_frame_size=10)
    f.receive_data(_SIZE.pack(11))
    with pytest.raises(FrameSizeError) as refused:
        f.next_event()
    assert (refused.value.size, refused.value.max_size) == (11, 10)
    f = Framing()
    f.receive_data(_SIZE.pack(-1))
    with pytest.raises(FrameSizeError):
        f.next_event()
    f = Framing(max_frame_size=10)
    f.receive_data(_SIZE.pack(10) + b"x" * 3)
    assert f.next_event() is NEED_DATA
    assert f.buffered == 7
    assert Framing.send(b"abc") == frame(b"abc")


def _api_versions_request():
    return make(request_class(ApiKey.API_VERSIONS, 0))


def test_responses_are_matched_to_the_oldest_request_in_flight():
    c: ClientFraming[str] = ClientFraming("me", first_correlation_id=5)
    ids = [c.new_correlation_id() for _ in range(3)]
    assert ids == [5, 6, 7]
    for cid, name in zip(ids, "abc", strict=True):
        data = c.send(cid, _api_versions_request(), name)
        assert _SIZE.unpack_from(data, 8)[0] == cid  # size, api key, version, correlation id
    c.receive_data(frame(_SIZE.pack(5) + b"A") + frame(_SIZE.pack(6))[:5])
    assert c.next_event() == ("a", _SIZE.pack(5) + b"A")
    assert c.next_event() is NEED_DATA
    c.receive_data(frame(_SIZE.pack(6))[5:] + frame(_SIZE.pack(8)))
    assert c.next_event() == ("b", _SIZE.pack(6))
    with pytest.raises(CorrelationError) as mismatch:
        c.next_event()
    assert (mismatch.value.received, mismatch.value.expected) == (8, 7)
    assert c.clear() == ["c"]
    c.receive_data(frame(_SIZE.pack(9)))
    with pytest.raises(CorrelationError) as unexpected:
        c.next_event()
    assert unexpected.value.expected is None


def test_no_response_expected_leaves_nothing_in_flight_and_ids_wrap():
    c: ClientFraming[None] = ClientFraming(None, first_correlation_id=0x7FFFFFFF)
    assert [c.new_correlation_id(), c.new_correlation_id()] == [0x7FFFFFFF, 0]
    c.send(3, _api_versions_request(), None, expect_response=False)
    assert not c.in_flight
    c.expect(4, None)
    assert len(c.in_flight) == 1


def test_the_inter_broker_channel_pipelines_and_fails_cleanly():
    with EmbeddedBroker() as broker:
        async def run():
            channel = BrokerChannel(1, "127.0.0.1", broker.port, "test")
            versions = request_class(ApiKey.API_VERSIONS, 3)
            requests = [make(versions, client_software_name="t", client_software_version="1")
                        for _ in range(20)]
            answers = await asyncio.gather(*(channel.request(r) for r in requests))
            assert all(int(a.error_code) == 0 and a.api_keys for a in answers)
            # A caller that gives up leaves its request in flight: the next answers still match.
            task = asyncio.ensure_future(channel.request(requests[0]))
            await asyncio.sleep(0)
            task.cancel()
            answer = await channel.request(requests[1])
            assert int(answer.error_code) == 0
            channel.close()
            with pytest.raises(ChannelError):
                await channel.request(requests[0])

        asyncio.run(run())


def test_the_inter_broker_channel_reconnects_after_a_cut():
    """A relay that is cut accepts connections and closes them at once: a connection can be
    lost before the channel holds it. Each request fails with ChannelError while the cut lasts
    and the first one after the heal is answered (on uvloop, as the broker runs: a write to a
    closed transport raises RuntimeError there; the replica fetcher once stayed on such a
    connection for good, so the followers never rejoined the ISR after the cut fault)."""
    with EmbeddedBroker() as broker, Relay("127.0.0.1", 0, "127.0.0.1", broker.port) as relay:
        versions = request_class(ApiKey.API_VERSIONS, 3)
        request = make(versions, client_software_name="t", client_software_version="1")

        async def run():
            channel = BrokerChannel(1, "127.0.0.1", relay.port, "test", connect_timeout_s=2)
            assert int((await channel.request(request, 5)).error_code) == 0
            relay.cut()
            for _ in range(20):
                with pytest.raises(ChannelError):
                    await channel.request(request, 2)
            relay.heal()
            assert int((await channel.request(request, 5)).error_code) == 0
            channel.close()

        loop = new_event_loop()
        try:
            loop.run_until_complete(run())
        finally:
            loop.close()
