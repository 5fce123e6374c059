"""The broker's metrics (spec 000, "Metrics"), as a Prometheus page over HTTP.

Kafka exposes its metrics through JMX; oncelog serves the same figures as a Prometheus page at
``/metrics`` of the broker's HTTP server (console/httpd.py: ``metrics.port``, and the console's
``console.port``), with the console's authentication, TLS and connection limits: the
Prometheus text format 0.0.4, or OpenMetrics 1.0.0 when the scraper asks for it (``Accept:
application/openmetrics-text``, as Prometheus does): the broker's families, written here
(five times cheaper than prometheus_client's writer: see "the page" below), then
prometheus_client's process and platform collectors (``process_cpu_seconds_total``,
``process_open_fds``, ``process_resident_memory_bytes``, ``python_info``). Every family has one ``# HELP`` and one
``# TYPE``, its samples together; counters end in ``_total``; a histogram has its
``_bucket{le=...}``, ``_sum`` and ``_count``; times are in seconds and fractions are ratios
(0 to 1), Prometheus' base units. docs/metrics.md lists the families.

Gauges are computed when the page is read, from the state the broker already keeps; the few
counters the hot path keeps (bytes and messages per topic, requests, their latency and their
error codes per API, connections) are plain integer adds (server/broker_stats.py). Components
add their own samples through a ``metric_samples()`` method (the coordinators) or
``broker.stats.add_source(fn)`` (any module: ``fn()`` yields ``Sample``s, of any type).
"""

from __future__ import annotations

import logging
import math
import platform
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple

from ..security.acls import ResourceType
from .clock import now_ms
from .topics import INTERNAL_TOPICS

if TYPE_CHECKING:
    from .stable_offsets import StableOffsetWatch

log = logging.getLogger("oncelog.metrics")

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

def partition_samples(partitions: Iterable[Any], lso_watch: StableOffsetWatch,
                      internal: bool) -> Iterable[Sample]:
    """The partitions hosted here (topics.Partition), internal topics' too with ``internal``;
    ``lso_watch`` times the LSOs left standing."""
    total = 0
    now = now_ms()
    for p in partitions:
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
        # oncelog's own (server/stable_offsets.py): an LSO held by a transaction left open
        yield Sample("oncelog_partition_last_stable_offset_stuck_seconds",
                     "seconds the last stable offset has stood still below the high watermark "
                     "(0 when it is at the high watermark)",
                     lso_watch.stuck_ms(p.topic, p.index, plog, now) / 1000, labels)
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


def replication_samples(node_id: int, replicas: Mapping[tuple[str, int], Any], view: Any
                        ) -> Iterable[Sample]:
    """Kafka's ReplicaManager gauges (PartitionCount, LeaderCount, UnderReplicatedPartitions,
    UnderMinIsrPartitionCount) over the partitions this broker leads, and the controller's
    OfflinePartitionsCount and ActiveControllerCount (the controller alone reports offline
    partitions, so that a sum over brokers counts each once). Internal topics count: these
    are the cluster's health, whatever ``metrics.internal.topics`` says. ``replicas``: the
    replica manager's (server/partition.py's Partition); ``view``: the latest ClusterView."""
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
    active = view is not None and view.controller_id == node_id
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


@cache
def build_info() -> Sample:
    """``oncelog_build_info``: worked out at the first scrape (nothing to work out
    for a broker that serves no metrics)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("oncelog")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree never installed
        ours = "unknown"
    return Sample("oncelog_build_info", "the broker's build: oncelog's and Python's versions "
                  "(Kafka's app-info version)", 1,
                  (("version", ours), ("python", platform.python_version()),
                   ("implementation", platform.python_implementation())))


def collect(broker) -> list[Sample]:
    """Every family of the broker's page: the one place that reads the broker whole (as a
    request handler does); each family is given what it counts."""
    # metrics.internal.topics: whether per-topic and per-partition families include
    # __consumer_offsets and __transaction_state (100 partitions by default)
    internal = broker.config.flag("metrics.internal.topics")
    existing = set(broker.topics.topics)
    samples = [build_info()]
    samples.extend(partition_samples(broker.topics.all_partitions(), broker.lso_watch,
                                     internal))
    samples.extend(replication_samples(broker.node_id, broker.replication.replicas,
                                       broker.metadata.view))
    # the per-topic counters of a deleted topic go with it, as Kafka removes its metrics
    samples.extend(broker.stats.samples(
        existing, existing if internal else existing - INTERNAL_TOPICS,
        broker.request_counts, broker.security))
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


# -- the page -----------------------------------------------------------------------------------
#
# The broker's families are written here, not by prometheus_client's generate_latest: on 2,000
# partitions (about 17,000 samples) building them into its Metric objects and writing them took
# 255 ms of the event loop's CPU a scrape (371 ms in OpenMetrics) against 52 ms for the whole
# page with this writer (benchmarks/bench_metrics.py), every request waiting meanwhile; written
# alone, 16,000 samples took prometheus_client 199 ms (258 ms) and this writer 54 ms (48 ms).
# prometheus_client writes the process's and the Python build's families (its collectors)
# after them, and its parsers of both formats are the tests' reference.

_UNITS = ("seconds", "bytes", "ratio")  # OpenMetrics' # UNIT, for families named in one


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


def render(samples: Iterable[Sample], openmetrics: bool = False, eof: bool = True) -> str:
    """The page: each family's ``# HELP``, ``# TYPE`` and samples together, in the order the
    families first appear. Prometheus text format 0.0.4; with ``openmetrics``, OpenMetrics
    1.0.0 (a counter's family named without ``_total``, a ``# UNIT`` for a family named in
    seconds, bytes or a ratio, ``# EOF`` at the end unless ``eof`` is false). A family named
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
        if openmetrics and (unit := shown.rpartition("_")[2]) in _UNITS:
            lines.append(f"# UNIT {shown} {unit}")
        lines.extend(body)
    if openmetrics and eof:
        lines.append("# EOF")
    return "\n".join(lines) + "\n" if lines else ""


def _check_family(s: Sample) -> None:
    if s.type not in _SUFFIXES:
        raise ValueError(f"metric {s.name}: unknown type {s.type!r}")
    if not _NAME.match(s.name):
        raise ValueError(f"metric name {s.name!r} is not a Prometheus name")
    if s.type == COUNTER and not s.name.endswith("_total"):
        raise ValueError(f"counter {s.name} must end in _total")


@cache
def _process_page(openmetrics: bool):
    """prometheus_client's writer of the process's and the Python build's families (CPU
    seconds, open descriptors, resident memory, start time; python_info), as every Prometheus
    client library exports them, read from /proc at each scrape. Imported at the first scrape:
    a broker that serves no metrics does not load prometheus_client."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_om
    from prometheus_client.platform_collector import PlatformCollector
    from prometheus_client.process_collector import ProcessCollector

    collectors = (ProcessCollector(registry=None), PlatformCollector(registry=None))

    class Collectors:
        def collect(self):
            for collector in collectors:
                yield from collector.collect()

    write, registry = (generate_om if openmetrics else generate_latest), Collectors()
    return lambda: write(registry)


# which label names a resource: a sample with one is shown to those who may describe it
_RESOURCE_LABELS = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
                    "transactional_id": ResourceType.TRANSACTIONAL_ID}


def visible(samples: Iterable[Sample], viewer) -> Iterator[Sample]:
    """The samples ``viewer`` may see (console/auth.py's Viewer; None: all of them): a sample
    labelled with a topic, a group or a transactional id only when the viewer may Describe
    it, as Kafka's Metadata, DescribeGroups and DescribeTransactions filter their answers
    (super users, and everyone without SASL, may Describe everything)."""
    if viewer is None:
        yield from samples
        return
    allowed: dict[tuple[ResourceType, str], bool] = {}
    for s in samples:
        for key, value in s.labels:
            rtype = _RESOURCE_LABELS.get(key)
            if rtype is not None:
                seen = allowed.get((rtype, value))
                if seen is None:
                    seen = allowed[rtype, value] = viewer.may_see(rtype, value)
                if not seen:
                    break
        else:
            yield s


def page(broker, viewer, openmetrics: bool) -> tuple[str, bytes]:
    """(Content-Type, body) of the metrics page as ``viewer`` may see it: the broker's
    families, then the process's and the Python build's (prometheus_client's collectors)."""
    ours = render(visible(collect(broker), viewer), openmetrics, eof=False).encode()
    # in OpenMetrics, prometheus_client's part ends in the page's # EOF
    return OPENMETRICS_TEXT if openmetrics else PROMETHEUS_TEXT, ours + _process_page(openmetrics)()


def wants_openmetrics(accept: str) -> bool:
    """Prometheus asks for OpenMetrics first in its Accept header (client_python decides the
    same way); every other scraper gets the 0.0.4 text format."""
    return "application/openmetrics-text" in accept


__all__ = ["COUNTER", "GAUGE", "HISTOGRAM", "SUMMARY", "Sample", "collect", "histogram",
           "page", "render", "summary", "visible"]
