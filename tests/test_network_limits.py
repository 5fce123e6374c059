"""What one connection may hold of the broker (issue 16): one request in flight, small frames
before SASL authentication, no idle or half-sent connection kept for ever, and no more
connections than ``max.connections`` / ``max.connections.per.ip``."""

from __future__ import annotations

import dataclasses
import datetime
import select
import socket
import struct
import time
from pathlib import Path

import pytest
from support.floods import MIB, api_versions, fill_partition, push, rss, slow_readers
from support.raw_wire import RawConnection, create_topics_request, fetch_request
from support.waiting import wait_until

from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, encode_request, make, request_module


def test_one_request_in_flight_per_connection(tmp_path):
    """A long-poll Fetch with large frames pipelined behind it: the broker reads no further
    until the fetch is answered (it used to queue 16 frames: 1.4 GB for 90 MB frames)."""
    with BrokerProcess(tmp_path / "data") as broker:
        with RawConnection(broker.bootstrap_servers) as conn:
            assert conn.request(create_topics_request("quiet")).topics[0].error_code == 0
        before = rss(broker.proc.pid)
        poll = dataclasses.replace(fetch_request("quiet", 0, 0), min_bytes=1,
                               max_wait=datetime.timedelta(seconds=20))
        big = struct.pack(">i", 30 * MIB) + bytes(30 * MIB)
        with socket.create_connection((broker.host, broker.port)) as sock:
            sock.sendall(encode_request(1, "long-poll", poll))
            sent = push(sock, big * 8)
            assert sent < 2 * len(big), f"the broker took {sent / MIB:.0f} MiB behind a poll"
            assert rss(broker.proc.pid) - before < 60 * MIB
        with RawConnection(broker.bootstrap_servers) as conn:
            conn.send(api_versions())
            assert conn.read_frame() is not None


def sasl_broker(tmp_path: Path, **settings: str) -> BrokerProcess:
    users = tmp_path / "users"
    users.write_text("admin:admin-secret\n")
    return BrokerProcess(tmp_path / "data", settings={
        "security.protocol": "SASL_PLAINTEXT", "sasl.users.file": str(users), **settings})


def test_a_large_frame_before_authentication_closes_the_connection(tmp_path):
    """``sasl.server.max.receive.size`` (512 KiB): a 100 MB frame from someone who has not
    logged in is not read (it was buffered and parsed)."""
    with sasl_broker(tmp_path) as broker:
        before = rss(broker.proc.pid)
        with socket.create_connection((broker.host, broker.port)) as sock:
            sent = push(sock, struct.pack(">i", 100 * MIB) + bytes(100 * MIB), timeout=5)
            assert sent < 100 * MIB
        assert rss(broker.proc.pid) - before < 20 * MIB
        assert "sasl.server.max.receive.size" in broker.log_tail(5)
        with RawConnection(broker.bootstrap_servers) as conn:  # a small frame is fine
            conn.send(api_versions())
            assert conn.read_frame() is not None


def test_idle_and_half_sent_connections_are_closed(tmp_path):
    settings = {"connections.max.idle.ms": "600", "socket.request.read.timeout.ms": "400"}
    with BrokerProcess(tmp_path / "data", settings=settings) as broker:
        with RawConnection(broker.bootstrap_servers) as idle, \
                RawConnection(broker.bootstrap_servers) as slow, \
                RawConnection(broker.bootstrap_servers, timeout=1) as busy:
            slow.send(api_versions()[:5])  # a request that never finishes arriving
            for _ in range(8):  # a client that asks every 0.2 s is never idle (1.6 s in all)
                busy.send(api_versions())
                assert busy.read_frame() is not None
                time.sleep(0.2)
            assert slow.closed_by_broker()
            assert idle.closed_by_broker()
        log = broker.log_tail(20)
        assert "socket.request.read.timeout.ms" in log and "connections.max.idle.ms" in log


@pytest.mark.parametrize("setting", ["max.connections", "max.connections.per.ip"])
def test_connections_over_the_limit_are_closed(tmp_path, setting):
    with BrokerProcess(tmp_path / "data", settings={setting: "3"}) as broker:
        kept = [RawConnection(broker.bootstrap_servers) for _ in range(3)]
        for conn in kept:
            conn.send(api_versions())
            assert conn.read_frame() is not None
        with RawConnection(broker.bootstrap_servers) as extra:
            extra.send(api_versions())
            assert extra.closed_by_broker()
        kept.pop().close()
        wait_until(lambda: f"{setting} (3) reached" in broker.log_tail(5), 5)

        def a_new_one_is_served() -> bool:
            with RawConnection(broker.bootstrap_servers) as conn:
                conn.send(api_versions())
                return conn.read_frame() is not None

        wait_until(a_new_one_is_served, 10, "a connection once one was closed")
        for conn in kept:
            conn.close()


def test_a_metadata_request_naming_many_topics_does_not_stall_other_clients(tmp_path):
    """200,000 topic names (5 MB): the broker answers other connections while it works on
    them (a request naming 300,000 held every client for 4.5 s)."""
    mod = request_module(ApiKey.METADATA, 12)
    big = encode_request(1, "big", make(
        mod.MetadataRequest, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
        topics=tuple(make(mod.MetadataRequestTopic, topic_id=None, name=f"t{i:06d}")
                     for i in range(200_000))))
    with BrokerProcess(tmp_path / "data") as broker, \
            RawConnection(broker.bootstrap_servers, timeout=60) as asker, \
            RawConnection(broker.bootstrap_servers) as other:
        other.send(api_versions())
        assert other.read_frame() is not None
        asker.send(big)
        answered_meanwhile = 0
        while not select.select([asker.sock], [], [], 0)[0]:
            other.send(api_versions())
            assert other.read_frame() is not None
            answered_meanwhile += 1
        assert len(asker.read_frame()) > 200_000 * 20
        assert answered_meanwhile >= 5, answered_meanwhile


def test_slow_readers_hold_a_chunk_each_not_their_responses(tmp_path):
    """A dozen connections ask for ~48 MB each and read nothing: the record sets stay in the
    segment file and go out a chunk at a time as a reader drains them (each held a copy of its
    whole response: 691 MB for twelve)."""
    with BrokerProcess(tmp_path / "data") as broker:
        fill_partition(broker, "big", 48)
        before = rss(broker.proc.pid)
        readers = slow_readers(broker, "big", 12, max_bytes=55 * MIB)
        with RawConnection(broker.bootstrap_servers) as conn:  # the broker answers meanwhile
            conn.send(api_versions())
            assert conn.read_frame() is not None
        grown = rss(broker.proc.pid) - before
        print(f"broker RSS grew {grown / MIB:.0f} MiB for 12 slow readers")
        assert grown < 100 * MIB, f"{grown / MIB:.0f} MiB for 12 slow readers"
        # a reader that does read gets every byte
        first = readers[0]
        first.settimeout(30)
        size = struct.unpack(">i", first.recv(4, socket.MSG_WAITALL))[0]
        got = 0
        while got < size:
            got += len(first.recv(min(size - got, 1 << 20)))
        assert size > 48_000_000
        for sock in readers:
            sock.close()
