"""Connection limits on TLS listeners, from the attacker's side (issue 29): raw TCP connections
that never start their TLS handshake, from one address (127.0.0.2), against a broker process
with an SSL listener and low ``max.connections.per.ip`` / ``max.connections``. They are
counted at accept, as plaintext ones are: the broker's open descriptors stay bounded, and a
legitimate TLS client (ours, confluent-kafka) from another address still produces and
consumes. The same for the HTTPS console port. Before the fix a TLS connection was counted
only after its handshake, so each silent connection held a descriptor until its handshake
timed out."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import time
import uuid
from collections.abc import Iterator

import pytest
from support.console import ConsoleBrokerProcess, get
from support.tls import make_certificates
from support.waiting import wait_until

from oncelog import Consumer, Producer, TopicPartition

confluent_kafka = pytest.importorskip("confluent_kafka")

PER_IP = 10
TOTAL = 40
FLOOD = 300  # silent connections from the attacker's address
ATTACKER = "127.0.0.2"


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def _flood(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` TCP connections from ATTACKER to ``port`` that send nothing, closed at the
    end. A connection the broker closes stays in the list (its peer sees EOF)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((ATTACKER, 0))
            s.settimeout(5)
            try:
                s.connect(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def broker(certs, tmp_path_factory):
    settings = {**certs.settings(), "max.connections.per.ip": str(PER_IP),
                "max.connections": str(TOTAL),
                # long: the handshake timeout must not be what frees the descriptors
                "socket.request.read.timeout.ms": "120000",
                "transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2"}
    with ConsoleBrokerProcess(tmp_path_factory.mktemp("tls-limits") / "data",
                              settings=settings) as b:
        yield b


def _settled_fds(pid: int, bound: int) -> int:
    """The broker's descriptor count once it has accepted what the kernel queued: wait
    (briefly, well within the console's 10 s handshake timeout, which would free them on
    its own) for it to come within ``bound``, and return it either way."""
    try:
        wait_until(lambda: _open_fds(pid) <= bound, 3, "descriptors within the bound")
    except AssertionError:
        pass
    time.sleep(0.5)  # what is still in the accept queue comes in now, if it was to
    return _open_fds(pid)


def test_silent_connections_to_a_tls_listener_are_capped_at_accept(broker, certs) -> None:
    pid = broker.pid
    assert pid is not None
    port = int(broker.bootstrap_servers.rsplit(":", 1)[1])
    baseline = _open_fds(pid)
    bound = baseline + PER_IP + 5
    with _flood(port, FLOOD):
        fds = _settled_fds(pid, bound)
        assert fds <= bound, f"{fds} descriptors open with {FLOOD} silent TLS connections " \
                             f"(baseline {baseline}, max.connections.per.ip {PER_IP})"
        # a legitimate client, from another address, is not locked out
        topic = f"tls-limits-{uuid.uuid4().hex[:8]}"
        tls = {"security_protocol": "SSL", "ssl_cafile": certs.ca}
        with Producer(bootstrap_servers=broker.bootstrap_servers, **tls) as producer:
            producer.send(topic, b"still served", partition=0).result(30)
        with Consumer(bootstrap_servers=broker.bootstrap_servers,
                      auto_offset_reset="earliest", **tls) as consumer:
            consumer.assign([TopicPartition(topic, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while not got and time.monotonic() < deadline:
                got += [r.value for r in consumer.poll(0.5)]
        assert got == [b"still served"]
        p = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers,
                                      "security.protocol": "SSL", "ssl.ca.location": certs.ca})
        delivered: list = []
        p.produce(topic, b"librdkafka too", partition=0,
                  on_delivery=lambda err, msg: delivered.append(err))
        assert p.flush(30) == 0
        assert delivered == [None]
        assert _open_fds(pid) <= bound + 10  # the clients' own connections


def test_silent_connections_to_the_https_console_are_capped_at_accept(broker, certs) -> None:
    pid = broker.pid
    assert pid is not None
    url = broker.console_url
    assert url.startswith("https://")
    port = int(url.rsplit(":", 1)[1])
    baseline = _open_fds(pid)
    bound = baseline + PER_IP + 5  # max.connections.per.ip holds for the console too
    with _flood(port, FLOOD):
        fds = _settled_fds(pid, bound)
        assert fds <= bound, f"{fds} descriptors open with {FLOOD} silent console " \
                             f"connections (baseline {baseline})"
        context = ssl.create_default_context(cafile=certs.ca)
        status, _headers, _body = get(f"{url}/topics", context=context)
        assert status == 200
