"""One broker connection: version negotiation, pipelining, timeouts, clean errors."""

from __future__ import annotations

import os
import select
import socket
import struct

import pytest
from support.fake_broker import CLOSE

from oncelog.client.connection import BrokerConnection
from oncelog.client.metadata import metadata_request
from oncelog.errors import NetworkError, RequestTimedOutError, UnsupportedVersionError
from oncelog.protocol import ApiKey
from oncelog.protocol.apis import SUPPORTED_VERSIONS


def connect(broker, request_timeout_ms=5000) -> BrokerConnection:
    conn = BrokerConnection(-1, "127.0.0.1", broker.port, client_id="test",
                            request_timeout_ms=request_timeout_ms, connect_timeout_ms=5000)
    conn.connect()
    return conn


def test_api_versions_picks_the_highest_version_both_sides_support(fake_broker):
    broker = fake_broker()
    conn = connect(broker)
    assert broker.requests[0] == (ApiKey.API_VERSIONS, SUPPORTED_VERSIONS[ApiKey.API_VERSIONS][1])
    assert conn.version_for(ApiKey.METADATA) == SUPPORTED_VERSIONS[ApiKey.METADATA][1]
    conn.api_versions[ApiKey.METADATA] = (0, 4)  # an older broker
    assert conn.version_for(ApiKey.METADATA) == 4
    conn.api_versions[ApiKey.PRODUCE] = (0, 2)  # nothing in common with our 3..11
    with pytest.raises(UnsupportedVersionError):
        conn.version_for(ApiKey.PRODUCE)
    del conn.api_versions[ApiKey.FETCH]
    with pytest.raises(UnsupportedVersionError):
        conn.version_for(ApiKey.FETCH)


def test_api_versions_falls_back_to_the_version_the_broker_names(fake_broker):
    broker = fake_broker(api_versions_max=2)
    conn = connect(broker)
    ours = SUPPORTED_VERSIONS[ApiKey.API_VERSIONS][1]
    assert broker.requests[:2] == [(ApiKey.API_VERSIONS, ours), (ApiKey.API_VERSIONS, 2)]
    assert conn.version_for(ApiKey.API_VERSIONS) == 2


def test_api_versions_falls_back_to_v0_on_an_unreadable_rejection(fake_broker):
    broker = fake_broker()

    def reject_all_but_v0(conn, header, request):
        if header.api_version == 0:
            return broker._api_versions(conn, header, request)
        # what librdkafka's mock cluster sends: error 35 and a body that is not valid v0
        return header.correlation_id.to_bytes(4, "big") + bytes.fromhex("002301001200000002")

    broker.handlers[ApiKey.API_VERSIONS] = reject_all_but_v0
    conn = connect(broker)
    assert [v for k, v in broker.requests] == [SUPPORTED_VERSIONS[ApiKey.API_VERSIONS][1], 0]
    assert conn.version_for(ApiKey.METADATA) == SUPPORTED_VERSIONS[ApiKey.METADATA][1]


def test_several_requests_in_flight_are_answered_in_order(fake_broker):
    broker = fake_broker({"a": 1, "b": 2, "c": 3})
    conn = connect(broker)
    reqs = [conn.send(ApiKey.METADATA, metadata_request([name])) for name in "abc"]
    assert conn.in_flight_count == 3
    responses = [conn.wait(r) for r in reversed(reqs)]  # waiting for the last reads all three
    assert [r.topics[0].name for r in reversed(responses)] == ["a", "b", "c"]
    assert [len(r.topics[0].partitions) for r in reversed(responses)] == [1, 2, 3]
    assert conn.in_flight_count == 0


def test_a_response_with_the_wrong_correlation_id_closes_the_connection(fake_broker):
    broker = fake_broker()
    conn = connect(broker)
    broker.correlation_skew = 7
    req = conn.send(ApiKey.METADATA, metadata_request(["t"]))
    with pytest.raises(NetworkError, match="correlation id"):
        conn.wait(req)
    assert not conn.connected


def test_disconnect_fails_every_request_in_flight(fake_broker):
    broker = fake_broker()
    conn = connect(broker)
    broker.handlers[ApiKey.METADATA] = lambda c, h, r: CLOSE
    first = conn.send(ApiKey.METADATA, metadata_request(["t"]))
    second = conn.send(ApiKey.METADATA, metadata_request(["t"]))
    with pytest.raises(NetworkError):
        conn.wait(second)
    assert isinstance(first.error, NetworkError)
    assert not conn.connected
    with pytest.raises(NetworkError, match="not connected"):
        conn.send(ApiKey.METADATA, metadata_request(["t"]))


def test_an_unanswered_request_times_out(fake_broker):
    broker = fake_broker()
    conn = connect(broker, request_timeout_ms=200)
    broker.handlers[ApiKey.METADATA] = lambda c, h, r: None  # never answer
    req = conn.send(ApiKey.METADATA, metadata_request(["t"]))
    with pytest.raises(RequestTimedOutError, match="no response to METADATA"):
        conn.wait(req)
    assert not conn.connected


def test_connecting_to_a_closed_port_is_a_network_error(fake_broker):
    broker = fake_broker()
    broker.close()
    with pytest.raises(NetworkError, match="cannot connect"):
        connect(broker)


def test_a_connection_reset_before_the_handshake_is_a_network_error(monkeypatch):
    """The broker resets the connection before our ApiVersions goes out (a broker SIGKILLed as
    the producer reconnects): the write fails, and connect() must say so with a network error,
    which the sender retries, not an AssertionError that ended the producer's sender thread
    (seen in the cluster test that kills a leader under an acks=all stream)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # linger 0: an RST
        select.select([client], [], [], 5)  # the RST has arrived
        monkeypatch.setattr(socket, "create_connection", lambda *a, **kw: client)
        conn = BrokerConnection(-1, "127.0.0.1", server.getsockname()[1], client_id="test",
                                request_timeout_ms=5000, connect_timeout_ms=5000)
        with pytest.raises(NetworkError, match="send failed"):
            conn.connect()
        assert not conn.connected


def test_responses_larger_than_the_read_buffer_leave_the_connection_open(fake_broker):
    """A frame past the 64 KB scratch buffer is received in place (client/frame_reader.py);
    once it is complete, receive() must not wait on the socket for more (a socket with a
    timeout waits before every read: it used to sit out request.timeout.ms, then close)."""
    broker = fake_broker({"big": 6000, "small": 1})  # ~150 KB of partitions in Metadata
    conn = connect(broker, request_timeout_ms=5000)
    reqs = [conn.send(ApiKey.METADATA, metadata_request([name]))
            for name in ("big", "small", "big")]
    responses = [conn.wait(r) for r in reqs]
    assert [len(r.topics[0].partitions) for r in responses] == [6000, 1, 6000]
    assert conn.connected
    assert len(conn.request(ApiKey.METADATA, metadata_request(["big"])).topics[0].partitions) \
        == 6000
    assert conn.connected


def test_a_process_with_many_files_open_still_reads(fake_broker):
    """Descriptors past 1023 (a long-running process, a test worker): the connection waits for
    data with poll, which select cannot do for them ("filedescriptor out of range")."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        broker = fake_broker({"big": 6000, "small": 1})
        conn = connect(broker, request_timeout_ms=5000)
        assert conn._sock.fileno() > 1023
        responses = [conn.wait(r) for r in [conn.send(ApiKey.METADATA, metadata_request([n]))
                                            for n in ("big", "small")]]
        assert [len(r.topics[0].partitions) for r in responses] == [6000, 1]
        assert conn.connected
    finally:
        for fd in held:
            os.close(fd)
