"""The figures the broker counts as requests pass: Kafka's BrokerTopicStats (BytesInPerSec,
BytesOutPerSec, MessagesInPerSec, ReplicationBytesOutPerSec per topic), RequestMetrics'
TotalTimeMs and ErrorsPerSec per API, the selector's connection-creation and connection-close
totals, and how late the event loop wakes (a Python broker's one thread is its request handler
pool: a late wake-up is every request waiting).

Kafka keeps meters (rates); a Prometheus page serves running totals and lets ``rate()`` make the
rates. Every hook here sits on the hot path (request dispatch, produce, fetch), so each is a few
integer adds into dicts keyed by topic or API key, and a latency is filed with one bisect; the
samples are built only when the page is read (server/metrics.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable, Mapping
from functools import cache
from time import perf_counter
from typing import Any, Protocol

from kio.schema.errors import ErrorCode
from kio.serial._introspect import EntityField, EntityTupleField, classify_field

from ..log.log import AppendResult
from ..protocol import API_NAMES
from .metrics import COUNTER, GAUGE, Sample, histogram

# Upper bounds (seconds) of the request latency buckets: 0.5 ms (a metadata answer) to 30 s
# (Kafka's default request.timeout.ms); a long-poll fetch lands at its max.wait.ms (500 ms for
# Kafka's consumers).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0)


# Upper bounds (seconds) of the event loop lag buckets: a wake-up 1 ms late is a busy loop,
# one a second late a stalled broker.
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LOOP_LAG_INTERVAL_S = 0.25  # how often the loop's lateness is measured

class AuthenticationCounts(Protocol):
    """SASL authentications so far (server/security_service.py)."""

    successful_authentications: int
    failed_authentications: int


_ErrorPlan = tuple[tuple[str, ...], tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]]


@cache
def _error_plan(cls: Any) -> _ErrorPlan | None:
    """Where a response class keeps its error codes: its own ``error_code`` fields, and the
    arrays and structs below it that hold some (None: the class holds none), worked out once
    per class from its schema."""
    codes: list[str] = []
    arrays: list[tuple[str, Any]] = []
    structs: list[tuple[str, Any]] = []
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        if isinstance(kind, EntityTupleField | EntityField):
            sub = _error_plan(kind.type_)
            if sub is not None:
                (arrays if isinstance(kind, EntityTupleField) else structs).append(
                    (field.name, sub))
        elif field.metadata.get("kafka_type") == "error_code":
            codes.append(field.name)
    if not (codes or arrays or structs):
        return None
    return tuple(codes), tuple(arrays), tuple(structs)


def _count_errors(entity: Any, plan: _ErrorPlan, counts: dict[int, int]) -> None:
    codes, arrays, structs = plan
    for name in codes:
        code = getattr(entity, name)
        counts[code] = counts.get(code, 0) + 1
    for name, sub in arrays:
        for item in getattr(entity, name) or ():
            _count_errors(item, sub, counts)
    for name, sub in structs:
        item = getattr(entity, name)
        if item is not None:
            _count_errors(item, sub, counts)


def error_name(code: int) -> str:
    """Kafka's name of an error code, as its ErrorsPerSec tags it (``NONE``,
    ``UNKNOWN_TOPIC_OR_PARTITION``)."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return str(code)


def request_name(api_key: int) -> str:
    """Kafka's name of an API as its request metrics tag it (``ApiVersions``, ``Produce``)."""
    return "".join(w.capitalize() for w in API_NAMES.get(api_key, str(api_key)).split("_"))


class BrokerStats:
    def __init__(self) -> None:
        self.bytes_in: dict[str, int] = {}
        self.messages_in: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}
        self.replication_bytes_out: dict[str, int] = {}
        # api key -> observations per LATENCY_BUCKETS bucket (the last: beyond 30 s), and
        # their sum in seconds
        self.latency_buckets: dict[int, list[int]] = {}
        self.latency_sum: dict[int, float] = {}
        self.connections_created = 0
        self.connections_closed = 0
        # (api key, error code) -> error codes of that value in that API's responses
        self.errors: dict[tuple[int, int], int] = {}
        # how late the loop woke: the last measure, and per LOOP_LAG_BUCKETS bucket
        self.loop_lag = 0.0
        self.loop_lag_buckets = [0] * (len(LOOP_LAG_BUCKETS) + 1)
        self.loop_lag_sum = 0.0
        self._loop_task: asyncio.Task | None = None
        self.sources: list[Callable[[], Iterable[Sample]]] = []

    def add_source(self, source: Callable[[], Iterable[Sample]]) -> None:
        """Another module's samples on the page: ``source()`` is called at every scrape."""
        self.sources.append(source)

    # -- hot-path hooks -----------------------------------------------------------------------

    def produced(self, appended: dict, records_of: dict) -> None:
        """A Produce request's appends: Kafka's ReplicaManager.appendToLocalLog marks the
        record set's bytes of every successful append and the messages appended (none for a
        retried batch the log recognised as a duplicate)."""
        bytes_in, messages_in = self.bytes_in, self.messages_in
        for tp, result in appended.items():
            if type(result) is AppendResult:
                topic = tp[0]
                bytes_in[topic] = bytes_in.get(topic, 0) + len(records_of[tp])
                if not result.duplicate:
                    messages_in[topic] = messages_in.get(topic, 0) + \
                        result.last_offset - result.base_offset + 1

    def fetched(self, topic: str | None, size: int, replica_id: int) -> None:
        """Bytes a Fetch returns for one partition: a consumer's (BytesOutPerSec) or a
        follower's (ReplicationBytesOutPerSec), as Kafka's KafkaApis counts them apart."""
        if size and topic is not None:
            out = self.bytes_out if replica_id < 0 else self.replication_bytes_out
            out[topic] = out.get(topic, 0) + size

    def request_done(self, api_key: int, started: float) -> None:
        """A request answered, handled since ``started`` (perf_counter): Kafka's TotalTimeMs
        less the time in its request queue (a request is handled as soon as it is read) and
        the time its answer takes to leave (a large fetch's record sets go later, by
        sendfile). A long-poll fetch counts its wait, as in Kafka."""
        took = perf_counter() - started
        buckets = self.latency_buckets.get(api_key)
        if buckets is None:
            buckets = self.latency_buckets[api_key] = [0] * (len(LATENCY_BUCKETS) + 1)
            self.latency_sum[api_key] = 0.0
        buckets[bisect_left(LATENCY_BUCKETS, took)] += 1
        self.latency_sum[api_key] += took

    def response_errors(self, api_key: int, response: Any) -> None:
        """Count every error code of a response, ``NONE`` included, as Kafka's
        RequestChannel.updateErrorMetrics counts ``errorCounts()`` (ErrorsPerSec per request
        and error). The hand-written Produce and Fetch answers count theirs as they are
        written (``error_counts``); the others are walked along their schema's arrays."""
        errors = self.errors
        counts = getattr(response, "error_counts", None)
        if counts is None:
            plan = _error_plan(type(response))  # type: ignore[arg-type]
            if plan is None:
                return
            counts = {}
            _count_errors(response, plan, counts)
        for code, n in counts.items():
            key = (api_key, code)
            errors[key] = errors.get(key, 0) + n

    # -- the event loop's lag -------------------------------------------------------------

    def start_loop_monitor(self) -> None:
        """Measure, every LOOP_LAG_INTERVAL_S, how much later than asked the loop woke."""
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._watch_loop())

    def stop_loop_monitor(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None

    async def _watch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        buckets = self.loop_lag_buckets
        while True:
            asked = loop.time() + LOOP_LAG_INTERVAL_S
            await asyncio.sleep(LOOP_LAG_INTERVAL_S)
            lag = max(0.0, loop.time() - asked)
            self.loop_lag = lag
            buckets[bisect_left(LOOP_LAG_BUCKETS, lag)] += 1
            self.loop_lag_sum += lag

    # -- the page -----------------------------------------------------------------------------

    def samples(self, existing: Collection[str], topics: set[str],
                request_counts: Mapping[tuple[int, int], int],
                auth: AuthenticationCounts) -> Iterable[Sample]:
        """The counted figures; per-topic ones for ``topics`` only (those that exist and are
        shown), forgetting the counts of topics gone (not in ``existing``); the requests
        decoded by (api key, version), and ``auth``'s SASL authentications."""
        for attr, name, help_text in (
                ("bytes_in", "oncelog_bytes_in_total",
                 "BytesInPerSec: record set bytes produced to the topic"),
                ("messages_in", "oncelog_messages_in_total",
                 "MessagesInPerSec: records appended to the topic by producers"),
                ("bytes_out", "oncelog_bytes_out_total",
                 "BytesOutPerSec: record set bytes fetched from the topic by consumers"),
                ("replication_bytes_out", "oncelog_replication_bytes_out_total",
                 "ReplicationBytesOutPerSec: record set bytes fetched by follower brokers")):
            counts: dict[str, int] = getattr(self, attr)
            for topic in [t for t in counts if t not in existing]:
                del counts[topic]
            for topic in sorted(counts):
                if topic in topics:
                    yield Sample(name, help_text, counts[topic], (("topic", topic),), COUNTER)
        for (api_key, version), count in sorted(request_counts.items()):
            yield Sample("oncelog_requests_total",
                         "RequestsPerSec: requests decoded, by API and version (KIP-272)",
                         count, (("request", request_name(api_key)), ("version", str(version))),
                         COUNTER)
        for api_key, buckets in sorted(self.latency_buckets.items()):
            yield from histogram(
                "oncelog_request_total_time_seconds",
                "TotalTimeMs: from a request's decoding to its encoded answer, by API (s)",
                LATENCY_BUCKETS, buckets, self.latency_sum[api_key],
                (("request", request_name(api_key)),))
        for (api_key, code), count in sorted(self.errors.items()):
            yield Sample("oncelog_request_errors_total",
                         "ErrorsPerSec: error codes in responses (NONE included, as Kafka counts "
                         "them), by API and error", count,
                         (("request", request_name(api_key)), ("error", error_name(code))),
                         COUNTER)
        yield Sample("oncelog_event_loop_lag_seconds",
                     "how late the broker's event loop last woke from a timer "
                     f"(measured every {LOOP_LAG_INTERVAL_S} s)", self.loop_lag, type=GAUGE)
        yield from histogram(
            "oncelog_event_loop_wakeup_delay_seconds",
            "how late the broker's event loop woke from a timer, every measure",
            LOOP_LAG_BUCKETS, self.loop_lag_buckets, self.loop_lag_sum)
        yield Sample("oncelog_connections",
                     "connection-count: connections open (clients and other brokers)",
                     self.connections_created - self.connections_closed)
        yield Sample("oncelog_connection_creation_total",
                     "connection-creation-total: connections accepted",
                     self.connections_created, type=COUNTER)
        yield Sample("oncelog_connection_close_total",
                     "connection-close-total: connections closed",
                     self.connections_closed, type=COUNTER)
        yield Sample("oncelog_successful_authentication_total",
                     "successful-authentication-total: SASL authentications that succeeded",
                     auth.successful_authentications, type=COUNTER)
        yield Sample("oncelog_failed_authentication_total",
                     "failed-authentication-total: SASL authentications that failed",
                     auth.failed_authentications, type=COUNTER)
