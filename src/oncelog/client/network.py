"""Connections to every broker a client talks to, and the cluster metadata that names them.

Like the Java client's NetworkClient: bootstrap servers stand in as nodes -1, -2, ... until the
first metadata response names the real brokers; ``poll`` waits on every connection at once and
returns the requests that finished (answered or failed). Owned by one thread; another thread may
only call ``wakeup()`` to cut a ``poll`` short.
"""

from __future__ import annotations

import logging
import random
import selectors
import socket
import ssl
import time
from typing import Any

from ..errors import (
    IllegalSaslStateError,
    KafkaError,
    NetworkError,
    RetriableError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)
from ..protocol import ApiKey
from ..security.tls import client_ssl_context
from . import retries
from .backoff import reconnect_backoff, retry_backoff
from .config import ClientConfig
from .connection import BrokerConnection, Decoder, InFlightRequest, RequestValues
from .errors import KafkaTimeoutError, SslAuthenticationError
from .metadata import Cluster, metadata_request

log = logging.getLogger(__name__)


_AUTHENTICATION_ERRORS = (SaslAuthenticationFailedError, UnsupportedSaslMechanismError,
                          IllegalSaslStateError, SslAuthenticationError)


def ssl_context_of(config: ClientConfig) -> ssl.SSLContext | None:
    """The TLS context of an SSL or SASL_SSL client (None otherwise): ``ssl_context`` as
    given, else one built from the ``ssl_*`` settings (security/tls.py)."""
    if config.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    if config.ssl_context is not None:
        return config.ssl_context
    return client_ssl_context(cafile=config.ssl_cafile, certfile=config.ssl_certfile,
                              keyfile=config.ssl_keyfile, password=config.ssl_password,
                              check_hostname=config.ssl_check_hostname)


class NetworkClient:
    def __init__(self, config: ClientConfig, client_id: str) -> None:
        self.config = config
        self.client_id = client_id
        self.bootstrap = {-(i + 1): addr for i, addr in enumerate(config.bootstrap_servers)}
        self.cluster = Cluster()
        self._sasl: tuple[str, str, str] | None = None
        protocol = config.security_protocol
        if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            if config.sasl_plain_username is None or config.sasl_plain_password is None:
                raise ValueError(f"security.protocol={protocol} needs sasl.plain.username "
                                 "and sasl.plain.password")
            self._sasl = (config.sasl_mechanism, config.sasl_plain_username,
                          config.sasl_plain_password)
        self._ssl_context = ssl_context_of(config)  # SSL, SASL_SSL; a bad file fails here
        self._conns: dict[int, BrokerConnection] = {}
        # Coordinators' addresses from FindCoordinator: a coordinator need not be in the
        # metadata we hold (a client that has only asked its bootstrap server so far).
        self._learned: dict[int, tuple[str, int]] = {}
        self._reconnect_at: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._connect_errors: dict[int, KafkaError] = {}  # why a node's last connect failed
        # The last failed connect (to any node) since the last one that worked: what a
        # timeout names as its likely cause (read by other threads: one reference, no lock)
        self._last_connect_error: KafkaError | None = None
        self._selector = selectors.DefaultSelector()
        self._registered: dict[int, int] = {}  # node id -> fd registered in the selector
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self.last_metadata_at = 0.0
        self.retry_backoff = retry_backoff(config)
        self._reconnect_backoff = reconnect_backoff(config)
        self._done: list[InFlightRequest] = []  # finished, not yet returned by poll()

    # --- nodes ------------------------------------------------------------------------------

    def address(self, node_id: int) -> tuple[str, int] | None:
        broker = self.cluster.brokers.get(node_id)
        if broker is not None:
            return broker.host, broker.port
        return self._learned.get(node_id) or self.bootstrap.get(node_id)

    def learn_address(self, node_id: int, host: str, port: int) -> None:
        """Where ``node_id`` is, as FindCoordinator said (used while the metadata does not
        name it)."""
        if node_id >= 0:
            self._learned[node_id] = (host, port)

    def connection(self, node_id: int) -> BrokerConnection | None:
        """A connected connection to ``node_id``, connecting now if needed; None on failure.

        After a failed attempt the node is skipped for reconnect.backoff.ms, doubling up to
        reconnect.backoff.max.ms (with jitter: backoff.py), so a dead broker does not stall
        every loop iteration.
        """
        conn = self._conns.get(node_id)
        if conn is not None and conn.connected:
            return conn
        if time.monotonic() < self._reconnect_at.get(node_id, 0.0):
            return None
        addr = self.address(node_id)
        if addr is None:
            return None
        if conn is None or (conn.host, conn.port) != addr:
            conn = BrokerConnection(
                node_id, addr[0], addr[1], client_id=self.client_id,
                request_timeout_ms=self.config.request_timeout_ms,
                connect_timeout_ms=self.config.socket_connection_setup_timeout_ms,
                sasl=self._sasl, ssl_context=self._ssl_context)
            self._conns[node_id] = conn
        try:
            conn.connect()
        except KafkaError as exc:
            failures = self._failures.get(node_id, 0) + 1
            self._failures[node_id] = failures
            self._reconnect_at[node_id] = time.monotonic() + \
                self._reconnect_backoff.backoff(failures - 1)
            log.info("%s", exc)
            self._connect_errors[node_id] = exc
            self._last_connect_error = exc
            if isinstance(exc, _AUTHENTICATION_ERRORS):
                raise  # wrong credentials: retrying cannot help, tell the caller
            return None
        self._failures.pop(node_id, None)
        self._reconnect_at.pop(node_id, None)
        self._connect_errors.pop(node_id, None)
        self._last_connect_error = None
        self._register(conn)
        return conn

    def unreachable(self, node_id: int) -> NetworkError:
        """The error of a request that could not be sent: the node, and why its last
        connect failed."""
        why = self._connect_errors.get(node_id)
        return NetworkError(f"node {node_id} is not reachable"
                                     + (f": {why}" if why is not None else ""))

    def connection_error_note(self) -> str:
        """"; last connection error: ..." while the last connect failed (else ""): what a
        timeout adds to its message, e.g. a producer's metadata wait on a refused port."""
        last = self._last_connect_error
        return f"; last connection error: {last}" if last is not None else ""

    def _register(self, conn: BrokerConnection) -> None:
        old = self._registered.pop(conn.node_id, None)
        if old is not None:
            try:
                self._selector.unregister(old)
            except (KeyError, ValueError):
                pass
        fd = conn.fileno()
        if fd in self._selector.get_map():  # a closed socket of another node had this number
            stale = self._selector.get_key(fd).data
            self._selector.unregister(fd)
            if stale is not None:
                self._registered.pop(stale.node_id, None)
        self._selector.register(fd, selectors.EVENT_READ, conn)
        self._registered[conn.node_id] = fd

    def _unregister(self, node_id: int) -> None:
        fd = self._registered.pop(node_id, None)
        if fd is not None:
            try:
                self._selector.unregister(fd)
            except (KeyError, ValueError):
                pass

    def is_ready(self, node_id: int) -> bool:
        conn = self._conns.get(node_id)
        return conn is not None and conn.connected

    def in_flight_count(self, node_id: int) -> int:
        conn = self._conns.get(node_id)
        return conn.in_flight_count if conn is not None else 0

    def in_flight_total(self) -> int:
        return sum(c.in_flight_count for c in self._conns.values())

    def least_loaded_node(self, avoid: set[int] | frozenset[int] = frozenset()) -> int | None:
        """The node to ask cluster-wide questions: connected and idle first, then one not
        connected yet (allowed to try), then the connected one with the fewest requests in
        flight, as Kafka's leastLoadedNode (``avoid``: nodes that just failed, unless there is
        no other). A busy connection is not preferred over another broker: a consumer's only
        connection may be to a deposed leader that still names itself in its metadata."""
        candidates = list(self.cluster.brokers) or list(self.bootstrap)
        others = [n for n in candidates if n not in avoid]
        if others:
            candidates = others
        # from a random place in the list, as Kafka's: equally loaded nodes take turns (an
        # idle connection to a deposed leader is not the one always asked)
        start = random.randrange(len(candidates)) if candidates else 0
        candidates = candidates[start:] + candidates[:start]
        now = time.monotonic()
        best, best_load = None, None
        for node_id in candidates:
            conn = self._conns.get(node_id)
            load: tuple[int, int]
            if conn is not None and conn.connected:
                load = (conn.in_flight_count, 0)
            elif now >= self._reconnect_at.get(node_id, 0.0):
                load = (0, 1)  # unconnected but allowed to try
            else:
                continue
            if best_load is None or load < best_load:
                best, best_load = node_id, load
        if best is None and self.cluster.brokers:
            # every known broker is backing off: fall back to the bootstrap list (rebootstrap)
            for node_id in self.bootstrap:
                if now >= self._reconnect_at.get(node_id, 0.0):
                    return node_id
        return best

    # --- requests ---------------------------------------------------------------------------

    def send(self, node_id: int, api_key: int, values: RequestValues, *,
             expect_response: bool = True, context: Any = None,
             timeout_ms: int | None = None, max_version: int | None = None,
             decoder: Decoder | None = None) -> InFlightRequest | None:
        """Send to ``node_id``; None if the node cannot be reached right now."""
        conn = self.connection(node_id)
        if conn is None:
            return None
        req = conn.send(api_key, values, expect_response=expect_response, context=context,
                        timeout_ms=timeout_ms, max_version=max_version, decoder=decoder)
        return req

    def broker_versions(self, node_id: int) -> tuple[dict[int, tuple[int, int]], dict[str, int]]:
        """What a connected node offers: its API version ranges and finalized features."""
        conn = self._conns.get(node_id)
        if conn is None:
            return {}, {}
        return conn.api_versions, conn.features

    def poll(self, timeout: float) -> list[InFlightRequest]:
        """Wait up to ``timeout`` seconds for responses; return every finished request."""
        if not self._done:
            self._poll_into(timeout)
        done, self._done = self._done, []
        return done

    def sleep(self, timeout: float) -> None:
        """Wait ``timeout`` seconds while still reading sockets; finished requests are kept
        for the next ``poll`` (so a synchronous wait never loses another request's answer)."""
        end = time.monotonic() + timeout
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            self._poll_into(remaining, keep_waiting=True)

    def _poll_into(self, timeout: float, keep_waiting: bool = False) -> None:
        for conn in self._conns.values():
            self._done += conn.take_completed()
        if self._done and not keep_waiting:
            timeout = 0.0
        now = time.monotonic()
        for conn in self._conns.values():
            deadline = conn.next_deadline()
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - now))
        for key, _ in self._selector.select(max(0.0, timeout)):
            conn = key.data
            if conn is None:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except (BlockingIOError, InterruptedError):
                    pass
                continue
            self._done += conn.receive()
        now = time.monotonic()
        for conn in self._conns.values():
            conn.expire(now)
            self._done += conn.take_completed()
            if not conn.connected:
                self._unregister(conn.node_id)

    def wakeup(self) -> None:
        try:
            self._wake_w.send(b"\x00")
        except (BlockingIOError, OSError):
            pass  # a wakeup is already pending, or we are closing

    def disconnect(self, node_id: int, error: KafkaError | None = None) -> None:
        conn = self._conns.get(node_id)
        if conn is not None:
            self._unregister(node_id)
            conn.close(error)

    def close(self) -> None:
        for node_id in list(self._conns):
            self.disconnect(node_id)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # --- synchronous helpers (consumer and admin, on the caller's thread) -------------------

    def request(self, node_id: int, api_key: int, values: RequestValues,
                timeout_ms: int | None = None, max_version: int | None = None) -> Any:
        """Send and wait. Raises NetworkError if the node is unreachable."""
        req = self.send(node_id, api_key, values, timeout_ms=timeout_ms, max_version=max_version)
        if req is None:
            raise self.unreachable(node_id)
        while not req.done:
            self._poll_into(max(0.0, req.deadline - time.monotonic()), keep_waiting=True)
        self._done = [r for r in self._done if r is not req]
        return req.result()

    def request_any(self, api_key: int, values: RequestValues, deadline: float,
                    node_id: int | None = None, max_version: int | None = None,
                    single_attempt: bool = False) -> Any:
        """Send to ``node_id`` (else the least loaded node), retrying retriable failures.

        Retries network errors (with retry.backoff.ms) until ``deadline`` (monotonic seconds),
        then raises KafkaTimeoutError naming the last error. ``single_attempt``: raise the
        first network error instead (the caller picks the node again, e.g. a coordinator
        that may have moved to another broker).
        """
        last: Exception | None = None
        attempt = 0
        failed: set[int] = set()
        while True:
            target = node_id if node_id is not None else self.least_loaded_node(failed)
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise KafkaTimeoutError(
                    f"{ApiKey(api_key).name} did not complete in time"
                    + (f": {last}" if last else self.connection_error_note())) from last
            if target is not None:
                try:
                    return self.request(target, api_key, values,
                                        timeout_ms=min(remaining_ms,
                                                       self.config.request_timeout_ms),
                                        max_version=max_version)
                except RetriableError as exc:
                    if single_attempt:
                        raise
                    last = exc
                    failed.add(target)
            attempt += 1
            retries.note(ApiKey(api_key).name, last, attempt + 1, deadline - time.monotonic())
            self._backoff(attempt, deadline)

    def _backoff(self, attempt: int, deadline: float) -> None:
        delay = min(self.retry_backoff.backoff(attempt - 1), max(0.0, deadline - time.monotonic()))
        if delay > 0:
            self.sleep(delay)

    def update_metadata(self, topics: list[str] | None, deadline: float,
                        allow_auto_topic_creation: bool = True) -> Cluster:
        response = self.request_any(ApiKey.METADATA,
                                    metadata_request(topics, allow_auto_topic_creation), deadline)
        self.apply_metadata(response, topics)
        return self.cluster

    def apply_metadata(self, response: Any, topics: list[str] | None) -> None:
        self.cluster = self.cluster.with_response(response, topics)
        self.last_metadata_at = time.monotonic()
