"""The one way a request reaches a group or transaction coordinator (aiokafka's coordinator
request handlers, Kafka's TxnRequestHandler / CoordinatorResponseHandler).

A *handler* says what to send (``create_request``) and what the answer means
(``handle_response``: done, retry after a backoff, or find the coordinator again; raising fails
the request). A ``CoordinatorCall`` takes one handler to its end, sans IO: it finds the
coordinator (FindCoordinator, cached per key in ``Coordinators``), sends, finds it again when
the answer is NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE or the node is unreachable, backs off
(jittered, exponential: backoff.py) while the coordinator is busy, and gives up at its deadline
with the handler's ``timeout_error``. It never touches a socket: ``poll`` says what to send next
(or how long to wait), and ``on_response`` / ``on_failure`` take back what happened.

Three things drive calls: ``do`` below, on the caller's thread (the admin client, the consumer's
group coordinator); the producer's sender thread, for the transaction manager's calls
(sender.py); and the in-memory pair of the tests, straight into the broker's coordinator core.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import (
    CoordinatorNotAvailableError,
    KafkaError,
    NetworkError,
    NotCoordinatorError,
    RetriableError,
    error_for_code,
)
from ..protocol import ApiKey
from . import retries
from .backoff import ExponentialBackoff
from .connection import RequestValues
from .errors import KafkaTimeoutError

if TYPE_CHECKING:
    from .network import NetworkClient

KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION = 0, 1
# Answers that mean "ask FindCoordinator again": the coordinator moved or is not there yet.
COORDINATOR_MOVED = frozenset({NotCoordinatorError.code, CoordinatorNotAvailableError.code})


class Action(enum.Enum):
    DONE = "done"  # the call ends; its result is the response
    RETRY = "retry"  # send again to the same coordinator, after a backoff
    RETRY_NOW = "retry now"  # send again at once (the request changed: JoinGroup's member id)
    FIND_COORDINATOR = "find coordinator"  # forget the coordinator, back off, find it again


@dataclass(frozen=True)
class BrokerVersions:
    """What the node a request goes to offers: API version ranges and finalized features."""

    api_versions: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    features: Mapping[str, int] = field(default_factory=dict)


class CoordinatorRequestHandler:
    """One request to the coordinator of ``key``. Subclasses set ``api`` and implement
    ``create_request`` and ``handle_response``; ``last_error`` is the error of the last
    retriable answer (for the timeout's message)."""

    api: ApiKey
    key_type: int = KEY_TYPE_TRANSACTION
    key: str = ""
    timeout_ms: int | None = None  # a request timeout of its own (JoinGroup waits long)
    last_error: KafkaError | None = None

    @property
    def max_version(self) -> int | None:
        return None

    def create_request(self, broker: BrokerVersions) -> RequestValues:
        raise NotImplementedError

    def handle_response(self, response: Any) -> Action:
        raise NotImplementedError

    def retriable(self, code: int, what: str) -> Action:
        """The usual answer to a retriable error code: find the coordinator again when it
        moved, back off otherwise (CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS)."""
        self.last_error = error_for_code(code)(what)
        return Action.FIND_COORDINATOR if code in COORDINATOR_MOVED else Action.RETRY

    def timeout_error(self, last: BaseException | None) -> BaseException:
        """What the call fails with at its deadline."""
        return KafkaTimeoutError(f"{self.api.name} did not complete in time"
                                 + (f": {last}" if last else ""))


@dataclass(frozen=True)
class Node:
    node_id: int
    host: str
    port: int


class Coordinators:
    """The coordinator found for each (key type, key), until it is found wrong."""

    def __init__(self) -> None:
        self._nodes: dict[tuple[int, str], Node] = {}

    def get(self, key_type: int, key: str) -> Node | None:
        return self._nodes.get((key_type, key))

    def set(self, key_type: int, key: str, node: Node) -> None:
        self._nodes[(key_type, key)] = node

    def forget(self, key_type: int, key: str) -> None:
        self._nodes.pop((key_type, key), None)


@dataclass(eq=False)
class Send:
    """A request the call wants sent now. ``node`` None: to any node (FindCoordinator);
    ``address``: where the node is, from FindCoordinator (it may not be in the metadata)."""

    call: CoordinatorCall
    api: ApiKey
    node: int | None
    address: tuple[str, int] | None
    max_version: int | None
    timeout_ms: int

    def values(self, broker: BrokerVersions) -> RequestValues | None:
        """The body for the node's versions; None when the handler refused to build it (the
        call has failed)."""
        return self.call.values(self, broker)


class CoordinatorCall:
    def __init__(self, handler: CoordinatorRequestHandler, deadline: float,
                 backoff: ExponentialBackoff, coordinators: Coordinators,
                 request_timeout_ms: int) -> None:
        self.handler = handler
        self.deadline = deadline
        self.backoff = backoff
        self.coordinators = coordinators
        self.request_timeout_ms = request_timeout_ms
        self.attempts = 0
        self.retry_at = 0.0
        self.in_flight: Send | None = None
        self.done = False
        self.response: Any = None
        self.error: BaseException | None = None
        self.last_error: BaseException | None = None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.response

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.done, self.error, self.in_flight = True, error, None

    # -- what to do next -----------------------------------------------------------------------

    def poll(self, now: float) -> Send | float | None:
        """The request to send now, or how long to wait (seconds); None once done or while a
        request is in flight."""
        if self.done or self.in_flight is not None:
            return None
        if now < self.retry_at:
            return self.retry_at - now
        if now >= self.deadline:
            self.fail(self.handler.timeout_error(self.last_error or self.handler.last_error))
            return None
        h = self.handler
        timeout_ms = min(int((self.deadline - now) * 1000), self.request_timeout_ms)
        found = self.coordinators.get(h.key_type, h.key)
        if found is None:
            send = Send(self, ApiKey.FIND_COORDINATOR, None, None, None, max(timeout_ms, 1))
        else:
            send = Send(self, h.api, found.node_id, (found.host, found.port), h.max_version,
                        h.timeout_ms if h.timeout_ms is not None else max(timeout_ms, 1))
        self.in_flight = send
        return send

    def values(self, send: Send, broker: BrokerVersions) -> RequestValues | None:
        h = self.handler
        if send.api == ApiKey.FIND_COORDINATOR:
            return {"key": h.key, "key_type": h.key_type, "coordinator_keys": [h.key]}
        try:
            return h.create_request(broker)
        except KafkaError as exc:
            self.fail(exc)
            return None

    # -- what happened -------------------------------------------------------------------------

    def on_response(self, send: Send, response: Any, now: float) -> None:
        if send is not self.in_flight:
            return  # abandoned (the call ended meanwhile)
        self.in_flight = None
        if send.api == ApiKey.FIND_COORDINATOR:
            self._found(response, now)
            return
        try:
            action = self.handler.handle_response(response)
        except KafkaError as exc:
            self.fail(exc)
            return
        if action is Action.DONE:
            self.done, self.response = True, response
        elif action is Action.RETRY_NOW:
            self.retry_at = 0.0
        else:
            if action is Action.FIND_COORDINATOR:
                self.coordinators.forget(self.handler.key_type, self.handler.key)
            self._back_off(now, self.handler.last_error)

    def on_failure(self, send: Send, error: KafkaError, now: float) -> None:
        """The request got no answer: the node is unreachable, the connection dropped, or the
        request timed out. Only retriable failures are retried."""
        if send is not self.in_flight:
            return
        self.in_flight = None
        if not isinstance(error, RetriableError):
            self.fail(error)
            return
        if send.node is not None:
            # The coordinator's broker may be gone: its partition has moved on, or will.
            self.coordinators.forget(self.handler.key_type, self.handler.key)
        self._back_off(now, error)

    def _found(self, response: Any, now: float) -> None:
        h = self.handler
        found = response.coordinators[0] if hasattr(response, "coordinators") else response
        code = int(found.error_code)
        if code == 0:
            self.coordinators.set(h.key_type, h.key, Node(int(found.node_id), found.host,
                                                          int(found.port)))
            return  # the request itself goes out at the next poll
        error = error_for_code(code)(f"FindCoordinator {h.key!r}: {found.error_message}")
        if not isinstance(error, RetriableError):
            self.fail(error)
            return
        self._back_off(now, error)

    def _back_off(self, now: float, error: BaseException | None) -> None:
        self.last_error = error
        delay = self.backoff.backoff(self.attempts)
        self.attempts += 1
        if now + delay >= self.deadline:
            # Waiting would end past the deadline: give up now rather than after it.
            self.fail(self.handler.timeout_error(error))
        else:
            self.retry_at = now + delay
            retries.note(self.handler.api.name, error, self.attempts + 1, self.deadline - now)


def do(net: NetworkClient, coordinators: Coordinators, handler: CoordinatorRequestHandler,
       deadline: float) -> Any:
    """Run ``handler`` to its end on the caller's thread; the response it was done with."""
    call = CoordinatorCall(handler, deadline, net.retry_backoff, coordinators,
                           net.config.request_timeout_ms)
    failed: set[int] = set()
    while True:
        step = call.poll(time.monotonic())
        if call.done:
            return call.result()
        if isinstance(step, float):
            net.sleep(step)
            continue
        assert step is not None
        node = step.node if step.node is not None else net.least_loaded_node(failed)
        if node is not None and step.address is not None:
            net.learn_address(node, *step.address)
        conn = net.connection(node) if node is not None else None
        if conn is None or node is None:
            if node is not None:
                failed.add(node)
            call.on_failure(step, net.unreachable(node) if node is not None else
                            NetworkError("no node is reachable"), time.monotonic())
            continue
        values = step.values(BrokerVersions(conn.api_versions, conn.features))
        if values is None:
            continue
        try:
            response = net.request(node, step.api, values, timeout_ms=step.timeout_ms,
                                   max_version=step.max_version)
        except KafkaError as exc:
            if isinstance(exc, RetriableError):
                failed.add(node)
            call.on_failure(step, exc, time.monotonic())
        else:
            failed.discard(node)
            call.on_response(step, response, time.monotonic())
