"""The fault proxy against a real broker: requests delayed, held and released out of order across
connections, duplicated (the second response swallowed), responses always matched to their
requests, and Metadata / FindCoordinator rewritten so that clients stay behind the proxy."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer as ConfluentProducer
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    fetch_all,
    latest_offset,
    metadata_request,
    produce_request,
)

from oncelog import Producer
from oncelog.protocol import ApiKey, decode_response, encode_request, make, request_module
from oncelog.records import build_batch
from oncelog.server.embedded import EmbeddedBroker
from oncelog.verify.proxy import FaultProxy, Faults

NOW = int(time.time() * 1000)


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config={"transaction.state.log.num.partitions": "2"}) as b:
        yield b


def plain_batch(value: bytes) -> bytes:
    return build_batch([(None, value, [], NOW)])


def make_topic(conn: RawConnection, name: str) -> None:
    response = conn.request(create_topics_request(name))
    assert response.topics[0].error_code == 0


def test_metadata_and_find_coordinator_name_the_proxy(broker):
    with FaultProxy(broker.bootstrap_servers) as proxy, \
            RawConnection(proxy.bootstrap_servers) as conn:
        md = conn.request(metadata_request(None))
        assert [(b.host, b.port) for b in md.brokers] == [("127.0.0.1", proxy.port)]
        for version in (3, 4):
            mod = request_module(ApiKey.FIND_COORDINATOR, version)
            fc = conn.request(make(mod.FindCoordinatorRequest, key="g", key_type=0,
                                   coordinator_keys=("g",)))
            got = fc.coordinators[0] if version == 4 else fc
            assert (got.host, got.port) == ("127.0.0.1", proxy.port)
        assert proxy.stats["rewritten"] == 3
        assert proxy.port != broker.port


def test_delay_holds_the_request_back(broker):
    faults = Faults(delay=1.0, delay_ms=(400, 400), api_keys=frozenset({ApiKey.PRODUCE}))
    with FaultProxy(broker.bootstrap_servers, faults=faults) as proxy, \
            Producer(bootstrap_servers=proxy.bootstrap_servers, linger_ms=0) as producer:
        producer.send("proxy-delay", b"warm-up").result(10)
        started = time.monotonic()
        meta = producer.send("proxy-delay", b"late").result(10)
        assert time.monotonic() - started >= 0.4
        assert meta.offset == 1
        assert proxy.stats["delayed"] >= 2


def test_held_request_is_overtaken_by_another_connection(broker):
    with FaultProxy(broker.bootstrap_servers) as proxy, \
            RawConnection(proxy.bootstrap_servers) as a, \
            RawConnection(proxy.bootstrap_servers) as b:
        make_topic(a, "proxy-reorder")
        proxy.hold_next(ApiKey.PRODUCE)
        a.send(encode_request(77, "a", produce_request("proxy-reorder", 0, plain_batch(b"A"))))
        proxy.wait_held()
        # b's request goes through while a's waits
        assert b.request(produce_request("proxy-reorder", 0, plain_batch(b"B"))) \
            .responses[0].partition_responses[0].base_offset == 0
        assert proxy.release_held() == 1
        cid, response = decode_response(ApiKey.PRODUCE, 9, a.read_frame())
        assert cid == 77
        assert response.responses[0].partition_responses[0].base_offset == 1
        assert [r[2] for r in fetch_all(b, "proxy-reorder")] == [b"B", b"A"]


def test_a_held_request_still_lands_after_its_client_left(broker):
    """The late-message ingredient: the client gives up and disconnects, the request arrives."""
    with FaultProxy(broker.bootstrap_servers) as proxy:
        with RawConnection(broker.bootstrap_servers) as direct:
            make_topic(direct, "proxy-late")
        with RawConnection(proxy.bootstrap_servers) as a:
            proxy.hold_next(ApiKey.PRODUCE)
            a.send(encode_request(5, "a", produce_request("proxy-late", 0, plain_batch(b"x"))))
            proxy.wait_held()
        with RawConnection(broker.bootstrap_servers) as direct:
            assert latest_offset(direct, "proxy-late") == 0
            proxy.release_held()
            proxy.wait_idle()
            assert latest_offset(direct, "proxy-late") == 1
        assert proxy.stats["answers_to_gone_clients"] == 1


def test_duplicate_is_written_twice_and_its_answer_swallowed(broker):
    faults = Faults(duplicate=1.0, duplicate_after_ms=(0, 0),
                    api_keys=frozenset({ApiKey.PRODUCE}))
    with FaultProxy(broker.bootstrap_servers) as proxy, \
            RawConnection(proxy.bootstrap_servers) as conn:
        make_topic(conn, "proxy-dup")
        proxy.set_faults(faults)
        first = conn.request(produce_request("proxy-dup", 0, plain_batch(b"once")))
        assert first.responses[0].partition_responses[0].base_offset == 0
        proxy.wait_idle()
        proxy.set_faults(Faults())
        # the next answer on this connection is this request's, not the duplicate's
        md = conn.request(metadata_request(["proxy-dup"]))
        assert md.topics[0].name == "proxy-dup"
        assert [r[2] for r in fetch_all(conn, "proxy-dup")] == [b"once", b"once"]
        assert proxy.stats["swallowed"] == 1 and proxy.stats["unmatched"] == 0


def test_pipelined_requests_stay_matched_under_random_faults(broker):
    faults = Faults(delay=0.3, delay_ms=(0, 30), reorder=0.2, hold_ms=(0, 60), duplicate=0.3,
                    duplicate_after_ms=(0, 20), api_keys=frozenset({ApiKey.PRODUCE}))
    with FaultProxy(broker.bootstrap_servers, faults=faults, seed=7) as proxy, \
            RawConnection(proxy.bootstrap_servers) as conn:
        make_topic(conn, "proxy-pipe")
        for cid in range(100, 140):
            conn.send(encode_request(cid, "p", produce_request(
                "proxy-pipe", 0, plain_batch(b"%d" % cid))))
        got = [decode_response(ApiKey.PRODUCE, 9, conn.read_frame())[0] for _ in range(40)]
        assert got == list(range(100, 140))
        proxy.wait_idle()
        assert proxy.stats["unmatched"] == 0
        assert proxy.stats["swallowed"] == proxy.stats["duplicated"] > 0
        assert proxy.stats["held"] > 0 and proxy.stats["delayed"] > 0


def test_confluent_kafka_stays_behind_the_proxy(broker):
    with FaultProxy(broker.bootstrap_servers) as proxy:
        p = ConfluentProducer({"bootstrap.servers": proxy.bootstrap_servers,
                               "enable.idempotence": True, "linger.ms": 0})
        p.produce("proxy-confluent", b"warm-up")
        assert p.flush(15) == 0
        # Every Produce passes through the proxy: a held one is not acknowledged until released.
        delivered = []
        proxy.hold_next(ApiKey.PRODUCE)
        p.produce("proxy-confluent", b"held", on_delivery=lambda err, msg: delivered.append(err))
        proxy.wait_held()
        p.poll(0.5)
        assert delivered == []
        proxy.release_held()
        assert p.flush(15) == 0
        assert delivered == [None]
        assert proxy.stats["rewritten"] >= 1
