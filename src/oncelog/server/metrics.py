"""The broker's metrics (spec 000, "Metrics"), as Prometheus text over HTTP.

Kafka exposes its metrics through JMX; oncelog serves the same figures as a Prometheus text
page at ``http://HOST:PORT/metrics`` when ``metrics.port`` is set (``oncelog broker
--metrics-port 9404``). The spec asks for three: the number of live producer ids (the size of
the producer-state maps), the last stable offset of each partition (a stuck LSO means a lost
marker or a hanging transaction) and the number of active transactional ids (the transaction
coordinator's memory). Components add their own samples through ``metric_samples()``.

Gauges are computed when the page is read, from the state the broker already keeps: nothing is
counted on the hot path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import NamedTuple

log = logging.getLogger("oncelog.metrics")

MAX_REQUEST_HEAD = 8192


class Sample(NamedTuple):
    name: str
    help: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


def partition_samples(broker) -> Iterable[Sample]:
    total = 0
    for p in broker.topics.all_partitions():
        labels = (("topic", p.topic), ("partition", str(p.index)))
        plog = p.log
        live = len(plog.producer_state.producers)
        total += live
        yield Sample("oncelog_partition_live_producer_ids",
                     "producer ids with state in this partition", live, labels)
        yield Sample("oncelog_partition_last_stable_offset",
                     "the partition's last stable offset", plog.last_stable_offset, labels)
        yield Sample("oncelog_partition_high_watermark",
                     "the partition's high watermark", plog.high_watermark, labels)
        yield Sample("oncelog_partition_open_transactions",
                     "transactions open in this partition",
                     len(plog.producer_state.open_transactions()), labels)
    yield Sample("oncelog_live_producer_ids",
                 "producer ids with state, summed over partitions", total)


def request_samples(broker) -> Iterable[Sample]:
    """Kafka's RequestsPerSec tagged by request and version (KIP-272), as a running total."""
    from ..protocol import API_NAMES

    for (api_key, version), count in sorted(broker.request_counts.items()):
        name = "".join(w.capitalize() for w in API_NAMES.get(api_key, str(api_key)).split("_"))
        yield Sample("oncelog_requests_total", "requests decoded, by API and version", count,
                     (("request", name), ("version", str(version))))


def log_cleaner_samples(cleaner) -> list[Sample]:
    """Kafka's LogCleaner and LogCleanerManager gauges (log/log_cleaner.py)."""
    worst, uncleanable = cleaner.dirty_and_uncleanable()
    return [
        Sample("oncelog_log_cleaner_max_dirty_percent",
               "the highest dirty ratio of a compacted log, percent", 100.0 * worst),
        Sample("oncelog_log_cleaner_recopy_percent",
               "bytes the last cleaning wrote over bytes it read, percent",
               cleaner.last_recopy_percent),
        Sample("oncelog_log_cleaner_buffer_utilization_percent",
               "how full the offset map was in the last cleaning, percent",
               cleaner.last_buffer_utilization_percent),
        Sample("oncelog_log_cleaner_clean_time_seconds", "how long the last cleaning took",
               cleaner.last_clean_secs),
        Sample("oncelog_log_cleaner_cleanings", "cleanings done", cleaner.cleanings),
        Sample("oncelog_log_cleaner_uncleanable_partitions",
               "compacted logs the cleaner gave up on until a restart", uncleanable),
    ]


def collect(broker) -> list[Sample]:
    samples = list(partition_samples(broker))
    samples.extend(request_samples(broker))
    if getattr(broker, "log_cleaner", None) is not None:
        samples.extend(log_cleaner_samples(broker.log_cleaner))
    for component in (getattr(broker, "txn_coordinator", None),
                      getattr(broker, "group_coordinator", None),
                      getattr(broker, "txn_verifier", None)):
        more = getattr(component, "metric_samples", None)
        if more is not None:
            samples.extend(more())
    return samples


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(samples: Iterable[Sample]) -> str:
    """Prometheus text exposition format 0.0.4: HELP and TYPE once per metric name."""
    lines: list[str] = []
    seen: set[str] = set()
    for s in samples:
        if s.name not in seen:
            seen.add(s.name)
            lines.append(f"# HELP {s.name} {s.help}")
            lines.append(f"# TYPE {s.name} gauge")
        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels)
        value = int(s.value) if float(s.value).is_integer() else s.value
        lines.append(f"{s.name}{{{labels}}} {value}" if labels else f"{s.name} {value}")
    return "\n".join(lines) + "\n"


async def _serve_http(broker, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(request_line) >= 2 and request_line[0] == "GET" and \
                request_line[1].split("?")[0] == "/metrics":
            status, ctype = "200 OK", "text/plain; version=0.0.4; charset=utf-8"
            body = render(collect(broker)).encode()
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
