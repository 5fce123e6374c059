"""Issue 31's hosts and their faults, each driven on real namespaces and real processes: a
partition really blocks TCP between hosts (and only between them) and heal restores it; a
one-way drop; the link proxy's delay and loss measured on a connection; a broker's wall clock
skewed and jumped at run time (seen in LogAppendTime); a full data disk fails produce with a
Kafka error and works again once freed, with no operator action."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from support.netns import require_netns
from support.raw_wire import RawConnection, create_topics_request, produce

from oncelog.faults.clock import ClockControl, wrap_command
from oncelog.faults.disk import DataDisk
from oncelog.faults.linkproxy import LinkProxy
from oncelog.faults.net import Network, cleanup
from oncelog.harness.broker_process import BrokerProcess
from oncelog.records import build_batch

pytestmark = pytest.mark.cluster

KAFKA_STORAGE_ERROR = 56

# A TCP echo server: every connection gets back what it sends.
ECHO = """
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64)
print("ready", flush=True)
def serve(c):
    while data := c.recv(65536):
        c.sendall(data)
    c.close()
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
"""

# Connect to HOST:PORT from inside a host; prints "ok" when an echo came back, else the error.
PROBE = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.5) as s:
        s.sendall(b"x"); print("ok" if s.recv(1) == b"x" else "no echo")
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.fixture(scope="module")
def net():
    require_netns()
    network = Network()
    for name, index in (("a", 21), ("b", 22), ("c", 23)):
        network.add_host(name, index)
    procs = []
    try:
        for host in network.hosts.values():
            p = host.popen([sys.executable, "-c", ECHO, "0.0.0.0", "7000"],
                           stdout=subprocess.PIPE, text=True)
            procs.append(p)
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield network
    finally:
        for p in procs:
            p.kill()
            p.wait()
        network.teardown()


def reach(net: Network, src: str, dst: str) -> str:
    """"ok" when ``src`` gets an echo from ``dst``'s server, else why not."""
    return net.host(src).run([sys.executable, "-c", PROBE, net.host(dst).address, "7000"],
                             check=False).strip()


def reach_from_control(net: Network, dst: str) -> str:
    try:
        with socket.create_connection((net.host(dst).address, 7000), timeout=1.0) as s:
            s.sendall(b"x")
            return "ok" if s.recv(1) == b"x" else "no echo"
    except OSError as exc:
        return type(exc).__name__


def test_hosts_have_their_own_namespaces_and_reach_each_other(net):
    assert {h.namespace for h in net.hosts.values()} == {f"ol{net.n}-{x}" for x in "abc"}
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            check=True).stdout
    assert all(h.namespace in listed for h in net.hosts.values())
    assert net.host("a").run(["ip", "-4", "-o", "addr", "show", "dev", "eth0"]) \
        .split()[3] == f"198.18.{net.n}.21/24"
    assert [reach(net, "a", "b"), reach(net, "b", "c"), reach_from_control(net, "a")] \
        == ["ok"] * 3


def test_a_partition_blocks_tcp_between_groups_only_and_heal_restores_it(net):
    try:
        net.partition([["a"], ["b", "c"]])
        assert net.blocked() == {"a": ["b", "c"], "b": ["a"], "c": ["a"]}
        assert [reach(net, "a", "b"), reach(net, "b", "a"), reach(net, "c", "a")] \
            == ["TimeoutError"] * 3
        assert reach(net, "b", "c") == "ok"  # within a group
        assert reach_from_control(net, "a") == "ok"  # the control host is never cut
        net.isolate("c")
        assert reach(net, "b", "c") == "TimeoutError"
        net.heal()
        assert net.blocked() == {}
        assert [reach(net, "a", "b"), reach(net, "b", "a"), reach(net, "b", "c")] == ["ok"] * 3
    finally:
        net.heal()


def test_one_way_drop_and_bridge(net):
    try:
        net.drop("a", "b")  # b drops what a sends
        # a's SYN never arrives; b's own connection to a stalls too: a's answers are dropped
        assert reach(net, "a", "b") == "TimeoutError"
        assert reach(net, "b", "a") == "TimeoutError"
        assert reach(net, "c", "b") == "ok"
        # only b drops: a still receives what b sends (a UDP datagram shows it)
        with net.host("a").popen([sys.executable, "-c", (
                "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
                "s.bind(('0.0.0.0',7001));s.settimeout(5);print('ready',flush=True);"
                "print(s.recv(10).decode(),flush=True)")], stdout=subprocess.PIPE,
                text=True) as receiver:
            assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
            net.host("b").run([sys.executable, "-c", (
                "import socket;socket.socket(socket.AF_INET,socket.SOCK_DGRAM)"
                f".sendto(b'from-b',('{net.host('a').address}',7001))")])
            assert receiver.stdout.readline().strip() == "from-b"
        net.heal()
        net.bridge(["a"], ["c"], via="b")
        assert [reach(net, "a", "c"), reach(net, "a", "b"), reach(net, "c", "b"),
                reach(net, "b", "a"), reach(net, "b", "c")] == ["TimeoutError"] + ["ok"] * 4
    finally:
        net.heal()
    assert reach(net, "a", "b") == "ok"


def test_cleanup_removes_namespaces_of_dead_runs_only(net):
    dead = 251  # never taken by a run (runs take 1..250); nobody holds its lock
    subprocess.run(["ip", "netns", "add", f"ol{dead}-n1"], check=True)
    gone = cleanup()
    assert f"ol{dead}-n1" in gone
    assert not any(ns.startswith(f"ol{net.n}-") for ns in gone)  # a live run is left alone
    out = subprocess.run([sys.executable, "-m", "oncelog.faults.net", "--cleanup"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "nothing to remove" or f"ol{net.n}-" not in out


def echo_rtt(address: str, port: int, rounds: int = 3) -> float:
    """The shortest round trip of a byte through ``address:port`` (an echo)."""
    best = float("inf")
    with socket.create_connection((address, port), timeout=10.0) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds):
            start = time.monotonic()
            s.sendall(b"x")
            assert s.recv(1) == b"x"
            best = min(best, time.monotonic() - start)
    return best


def test_link_proxy_delays_and_stalls_per_source_host_at_run_time(net, tmp_path):
    host = net.host("a")
    echo = host.popen([sys.executable, "-c", ECHO, "127.0.0.1", "7100"],
                      stdout=subprocess.PIPE, text=True)
    proxy = LinkProxy(host, 7100, ("127.0.0.1", 7100), tmp_path / "link.sock",
                      tmp_path / "link.log", seed=1)
    try:
        assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
        proxy.start()
        assert echo_rtt(host.address, 7100) < 0.4  # no rule: passes through
        # 200 ms each way from the control host (the source), on a connection already open
        with socket.create_connection((host.address, 7100), timeout=10.0) as s:
            proxy.set_rules({net.control.address: {"delay_ms": 200}})
            start = time.monotonic()
            s.sendall(b"y")
            assert s.recv(1) == b"y"
            assert time.monotonic() - start >= 0.4
        assert echo_rtt(host.address, 7100) >= 0.4
        # another source's rule does not touch the control host's connections
        proxy.set_rules({net.host("b").address: {"delay_ms": 200}})
        assert echo_rtt(host.address, 7100) < 0.4
        # loss: every chunk stalls as a retransmission would, 200-1000 ms each way
        proxy.set_rules({"*": {"loss": 1.0}})
        assert echo_rtt(host.address, 7100, rounds=1) >= 0.4
        proxy.heal()
        assert echo_rtt(host.address, 7100) < 0.4
    finally:
        proxy.stop()
        echo.kill()
        echo.wait()


@pytest.fixture(scope="module")
def broker_host(net, tmp_path_factory):
    """A broker in host ``c`` with a skewable clock and its data on an 8 MiB tmpfs."""
    d = tmp_path_factory.mktemp("broker")
    disk = DataDisk(d / "data", 8).mount()
    clock = ClockControl(d / "clock-offset-ms")
    host = net.host("c")
    broker = BrokerProcess(d / "data", port=9092, host=host.address, log_path=d / "broker.log",
                           wrap=lambda argv: host.wrap(wrap_command(argv, clock.path)))
    try:
        broker.start()
        yield broker, clock, disk
    finally:
        if broker.running:
            broker.kill()
        disk.unmount()


def append_time(conn: RawConnection, topic: str) -> int:
    response = produce(conn, topic, 0, build_batch([(None, b"v", [], 1)]))
    assert response.error_code == 0
    appended = response.log_append_time  # a datetime (UTC)
    return int(appended.timestamp() * 1000)


def test_a_broker_clock_is_skewed_and_jumps_at_run_time(broker_host):
    broker, clock, _disk = broker_host
    with RawConnection(broker.bootstrap_servers) as conn:
        created = conn.request(create_topics_request(
            "appended", configs={"message.timestamp.type": "LogAppendTime"})).topics[0]
        assert created.error_code == 0
        real = time.time() * 1000
        assert abs(append_time(conn, "appended") - real) < 60_000
        clock.set_offset(2 * 3600 * 1000)  # two hours ahead
        wait_for(lambda: append_time(conn, "appended") - time.time() * 1000 > 3600_000)
        assert abs(append_time(conn, "appended") - time.time() * 1000 - 7200_000) < 60_000
        clock.set_offset(-3600 * 1000)  # a jump back: an hour behind
        wait_for(lambda: append_time(conn, "appended") - time.time() * 1000 < -1800_000)
        assert abs(append_time(conn, "appended") - time.time() * 1000 + 3600_000) < 60_000
        clock.reset()
        wait_for(lambda: abs(append_time(conn, "appended") - time.time() * 1000) < 60_000)
        assert broker.running  # its timers (monotonic) did not care


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_full_disk_fails_produce_with_a_kafka_error_and_recovers_when_freed(broker_host):
    broker, _clock, disk = broker_host
    with RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(create_topics_request("filled")).topics[0].error_code == 0
        batch = build_batch([(None, bytes(4096), [], 1)] * 8)
        assert produce(conn, "filled", 0, batch).error_code == 0
        assert disk.fill() > 0
        assert disk.free_bytes() == 0
        failed = produce(conn, "filled", 0, batch)
        assert failed.error_code == KAFKA_STORAGE_ERROR
        assert broker.running
        disk.free()
        assert produce(conn, "filled", 0, batch).error_code == 0
    assert broker.running
