"""The broker's metrics (spec 000, "Metrics"), as Prometheus text over HTTP.

Kafka exposes its metrics through JMX; oncelog serves the same figures as a Prometheus page at
``http://HOST:PORT/metrics`` when ``metrics.port`` is set (``oncelog broker --metrics-port
9404``): the Prometheus text format 0.0.4, or OpenMetrics 1.0.0 when the scraper asks for it
(``Accept: application/openmetrics-text``, as Prometheus does). Every family has one ``# HELP``
and one ``# TYPE``, its samples together; counters end in ``_total``; a histogram has its
``_bucket{le=...}``, ``_sum`` and ``_count``. docs/metrics.md lists the families.

Gauges are computed when the page is read, from the state the broker already keeps; the few
counters the hot path keeps (bytes and messages per topic, requests and their latency per API,
connections) are plain integer adds (server/broker_stats.py). Components add their own samples
through a ``metric_samples()`` method (the coordinators) or ``broker.stats.add_source(fn)`` (any
module: ``fn()`` yields ``Sample``s, of any type).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .topics import INTERNAL_TOPICS

log = logging.getLogger("oncelog.metrics")

MAX_REQUEST_HEAD = 8192

GAUGE, COUNTER, HISTOGRAM, SUMMARY = "gauge", "counter", "histogram", "summary"
_SUFFIXES = {GAUGE: ("",), COUNTER: ("",), HISTOGRAM: ("_bucket", "_sum", "_count"),
             SUMMARY: ("_sum", "_count")}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TEXT = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class Sample(NamedTuple):
    """One sample of the family ``name``. A counter's name ends in ``_total`` (the sample's
    name in both formats; OpenMetrics' ``# TYPE`` line names the family without it). A
    histogram's or summary's samples carry the family's name and a ``suffix`` (``_bucket``
    with an ``le`` label, ``_sum``, ``_count``): ``histogram()`` and ``summary()`` make them.
    Samples of a family may come in any order and from several sources: the page groups them."""

    name: str
    help: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()
    type: str = GAUGE
    suffix: str = ""


def histogram(name: str, help: str, bounds: Sequence[float], counts: Sequence[int],
              total: float, labels: tuple[tuple[str, str], ...] = ()) -> list[Sample]:
    """A histogram's samples from per-bucket counts: ``counts[i]`` observations in
    (bounds[i-1], bounds[i]], the last beyond the last bound (``+Inf``)."""
    out, running = [], 0
    for bound, n in zip((*bounds, math.inf), counts, strict=True):
        running += n
        out.append(Sample(name, help, running, (*labels, ("le", _number(bound))), HISTOGRAM,
                          "_bucket"))
    out.append(Sample(name, help, total, labels, HISTOGRAM, "_sum"))
    out.append(Sample(name, help, running, labels, HISTOGRAM, "_count"))
    return out


def summary(name: str, help: str, total: float, count: int,
            labels: tuple[tuple[str, str], ...] = ()) -> list[Sample]:
    """A summary without quantiles: its ``_sum`` and ``_count``."""
    return [Sample(name, help, total, labels, SUMMARY, "_sum"),
            Sample(name, help, count, labels, SUMMARY, "_count")]


# -- the families ------------------------------------------------------------------------------

def _shown(broker) -> bool:
    """``metrics.internal.topics``: whether per-topic and per-partition families include
    ``__consumer_offsets`` and ``__transaction_state`` (100 partitions by default)."""
    return broker.config.flag("metrics.internal.topics")


def partition_samples(broker) -> Iterable[Sample]:
    total = 0
    internal = _shown(broker)
    for p in broker.topics.all_partitions():
        plog = p.log
        live = len(plog.producer_state.producers)
        total += live
        if not internal and p.topic in INTERNAL_TOPICS:
            continue
        labels = (("topic", p.topic), ("partition", str(p.index)))
        yield Sample("oncelog_partition_live_producer_ids",
                     "producer ids with state in this partition", live, labels)
        yield Sample("oncelog_partition_last_stable_offset",
                     "the partition's last stable offset", plog.last_stable_offset, labels)
        yield Sample("oncelog_partition_high_watermark",
                     "the partition's high watermark", plog.high_watermark, labels)
        yield Sample("oncelog_partition_open_transactions",
                     "transactions open in this partition",
                     len(plog.producer_state.open_transactions()), labels)
        # Kafka's kafka.log:type=Log,name=Size|LogStartOffset|LogEndOffset|NumLogSegments
        yield Sample("oncelog_log_size_bytes", "bytes of the partition's log segments",
                     plog.size_bytes, labels)
        yield Sample("oncelog_log_start_offset", "the partition's log start offset",
                     plog.log_start_offset, labels)
        yield Sample("oncelog_log_end_offset", "the partition's log end offset",
                     plog.log_end_offset, labels)
        yield Sample("oncelog_log_segments", "segments of the partition's log",
                     len(plog.segments), labels)
    yield Sample("oncelog_live_producer_ids",
                 "producer ids with state, summed over partitions", total)


def replication_samples(broker) -> Iterable[Sample]:
    """Kafka's ReplicaManager gauges (PartitionCount, LeaderCount, UnderReplicatedPartitions,
    UnderMinIsrPartitionCount) over the partitions this broker leads, and the controller's
    OfflinePartitionsCount and ActiveControllerCount (the controller alone reports offline
    partitions, so that a sum over brokers counts each once). Internal topics count: these
    are the cluster's health, whatever ``metrics.internal.topics`` says."""
    replicas = broker.replication.replicas
    leaders = [r for r in replicas.values() if r.is_leader]
    under = sum(1 for r in leaders if len(r.isr) < len(r.replicas))
    under_min = sum(1 for r in leaders if len(r.isr) < r.log.config.min_insync_replicas)
    yield Sample("oncelog_partitions", "partitions with a replica on this broker",
                 len(replicas))
    yield Sample("oncelog_leader_partitions", "partitions this broker leads", len(leaders))
    yield Sample("oncelog_under_replicated_partitions",
                 "partitions this broker leads whose ISR lacks a replica", under)
    yield Sample("oncelog_under_min_isr_partitions",
                 "partitions this broker leads with fewer in-sync replicas than "
                 "min.insync.replicas", under_min)
    view = broker.metadata.view
    active = view is not None and view.controller_id == broker.node_id
    offline = 0
    if active:
        offline = sum(1 for name, a in view.topics.items() for index in a.partitions
                      if view.leader(name, index) is None)
    yield Sample("oncelog_active_controller", "1 on the cluster's controller, else 0",
                 int(active))
    yield Sample("oncelog_offline_partitions",
                 "partitions without a live leader (reported by the controller)", offline)


def log_cleaner_samples(cleaner) -> list[Sample]:
    """Kafka's LogCleaner and LogCleanerManager gauges (log/log_cleaner.py)."""
    worst, uncleanable = cleaner.dirty_and_uncleanable()
    return [
        Sample("oncelog_log_cleaner_max_dirty_ratio",
               "max-dirty-percent: the highest dirty ratio of a compacted log (0 to 1)", worst),
        Sample("oncelog_log_cleaner_recopy_ratio",
               "cleaner-recopy-percent: bytes the last cleaning wrote over bytes it read "
               "(0 to 1)", cleaner.last_recopy_percent / 100),
        Sample("oncelog_log_cleaner_buffer_utilization_ratio",
               "max-buffer-utilization-percent: how full the offset map was in the last "
               "cleaning (0 to 1)", cleaner.last_buffer_utilization_percent / 100),
        Sample("oncelog_log_cleaner_clean_time_seconds", "how long the last cleaning took",
               cleaner.last_clean_secs),
        Sample("oncelog_log_cleaner_cleanings_total", "cleanings done", cleaner.cleanings,
               type=COUNTER),
        Sample("oncelog_log_cleaner_uncleanable_partitions",
               "compacted logs the cleaner gave up on until a restart", uncleanable),
    ]


def collect(broker) -> list[Sample]:
    samples = list(partition_samples(broker))
    samples.extend(replication_samples(broker))
    samples.extend(broker.stats.samples(broker, _visible_topics(broker)))
    if getattr(broker, "log_cleaner", None) is not None:
        samples.extend(log_cleaner_samples(broker.log_cleaner))
    for component in (getattr(broker, "txn_coordinator", None),
                      getattr(broker, "group_coordinator", None),
                      getattr(broker, "txn_verifier", None)):
        more = getattr(component, "metric_samples", None)
        if more is not None:
            samples.extend(more())
    for source in broker.stats.sources:
        samples.extend(source())
    return samples


def _visible_topics(broker) -> set[str]:
    """The topics that exist, less the internal ones unless ``metrics.internal.topics``: the
    per-topic counters of a deleted topic go with it, as Kafka removes its metrics."""
    names = set(broker.topics.topics)
    return names if _shown(broker) else names - INTERNAL_TOPICS


# -- the text formats --------------------------------------------------------------------------

def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _value(value: float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return _number(value)


def render(samples: Iterable[Sample], openmetrics: bool = False) -> str:
    """The page: each family's ``# HELP``, ``# TYPE`` and samples together, in the order the
    families first appear. Prometheus text format 0.0.4; with ``openmetrics``, OpenMetrics
    1.0.0 (a counter's family named without ``_total``, ``# EOF`` at the end). A family named
    twice with different types, a counter not ending in ``_total`` or a name Prometheus
    refuses is a programming error: ValueError."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for s in samples:
        family = families.get(s.name)
        if family is None:
            _check_family(s)
            family = families[s.name] = (s.type, s.help, [])
        elif family[0] != s.type:
            raise ValueError(f"metric {s.name} is both a {family[0]} and a {s.type}")
        if s.suffix not in _SUFFIXES[s.type]:
            raise ValueError(f"metric {s.name}: a {s.type} has no {s.suffix!r} samples")
        name = s.name + s.suffix
        if s.labels:
            labels = ",".join(f'{k}="{_escape(str(v))}"' for k, v in s.labels)
            family[2].append(f"{name}{{{labels}}} {_value(s.value)}")
        else:
            family[2].append(f"{name} {_value(s.value)}")
    lines: list[str] = []
    for name, (kind, help_text, body) in families.items():
        shown = name[:-len("_total")] if openmetrics and kind == COUNTER else name
        lines.append(f"# HELP {shown} {_escape_help(help_text)}")
        lines.append(f"# TYPE {shown} {kind}")
        lines.extend(body)
    if openmetrics:
        lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _check_family(s: Sample) -> None:
    if s.type not in _SUFFIXES:
        raise ValueError(f"metric {s.name}: unknown type {s.type!r}")
    if not _NAME.match(s.name):
        raise ValueError(f"metric name {s.name!r} is not a Prometheus name")
    if s.type == COUNTER and not s.name.endswith("_total"):
        raise ValueError(f"counter {s.name} must end in _total")


def wants_openmetrics(accept: str) -> bool:
    """Prometheus asks for OpenMetrics first in its Accept header (client_python decides the
    same way); every other scraper gets the 0.0.4 text format."""
    return "application/openmetrics-text" in accept


# -- the HTTP server ---------------------------------------------------------------------------

def _header(head: bytes, name: bytes) -> str:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return ""


async def _serve_http(broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(request_line) >= 2 and request_line[0] == "GET" and \
                request_line[1].split("?")[0] == "/metrics":
            openmetrics = wants_openmetrics(_header(head, b"accept"))
            status = "200 OK"
            ctype = OPENMETRICS_TEXT if openmetrics else PROMETHEUS_TEXT
            body = render(collect(broker), openmetrics).encode()
        else:
            status, ctype, body = "404 Not Found", "text/plain", b"try /metrics\n"
        writer.write(f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass  # a client that does not speak HTTP gets nothing
    except Exception:
        log.exception("metrics request failed")
    finally:
        writer.close()


async def start_metrics_server(broker, host: str, port: int) -> asyncio.base_events.Server:
    return await asyncio.start_server(lambda r, w: _serve_http(broker, r, w), host, port,
                                      limit=MAX_REQUEST_HEAD, reuse_address=True)


__all__ = ["COUNTER", "GAUGE", "HISTOGRAM", "SUMMARY", "Sample", "collect", "histogram",
           "render", "start_metrics_server", "summary"]
