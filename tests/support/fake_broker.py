"""Brokers for the client tests other than ours: librdkafka's mock cluster (a second,
independent implementation of the protocol to check our client against) and FakeBroker, a
scripted broker speaking real Kafka framing for failures a real broker will not produce on
demand (lost responses, NOT_LEADER, ...). The fixtures are in tests/conftest.py."""

from __future__ import annotations

import collections
import logging
import re
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

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
