"""Clients that flood a broker process, and the broker's resident memory while they do: shared
by tests/test_network_limits.py (which asserts bounds) and benchmarks/bench_floods.py (which
prints figures, against an earlier checkout too)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, encode_request, make, request_module
from oncelog.records import build_batch
from support.raw_wire import RawConnection, create_topics_request, fetch_request, produce

MIB = 1024 * 1024


def rss(pid: int) -> int:
    """The process's resident memory now (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def api_versions() -> bytes:
    """A framed ApiVersions v3 request."""
    return encode_request(5, "flood", make(
        request_module(ApiKey.API_VERSIONS, 3).ApiVersionsRequest,
        client_software_name="flood", client_software_version="1"))


def push(sock: socket.socket, data: bytes, timeout: float = 2.0, times: int = 1) -> int:
    """Send ``data`` ``times`` times, until the broker takes nothing for ``timeout`` seconds or
    hangs up: how many bytes went."""
    sock.settimeout(timeout)
    view = memoryview(data)
    sent = 0
    try:
        for _ in range(times):
            pos = 0
            while pos < len(data):
                n = sock.send(view[pos:pos + MIB])
                pos += n
                sent += n
    except (TimeoutError, ConnectionResetError, BrokenPipeError):
        pass  # the broker stopped reading, or hung up
    return sent


def fill_partition(broker: BrokerProcess, topic: str, megabytes: int) -> None:
    """Create ``topic`` (one partition) holding ``megabytes`` one-megabyte records."""
    with RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(create_topics_request(topic)).topics[0].error_code == 0
        value = bytes(1_000_000)
        for _ in range(megabytes):
            assert produce(conn, topic, 0, build_batch(
                [(None, value, [], int(time.time() * 1000))])).error_code == 0


def slow_readers(broker: BrokerProcess, topic: str, count: int,
                 max_bytes: int) -> list[socket.socket]:
    """``count`` connections that each ask for ``topic`` from offset 0 (up to ``max_bytes``)
    with a 64 KiB receive buffer, and read nothing: the caller closes them."""
    readers = []
    for i in range(count):
        sock = socket.create_connection((broker.host, broker.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(encode_request(i, "slow", fetch_request(topic, 0, 0, max_bytes=max_bytes)))
        readers.append(sock)
    return readers
