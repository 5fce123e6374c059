"""The figures the broker counts as requests pass: Kafka's BrokerTopicStats (BytesInPerSec,
BytesOutPerSec, MessagesInPerSec, ReplicationBytesOutPerSec per topic), RequestMetrics'
TotalTimeMs per API, and the selector's connection-creation and connection-close totals.

Kafka keeps meters (rates); a Prometheus page serves running totals and lets ``rate()`` make the
rates. Every hook here sits on the hot path (request dispatch, produce, fetch), so each is a few
integer adds into dicts keyed by topic or API key, and a latency is filed with one bisect; the
samples are built only when the page is read (server/metrics.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from time import perf_counter

from ..log.log import AppendResult
from ..protocol import API_NAMES
from .metrics import COUNTER, Sample, histogram

# Upper bounds (seconds) of the request latency buckets: 0.5 ms (a metadata answer) to 30 s
# (Kafka's default request.timeout.ms); a long-poll fetch lands at its max.wait.ms (500 ms for
# Kafka's consumers).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0)


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

    # -- the page -----------------------------------------------------------------------------

    def samples(self, broker, topics: set[str]) -> Iterable[Sample]:
        """The counted figures; per-topic ones for ``topics`` only (those that exist and are
        shown), forgetting the counts of topics gone."""
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
            for topic in [t for t in counts if t not in broker.topics.topics]:
                del counts[topic]
            for topic in sorted(counts):
                if topic in topics:
                    yield Sample(name, help_text, counts[topic], (("topic", topic),), COUNTER)
        for (api_key, version), count in sorted(broker.request_counts.items()):
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
        yield Sample("oncelog_connections",
                     "connection-count: connections open (clients and other brokers)",
                     self.connections_created - self.connections_closed)
        yield Sample("oncelog_connection_creation_total",
                     "connection-creation-total: connections accepted",
                     self.connections_created, type=COUNTER)
        yield Sample("oncelog_connection_close_total",
                     "connection-close-total: connections closed",
                     self.connections_closed, type=COUNTER)
        security = broker.security
        yield Sample("oncelog_successful_authentication_total",
                     "successful-authentication-total: SASL authentications that succeeded",
                     security.successful_authentications, type=COUNTER)
        yield Sample("oncelog_failed_authentication_total",
                     "failed-authentication-total: SASL authentications that failed",
                     security.failed_authentications, type=COUNTER)
