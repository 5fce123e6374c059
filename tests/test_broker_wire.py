"""The broker's wire behaviour, over raw sockets: ordering, long polls, fetch sessions,
ListOffsets, acks=0, the versions it advertises."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    fetch_request,
    init_producer_id_request,
    list_offsets_request,
    metadata_request,
    produce,
    produce_request,
)

from oncelog.protocol import ApiKey, decode_response, encode_request, make, request_module
from oncelog.protocol.apis import SUPPORTED_VERSIONS
from oncelog.records import build_batch, iter_batches
from oncelog.server.embedded import EmbeddedBroker


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config={"num.partitions": "2"}) as b:
        yield b


def new_topic(conn, name, partitions=1, configs=None):
    r = conn.request(create_topics_request(name, partitions, configs))
    assert r.topics[0].error_code == 0, r
    return name


def test_api_versions_advertises_exactly_what_is_handled(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        mod = request_module(ApiKey.API_VERSIONS, 3)
        r = conn.request(make(mod.ApiVersionsRequest, client_software_name="t",
                              client_software_version="1"))
        got = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
        assert got == {int(k): v for k, v in SUPPORTED_VERSIONS.items()}


def test_pipelined_requests_are_answered_in_order(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        topic = new_topic(conn, "pipelined")
        reqs = []
        for i in range(20):
            if i % 3 == 0:
                req = metadata_request([topic])
            else:
                req = produce_request(topic, 0, build_batch([(None, b"%d" % i, [], 1)]))
            reqs.append(req)
        conn.send(b"".join(encode_request(100 + i, "t", r) for i, r in enumerate(reqs)))
        offsets = []
        for i, req in enumerate(reqs):
            cid, resp = decode_response(type(req).__api_key__, type(req).__version__,
                                        conn.read_frame())
            assert cid == 100 + i
            if type(req).__api_key__ == ApiKey.PRODUCE:
                offsets.append(resp.responses[0].partition_responses[0].base_offset)
        assert offsets == list(range(len(offsets)))


def long_poll_request(topic, offset, max_wait_ms, session_id=0, epoch=-1, version=12):
    mod = request_module(ApiKey.FETCH, version)
    p = make(mod.FetchPartition, partition=0, current_leader_epoch=-1, fetch_offset=offset,
             last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
    return make(mod.FetchRequest, cluster_id=None, replica_id=-1, max_wait=max_wait_ms,
                min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=session_id,
                session_epoch=epoch, topics=(make(mod.FetchTopic, topic=topic, partitions=(p,)),)
                if topic else (), forgotten_topics_data=(), rack_id="")


def test_long_poll_blocks_only_its_own_connection_and_wakes_on_append(broker):
    with RawConnection(broker.bootstrap_servers, timeout=30) as a, \
            RawConnection(broker.bootstrap_servers) as b:
        topic = new_topic(b, "longpoll")
        result = {}

        def poll():
            t0 = time.monotonic()
            result["resp"] = a.request(long_poll_request(topic, 0, 20_000))
            result["elapsed"] = time.monotonic() - t0

        t = threading.Thread(target=poll)
        t.start()
        # The other connection is served at once while the fetch waits.
        t0 = time.monotonic()
        for _ in range(5):
            b.request(metadata_request([topic]))
        assert time.monotonic() - t0 < 5
        assert t.is_alive()
        assert produce(b, topic, 0, build_batch([(None, b"wake", [], 1)])).error_code == 0
        t.join(timeout=15)
        assert not t.is_alive()
        pd = result["resp"].responses[0].partitions[0]
        assert pd.records and result["elapsed"] < 15


def test_long_poll_times_out_with_an_empty_answer(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        topic = new_topic(conn, "longpoll-timeout")
        t0 = time.monotonic()
        r = conn.request(long_poll_request(topic, 0, 300))
        assert 0.25 <= time.monotonic() - t0 < 5
        assert not r.responses[0].partitions[0].records


def test_incremental_fetch_session_omits_partitions_without_news(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        topic = new_topic(conn, "sessions")
        produce(conn, topic, 0, build_batch([(None, b"a", [], 1)]))
        r = conn.request(long_poll_request(topic, 0, 0, session_id=0, epoch=0))
        sid = r.session_id
        assert sid > 0 and r.responses[0].partitions[0].records
        # incremental, the client moved on to offset 1, nothing new: no partitions in the answer
        r = conn.request(long_poll_request(topic, 1, 0, session_id=sid, epoch=1))
        assert r.error_code == 0 and r.responses == ()
        produce(conn, topic, 0, build_batch([(None, b"b", [], 1)]))
        # the session remembers offset 1: an empty incremental request gets the new record
        r = conn.request(long_poll_request(None, 0, 0, session_id=sid, epoch=2))
        assert [p.high_watermark for p in r.responses[0].partitions] == [2]
        assert r.responses[0].partitions[0].records
        r = conn.request(long_poll_request(None, 0, 0, session_id=sid, epoch=7))
        assert r.error_code == 71  # INVALID_FETCH_SESSION_EPOCH


def test_list_offsets_earliest_latest_and_by_timestamp(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        topic = new_topic(conn, "offsets")
        for i in range(5):
            produce(conn, topic, 0, build_batch([(None, b"v", [], 1000 + 100 * i)]))

        def lookup(ts):
            p = conn.request(list_offsets_request(topic, 0, ts)).topics[0].partitions[0]
            return p.error_code, p.offset, p.timestamp

        assert lookup(-2)[:2] == (0, 0)
        assert lookup(-1)[:2] == (0, 5)
        assert lookup(-3) == (0, 4, 1400)
        assert lookup(1150) == (0, 2, 1200)
        assert lookup(9999)[1] == -1
        r = conn.request(list_offsets_request("no-such-topic", 0, -1))
        assert r.topics[0].partitions[0].error_code == 3


def test_list_offsets_max_timestamp_names_the_record_not_the_batch(broker):
    """ListOffsets -3 answers the offset of the first record with the largest timestamp, as
    Kafka 3.8+ (KAFKA-16310): inside a batch, not the batch's last offset; under LogAppendTime
    every record of a batch has its time, so the batch's first offset."""
    with RawConnection(broker.bootstrap_servers) as conn:
        def max_ts(topic):
            p = conn.request(list_offsets_request(topic, 0, -3)).topics[0].partitions[0]
            return p.error_code, p.offset, p.timestamp

        topic = new_topic(conn, "max-ts")
        produce(conn, topic, 0, build_batch([(None, b"a", [], 1000), (None, b"b", [], 3000),
                                             (None, b"c", [], 2000)]))
        assert max_ts(topic) == (0, 1, 3000)  # offsets 0-2: the middle one
        produce(conn, topic, 0, build_batch([(None, b"d", [], 500), (None, b"e", [], 7000),
                                             (None, b"f", [], 7000), (None, b"g", [], 1)]))
        assert max_ts(topic) == (0, 4, 7000)  # offsets 3-6: the first of the two at 7000
        produce(conn, topic, 0, build_batch([(None, b"h", [], 7000)]))
        assert max_ts(topic) == (0, 4, 7000)  # a later tie does not move it
        stamped = new_topic(conn, "max-ts-append", configs={
            "message.timestamp.type": "LogAppendTime"})
        produce(conn, stamped, 0, build_batch([(None, b"x", [], 1)]))
        time.sleep(0.01)  # the broker's clock must move on: a tie would name the first batch
        produce(conn, stamped, 0, build_batch([(None, b"y", [], 1), (None, b"z", [], 2)]))
        err, offset, ts = max_ts(stamped)
        assert (err, offset) == (0, 1) and ts > 1_000_000  # the second batch's first record


def test_acks_zero_gets_no_response_but_is_written(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        topic = new_topic(conn, "acks0")
        req = produce_request(topic, 0, build_batch([(None, b"fire", [], 1)]), acks=0)
        conn.send(encode_request(1, "t", req))
        # the next answer on this connection is the metadata's, not a produce response
        r = conn.request(list_offsets_request(topic, 0, -1), correlation_id=2)
        assert r.topics[0].partitions[0].offset == 1


@pytest.mark.parametrize("version", [3, 7, 11])
def test_produce_and_fetch_at_old_and_new_versions(broker, version):
    with RawConnection(broker.bootstrap_servers) as conn:
        topic = new_topic(conn, f"versions-{version}")
        r = conn.request(produce_request(topic, 0, build_batch([(b"k", b"v", [], 5)]),
                                         version=version))
        assert r.responses[0].partition_responses[0].error_code == 0
        fetch_version = {3: 4, 7: 8, 11: 12}[version]
        r = conn.request(fetch_request(topic, 0, 0, version=fetch_version))
        data = r.responses[0].partitions[0].records
        assert len(list(iter_batches(data))) == 1


def test_metadata_auto_creates_and_v0_lists_all(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        r = conn.request(metadata_request(["auto-made"], allow_auto_topic_creation=True))
        t = r.topics[0]
        assert t.error_code == 0 and len(t.partitions) == 2  # num.partitions=2
        mod = request_module(ApiKey.METADATA, 0)
        r0 = conn.request(make(mod.MetadataRequest, topics=()))
        assert "auto-made" in {t.name for t in r0.topics}
        r = conn.request(metadata_request(["not-made"], allow_auto_topic_creation=False))
        assert r.topics[0].error_code == 3


def test_producer_ids_are_unique(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        ids = {conn.request(init_producer_id_request()).producer_id for _ in range(50)}
        assert len(ids) == 50


def test_a_dead_client_mid_request_does_not_disturb_others(broker):
    s = socket.create_connection(("127.0.0.1", broker.port))
    s.sendall(b"\x00\x00\x10\x00" + b"\x00" * 100)  # promises 4096 bytes, sends 100
    s.close()
    with RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(metadata_request(None)).brokers
