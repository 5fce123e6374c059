"""What a broker process does with bytes a well-behaved client would never send: it answers with
Kafka's error where Kafka answers, closes that one connection where Kafka closes it, and in every
case goes on serving every other connection."""

from __future__ import annotations

import socket
import struct
import uuid

import pytest
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    fetch_all,
    metadata_request,
    produce,
    produce_request,
)

from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, decode_response, encode_request, make, request_module
from oncelog.protocol.apis import SUPPORTED_VERSIONS
from oncelog.records import build_batch

CORRUPT_MESSAGE = 2
INVALID_RECORD = 87
INVALID_REQUEST = 42
INVALID_TOPIC_EXCEPTION = 17
UNSUPPORTED_VERSION = 35
MAX_REQUEST_BYTES = 100 * 1024 * 1024  # socket.request.max.bytes default
TOPIC = "bad-input"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("bad-input") / "data") as b:
        with RawConnection(b.bootstrap_servers) as conn:
            assert conn.request(create_topics_request(TOPIC)).topics[0].error_code == 0
        yield b
        assert b.running, "the broker died\n" + b.log_tail()


def api_versions_request(version: int = 3):
    mod = request_module(ApiKey.API_VERSIONS, version)
    return make(mod.ApiVersionsRequest, client_software_name="oncelog-tests",
                client_software_version="1")


def assert_still_serving(broker: BrokerProcess) -> None:
    """A fresh connection gets ApiVersions, Metadata and a produce/fetch round trip."""
    assert broker.running, "the broker process died\n" + broker.log_tail()
    with RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(api_versions_request()).error_code == 0
        md = conn.request(metadata_request([TOPIC]))
        assert md.topics[0].error_code == 0
        r = produce(conn, TOPIC, 0, build_batch([(b"k", b"still-serving", [], 1)]))
        assert r.error_code == 0
        assert fetch_all(conn, TOPIC, start=r.base_offset)[0][2] == b"still-serving"


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def header(api_key: int, version: int, correlation_id: int = 7) -> bytes:
    client = b"bad"
    return struct.pack(">hhih", api_key, version, correlation_id, len(client)) + client


# -- framing --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [MAX_REQUEST_BYTES + 1, 0x7FFFFFFF, -1, -(2**31)],
                         ids=["limit+1", "int32-max", "minus-one", "int32-min"])
def test_frame_size_outside_limits_closes_the_connection(broker, size):
    with RawConnection(broker.bootstrap_servers) as conn, \
            RawConnection(broker.bootstrap_servers) as bystander:
        conn.send(struct.pack(">i", size) + b"\x00" * 64)
        assert conn.closed_by_broker()
        # A connection opened before the bad one is unaffected.
        assert bystander.request(api_versions_request()).error_code == 0
    assert_still_serving(broker)


def test_http_request_is_garbage_and_closes_the_connection(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        conn.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")  # "GET " is a 1.1 GiB size
        assert conn.closed_by_broker()
    assert_still_serving(broker)


@pytest.mark.parametrize("body", [
    b"",  # empty frame: no header at all
    b"\x00\x12\x00",  # header cut inside the api version
    b"\x00\x12\x00\x03\x00\x00\x00\x01\x00",  # cut inside the client id length
    b"\x00\x12\x00\x00\x00\x00\x00\x01\x00\x09ab",  # client id longer than the frame
    bytes(range(200, 256)) * 3,  # noise
], ids=["empty", "short-header", "short-client-id-length", "short-client-id", "noise"])
def test_garbage_frames_close_the_connection(broker, body):
    with RawConnection(broker.bootstrap_servers) as conn:
        conn.send(frame(body))
        assert conn.closed_by_broker()
    assert_still_serving(broker)


def test_malformed_body_of_a_known_request_closes_the_connection(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        # Metadata v1: a topic array claiming 1000 entries, then nothing.
        conn.send(frame(header(ApiKey.METADATA, 1) + struct.pack(">i", 1000)))
        assert conn.closed_by_broker()
    assert_still_serving(broker)


def test_truncated_frame_then_close_leaves_the_broker_serving(broker):
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        request = encode_request(1, "truncated", api_versions_request())
        sock.sendall(request[: len(request) // 2])
        sock.close()
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    sock.sendall(struct.pack(">i", 1000) + b"\x00" * 10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # with a reset, not a FIN
    assert_still_serving(broker)


def test_a_request_sent_one_byte_at_a_time_is_answered(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        data = encode_request(41, "slow", api_versions_request())
        for i in range(len(data)):
            conn.send(data[i : i + 1])
        cid, response = decode_response(ApiKey.API_VERSIONS, 3, conn.read_frame())
        assert (cid, response.error_code) == (41, 0)


def test_pipelined_requests_beyond_the_queue_limit_are_answered_in_order(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        n = 200  # far more than the broker queues before it stops reading
        conn.send(b"".join(encode_request(1000 + i, "pipe", metadata_request([TOPIC]))
                           for i in range(n)))
        for i in range(n):
            got = struct.unpack_from(">i", conn.read_frame())[0]
            assert got == 1000 + i


# -- API keys and versions ------------------------------------------------------------------


# LeaderAndIsr (4) and ControlledShutdown (7) are Kafka's inter-broker APIs, which a
# single-node broker never serves; the others are no API at all.
@pytest.mark.parametrize("api_key", [4, 7, 999, 32767, -1],
                         ids=["LeaderAndIsr", "ControlledShutdown", "999", "int16-max",
                              "negative"])
def test_unknown_api_key_closes_the_connection(broker, api_key):
    assert api_key not in SUPPORTED_VERSIONS
    with RawConnection(broker.bootstrap_servers) as conn:
        conn.send(frame(header(api_key, 0) + b"\x00" * 16))
        assert conn.closed_by_broker()
    assert_still_serving(broker)


@pytest.mark.parametrize("version", [SUPPORTED_VERSIONS[ApiKey.API_VERSIONS][1] + 1, 127])
def test_unsupported_api_versions_version_gets_a_v0_answer_with_the_api_list(broker, version):
    with RawConnection(broker.bootstrap_servers) as conn:
        # A newer client writes a v2 (flexible) header and a body we cannot know.
        conn.send(frame(header(ApiKey.API_VERSIONS, version, correlation_id=99)
                        + b"\x00" + b"\x05hello\x021\x00"))
        raw = conn.read_frame()
        assert raw is not None, "expected an answer, not a hang-up"
        cid, response = decode_response(ApiKey.API_VERSIONS, 0, raw)
        assert cid == 99
        assert response.error_code == UNSUPPORTED_VERSION
        listed = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert listed == SUPPORTED_VERSIONS
        # The client retries with a version we have, on the same connection.
        assert conn.request(api_versions_request(3)).error_code == 0


@pytest.mark.parametrize("api_key,version", [
    (ApiKey.METADATA, SUPPORTED_VERSIONS[ApiKey.METADATA][1] + 1),
    (ApiKey.PRODUCE, 2),  # below our minimum: magic v0/v1 message sets
    (ApiKey.FETCH, 99),
])
def test_unsupported_version_of_another_api_closes_the_connection(broker, api_key, version):
    with RawConnection(broker.bootstrap_servers) as conn:
        conn.send(frame(header(api_key, version) + b"\x00" * 32))
        assert conn.closed_by_broker()
    assert_still_serving(broker)


# -- bad content in well-formed requests ----------------------------------------------------


def test_produce_with_a_flipped_crc_is_corrupt_message_and_nothing_is_written(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        good = build_batch([(b"k", b"v", [("h", b"x")], 1), (None, b"w", [], 2)])
        before = produce(conn, TOPIC, 0, good).base_offset
        for flip_at in (17, 30, len(good) - 1):  # the CRC itself, the header, the last record
            bad = bytearray(good)
            bad[flip_at] ^= 0x01
            r = produce(conn, TOPIC, 0, bytes(bad))
            assert r.error_code == CORRUPT_MESSAGE, flip_at
        # A good batch followed by a truncated one: the whole record set is refused.
        r = produce(conn, TOPIC, 0, good + good[:-5])
        assert r.error_code == CORRUPT_MESSAGE
        after = produce(conn, TOPIC, 0, good).base_offset
        assert after == before + 2, "a refused batch took offsets"
    assert_still_serving(broker)


def test_produce_with_garbage_records_gets_kafkas_errors(broker):
    """What Kafka 4.3 answers to each (asked of a real one): a batch length under the smallest
    record's overhead (14) or a magic past 2 is CORRUPT_MESSAGE; a record set with no whole
    batch in it, or a batch of an old magic, is INVALID_RECORD."""
    batch = bytearray(build_batch([(None, b"v", [], 1)]))
    magic_5, magic_1 = bytearray(batch), bytearray(batch)
    magic_5[16], magic_1[16] = 5, 1
    with RawConnection(broker.bootstrap_servers) as conn:
        for records, code in ((b"\x00" * 70, CORRUPT_MESSAGE), (b"nonsense", INVALID_RECORD),
                              (b"\xff" * 61, CORRUPT_MESSAGE), (bytes(magic_5), CORRUPT_MESSAGE),
                              (bytes(magic_1), INVALID_RECORD), (bytes(batch[:40]), INVALID_RECORD)):
            r = produce(conn, TOPIC, 0, records)
            assert r.error_code == code, records
    assert_still_serving(broker)


@pytest.mark.parametrize("name", ["bad/name", "", ".", "..", "a" * 250, "spaces here", "é"])
def test_create_topics_with_a_bad_name_is_invalid_topic_exception(broker, name):
    with RawConnection(broker.bootstrap_servers) as conn:
        response = conn.request(create_topics_request(name))
        assert response.topics[0].error_code == INVALID_TOPIC_EXCEPTION
        md = conn.request(metadata_request(None))
        assert name not in {t.name for t in md.topics}
    assert_still_serving(broker)


def test_produce_to_a_bad_topic_name_is_refused(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        response = conn.request(produce_request("bad/name", 0, build_batch([(None, b"v", [], 1)])))
        assert response.responses[0].partition_responses[0].error_code == INVALID_TOPIC_EXCEPTION
    assert_still_serving(broker)


@pytest.mark.parametrize("version", [2, 8])
def test_an_offset_commit_naming_no_topics_gets_an_empty_answer(broker, version):
    """Kafka answers an empty commit without writing anything; it closed the connection (an
    empty batch was built for __consumer_offsets)."""
    mod = request_module(ApiKey.OFFSET_COMMIT, version)
    with RawConnection(broker.bootstrap_servers) as conn:
        response = conn.request(make(mod.OffsetCommitRequest, group_id="empty-commit",
                                     generation_id_or_member_epoch=-1, member_id="",
                                     group_instance_id=None, retention_time=-1, topics=()))
        assert response.topics == ()
        assert conn.request(api_versions_request()).error_code == 0  # same connection
    assert_still_serving(broker)


@pytest.mark.parametrize("version", [10, 11])
def test_topic_ids_in_metadata_before_v12_are_an_invalid_request(broker, version):
    """v10 and v11 carry a topic id field but answer names only: Kafka refuses topic ids there
    (INVALID_REQUEST, the name answered as ""); the null name made our answer unencodable and
    the connection was closed."""
    mod = request_module(ApiKey.METADATA, version)
    request = make(mod.MetadataRequest, allow_auto_topic_creation=False,
                   include_cluster_authorized_operations=False,
                   include_topic_authorized_operations=False,
                   topics=(make(mod.MetadataRequestTopic, topic_id=uuid.uuid4(), name=None),))
    with RawConnection(broker.bootstrap_servers) as conn:
        response = conn.request(request)
        assert [(t.error_code, t.name) for t in response.topics] == [(INVALID_REQUEST, "")]
        assert conn.request(api_versions_request()).error_code == 0
    assert_still_serving(broker)


def test_a_null_in_a_non_nullable_field_closes_only_that_connection(broker):
    """CreateTopics v5 with a null topic array: malformed (Kafka's parser refuses it), where the
    handler failed on None."""
    header = bytes.fromhex("00130005") + struct.pack(">i", 9) + struct.pack(">h", -1) + b"\x00"
    body = b"\x00" + struct.pack(">i", 1000) + b"\x00" + b"\x00"  # topics: null (compact 0)
    with RawConnection(broker.bootstrap_servers) as conn:
        conn.send(frame(header + body))
        assert conn.closed_by_broker()
    assert "non-nullable" in broker.log_tail(5)
    assert_still_serving(broker)
