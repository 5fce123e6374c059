"""Shared pytest fixtures. Each section belongs to one area; add new sections below, apart."""

from __future__ import annotations

# ================================================================================================
# Client tests (tests/test_client_*.py): brokers to point oncelog.client at.
#
#   bootstrap        "127.0.0.1:PORT" of the EmbeddedBroker, or of librdkafka's mock cluster
#                    when the embedded broker cannot be imported
#   embedded_broker  the EmbeddedBroker itself (skips the test if there is none)
#   mock_cluster     librdkafka's built-in mock cluster (3 brokers): a second, independent
#                    implementation of the protocol to check our client against
#   fake_broker      FakeBroker: a scripted broker speaking real Kafka framing, for failures a
#                    real broker will not produce on demand (lost responses, NOT_LEADER, ...)
# ================================================================================================
import collections
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from oncelog.client.messages import build
from oncelog.protocol import (
    ApiKey,
    ProtocolError,
    decode_request_body,
    encode_response,
    parse_request_header,
    response_class,
)
from oncelog.protocol.apis import SUPPORTED_VERSIONS
from oncelog.records import parse_header, split_batches

try:
    from oncelog.server.embedded import EmbeddedBroker
except ImportError:  # the broker is not there yet: client tests run against the mock cluster
    EmbeddedBroker = None  # type: ignore[assignment,misc]


class MockCluster:
    """librdkafka's mock cluster, kept alive by the confluent_kafka Producer that created it."""

    def __init__(self, num_brokers: int = 3) -> None:
        import confluent_kafka

        found = threading.Event()
        self.bootstrap_servers = ""

        class _Grab(logging.Handler):
            def emit(inner, record: logging.LogRecord) -> None:
                m = re.search(r"replaced with (\S+)", record.getMessage())
                if m and not found.is_set():
                    self.bootstrap_servers = m.group(1).rstrip(",")
                    found.set()

        logger = logging.getLogger(f"oncelog.tests.mock.{id(self)}")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        logger.addHandler(_Grab())
        self._handle = confluent_kafka.Producer({
            "test.mock.num.brokers": num_brokers, "bootstrap.servers": "unused",
            "logger": logger, "debug": "mock"})
        self._handle.poll(0)
        if not found.wait(10):
            raise RuntimeError("librdkafka did not log the mock cluster's address")

    def close(self) -> None:
        self._handle.flush(0)
        del self._handle


@pytest.fixture
def mock_cluster():
    cluster = MockCluster()
    yield cluster
    cluster.close()


@pytest.fixture
def embedded_broker():
    if EmbeddedBroker is None:
        pytest.skip("oncelog.server.embedded is not available")
    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture
def bootstrap():
    if EmbeddedBroker is not None:
        with EmbeddedBroker() as broker:
            yield broker.bootstrap_servers
    else:
        cluster = MockCluster()
        yield cluster.bootstrap_servers
        cluster.close()


CLOSE = object()  # a FakeBroker handler's answer: drop the connection instead of responding


class FakeConnection:
    """One accepted connection: a reader thread queues frames, a handler thread answers them in
    order (as Kafka does), so a handler can wait for later requests to arrive."""

    def __init__(self, broker: FakeBroker, sock: socket.socket) -> None:
        self.broker = broker
        self.sock = sock
        self.frames: collections.deque[bytes] = collections.deque()
        self.cond = threading.Condition()
        self.closed = False
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._serve, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                buf += data
                while len(buf) >= 4:
                    size = int.from_bytes(buf[:4], "big")
                    if len(buf) < 4 + size:
                        break
                    with self.cond:
                        self.frames.append(buf[4 : 4 + size])
                        self.cond.notify_all()
                    buf = buf[4 + size :]
        except OSError:
            pass
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def wait_queued(self, n: int, timeout: float = 5.0) -> bool:
        """Wait until ``n`` more requests are queued behind the one being handled."""
        with self.cond:
            return self.cond.wait_for(lambda: len(self.frames) >= n or self.closed, timeout)

    def _serve(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.frames or self.closed)
                if not self.frames:
                    return
                frame = self.frames.popleft()
            header = parse_request_header(frame)
            try:
                request = decode_request_body(header, frame)
            except ProtocolError:  # e.g. an API kio has no schema for: the handler decides
                request = None
            answer = self.broker.handle(self, header, request)
            if answer is CLOSE:
                self.close()
                return
            if answer is None:
                continue
            correlation_id = header.correlation_id + self.broker.correlation_skew
            try:
                if isinstance(answer, bytes):
                    self.sock.sendall(len(answer).to_bytes(4, "big") + answer)
                else:
                    self.sock.sendall(encode_response(correlation_id, answer))
            except OSError:
                return

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class FakeBroker:
    """A single-node broker with canned answers and Kafka's idempotence checks.

    Topics are ``{name: partitions}``; every partition is led by node 0 (this broker). Produce
    appends to in-memory logs and checks sequences as Kafka does (duplicate of a recent batch:
    DUPLICATE_SEQUENCE_NUMBER; a gap: OUT_OF_ORDER_SEQUENCE_NUMBER). Tests steer failures with
    ``produce_faults`` (per partition, a queue of callables run before the append) and
    ``handlers`` (api key -> function(conn, header, request) -> response, None, CLOSE, bytes).
    """

    def __init__(self, topics: dict[str, int] | None = None, *,
                 api_versions_max: int | None = None) -> None:
        self.topics = dict(topics or {"t": 1})
        self.api_versions_max = api_versions_max  # reject ApiVersions above this version
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.logs: dict[tuple[str, int], list[tuple[Any, bytes]]] = collections.defaultdict(list)
        self.next_offset: dict[tuple[str, int], int] = collections.defaultdict(int)
        self.sequences: dict[tuple[int, str, int], list[tuple[int, int, int]]] = {}
        self.requests: list[tuple[int, int]] = []  # (api key, version) as received
        self.produced: list[tuple[str, int, Any]] = []  # every batch header received
        self.produce_faults: dict[tuple[str, int], collections.deque] = \
            collections.defaultdict(collections.deque)
        self.handlers: dict[int, Callable] = {}
        self.correlation_skew = 0
        self.next_producer_id = 1000
        self.connections: list[FakeConnection] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(FakeConnection(self, sock))

    def close(self) -> None:
        # shutdown() first: close() alone leaves the socket listening while the accept thread
        # is blocked in accept() (Linux keeps it alive for the pending call).
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for conn in self.connections:
            conn.close()

    def records(self, topic: str, partition: int = 0) -> list[tuple[Any, bytes]]:
        with self.lock:
            return list(self.logs[(topic, partition)])

    # --- answers ----------------------------------------------------------------------------

    def response(self, api_key: int, version: int, values: dict[str, Any]) -> Any:
        return build(response_class(api_key, version), values)

    def handle(self, conn: FakeConnection, header: Any, request: Any) -> Any:
        with self.lock:
            self.requests.append((header.api_key, header.api_version))
        custom = self.handlers.get(header.api_key)
        if custom is not None:
            return custom(conn, header, request)
        method = {
            ApiKey.API_VERSIONS: self._api_versions,
            ApiKey.METADATA: self._metadata,
            ApiKey.INIT_PRODUCER_ID: self._init_producer_id,
            ApiKey.PRODUCE: self._produce,
        }.get(header.api_key)
        if method is None:
            return CLOSE
        return method(conn, header, request)

    def _api_versions(self, conn: FakeConnection, header: Any, request: Any) -> Any:
        keys = [{"api_key": k, "min_version": lo, "max_version": hi}
                for k, (lo, hi) in SUPPORTED_VERSIONS.items()]
        if self.api_versions_max is not None:
            keys = [dict(k, max_version=self.api_versions_max)
                    if k["api_key"] == ApiKey.API_VERSIONS else k for k in keys]
            if header.api_version > self.api_versions_max:
                # Kafka's answer to a version it does not know: the v0 layout, error 35, and
                # its own ApiVersions range so the client can retry.
                return self.response(ApiKey.API_VERSIONS, 0, {
                    "error_code": 35,
                    "api_keys": [k for k in keys if k["api_key"] == ApiKey.API_VERSIONS]})
        return self.response(ApiKey.API_VERSIONS, header.api_version, {
            "error_code": 0, "api_keys": keys, "throttle_time": 0})

    def _metadata(self, conn: FakeConnection, header: Any, request: Any) -> Any:
        names = list(self.topics) if not request.topics else [t.name for t in request.topics]
        topics = []
        for name in names:
            n = self.topics.get(name)
            topics.append({
                "error_code": 0 if n else 3, "name": name, "topic_id": uuid.UUID(int=0),
                "is_internal": False, "topic_authorized_operations": -2147483648,
                "partitions": [{"error_code": 0, "partition_index": p, "leader_id": 0,
                                "leader_epoch": 0, "replica_nodes": [0], "isr_nodes": [0],
                                "offline_replicas": []} for p in range(n or 0)],
            })
        return self.response(ApiKey.METADATA, header.api_version, {
            "throttle_time": 0, "cluster_id": "fake", "controller_id": 0,
            "brokers": [{"node_id": 0, "host": "127.0.0.1", "port": self.port, "rack": None}],
            "topics": topics, "cluster_authorized_operations": -2147483648})

    def _init_producer_id(self, conn: FakeConnection, header: Any, request: Any) -> Any:
        with self.lock:
            pid = self.next_producer_id
            self.next_producer_id += 1
        return self.response(ApiKey.INIT_PRODUCER_ID, header.api_version, {
            "throttle_time": 0, "error_code": 0, "producer_id": pid, "producer_epoch": 0})

    def _produce(self, conn: FakeConnection, header: Any, request: Any) -> Any:
        topics = []
        for topic in request.topic_data:
            parts = []
            for pdata in topic.partition_data:
                tp = (topic.name, int(pdata.index))
                with self.lock:
                    self.produced += [(tp[0], tp[1], h) for _, h in split_batches(pdata.records)]
                code, base = 0, -1
                faults = self.produce_faults.get(tp)
                fault = faults.popleft() if faults else None
                outcome = fault(conn) if fault is not None else None
                if outcome is CLOSE:
                    self._append(tp, bytes(pdata.records))
                    return CLOSE  # written, but the answer is lost
                if isinstance(outcome, int):
                    code = outcome
                else:
                    code, base = self._append(tp, bytes(pdata.records))
                parts.append({"index": tp[1], "error_code": code, "base_offset": base,
                              "log_append_time": -1, "log_start_offset": 0,
                              "record_errors": [], "error_message": None})
            topics.append({"name": topic.name, "partition_responses": parts})
        return self.response(ApiKey.PRODUCE, header.api_version,
                             {"responses": topics, "throttle_time": 0})

    def _append(self, tp: tuple[str, int], records: bytes) -> tuple[int, int]:
        with self.lock:
            base = -1
            for pos, h in split_batches(records):
                size = h.size
                if h.producer_id >= 0:
                    key = (h.producer_id, tp[0], tp[1])
                    recent = self.sequences.setdefault(key, [])
                    for first, last, offset in recent[-5:]:
                        if first == h.base_sequence and last == h.last_sequence:
                            return 46, offset  # DUPLICATE_SEQUENCE_NUMBER
                    expected = recent[-1][1] + 1 if recent else 0
                    if h.base_sequence != expected:
                        return 45, -1  # OUT_OF_ORDER_SEQUENCE_NUMBER
                offset = self.next_offset[tp]
                if base < 0:
                    base = offset
                self.logs[tp].append((parse_header(records, pos), records[pos : pos + size]))
                self.next_offset[tp] = offset + h.records_count
                if h.producer_id >= 0:
                    recent.append((h.base_sequence, h.last_sequence, offset))
            self.changed.notify_all()
            return 0, base


@pytest.fixture
def fake_broker():
    brokers: list[FakeBroker] = []

    def start(topics: dict[str, int] | None = None, **kwargs: Any) -> FakeBroker:
        broker = FakeBroker(topics, **kwargs)
        brokers.append(broker)
        return broker

    yield start
    for broker in brokers:
        broker.close()


# ================================================================================================
# end of the client tests section
# ================================================================================================


# -- cluster tests --------------------------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that starts ZooKeeper (through the zookeeper_server fixture, however
    indirectly) is a ``cluster`` test, so that the fast tier (-m "not cluster") leaves it out
    without each test having to say so."""
    for item in items:
        if "zookeeper_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


def require_zookeeper() -> None:
    """Skip the test, saying why, on a machine without Debian's ZooKeeper (and Java)."""
    from oncelog.harness.zookeeper import ZooKeeperNotFoundError, find_zookeeper

    try:
        find_zookeeper()
    except ZooKeeperNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory):
    """One ZooKeeper server for the session's cluster tests (each test takes a chroot of its
    own)."""
    from oncelog.harness.zookeeper import ZooKeeperServer

    require_zookeeper()
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), fsync=False,
                             die_with_parent=True)
    server.start()
    yield server
    server.stop()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something true (returned), or fail after
    ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.02)
