"""The families issue 29 added or renamed, read through the page with prometheus_client's parsers:
base units (seconds, ratios), the process's and the build's figures, error codes per API
(Kafka's ErrorsPerSec) and the event loop's lag."""

from __future__ import annotations

import platform
import time

import pytest
from support.metrics import families, openmetrics, value
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    idempotent_batch,
    metadata_request,
    produce,
)

from oncelog.server.embedded import EmbeddedBroker


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config={"metrics.port": "0"}) as b:
        b.url = f"http://127.0.0.1:{b.server.metrics_port}/metrics"
        yield b


def test_both_formats_parse_with_every_family_typed_and_in_base_units(broker):
    prom, om = families(broker.url), openmetrics(broker.url)
    assert set(prom) == set(om)
    for f in (*prom.values(), *om.values()):
        assert f.type not in ("unknown", "untyped"), f.name
        # Prometheus' base units: no milliseconds, no percentages
        assert not f.name.endswith(("_ms", "_percent")) and "_ms_" not in f.name, f.name
    for name in ("oncelog_txn_verification_time_seconds",
                 "oncelog_active_transaction_open_time_max_seconds",
                 "oncelog_txn_verification_time_max_seconds", "oncelog_event_loop_lag_seconds",
                 "oncelog_event_loop_wakeup_delay_seconds"):
        assert name in prom, name
        assert om[name].unit == "seconds", name  # OpenMetrics says it: # UNIT ... seconds


def test_process_and_build_families(broker):
    fams = families(broker.url)
    # prometheus_client's process collector: this process (the embedded broker's)
    assert value(fams, "process_cpu_seconds_total") > 0
    assert value(fams, "process_open_fds") > 0
    assert value(fams, "process_resident_memory_bytes") > 1 << 20
    assert fams["process_cpu_seconds"].type == "counter"
    [build] = fams["oncelog_build_info"].samples
    assert build.value == 1
    assert build.labels["python"] == platform.python_version()
    assert build.labels["version"] and build.labels["version"] != "unknown"
    [info] = fams["python_info"].samples
    assert info.labels["version"] == platform.python_version()


def test_error_codes_are_counted_per_api(broker):
    def errors(request: str, error: str) -> float:
        return value(families(broker.url), "oncelog_request_errors_total", request=request,
                     error=error)

    before = {("Produce", "UNKNOWN_TOPIC_OR_PARTITION"):
              errors("Produce", "UNKNOWN_TOPIC_OR_PARTITION"),
              ("Produce", "NONE"): errors("Produce", "NONE"),
              ("Metadata", "UNKNOWN_TOPIC_OR_PARTITION"):
              errors("Metadata", "UNKNOWN_TOPIC_OR_PARTITION"),
              ("CreateTopics", "TOPIC_ALREADY_EXISTS"):
              errors("CreateTopics", "TOPIC_ALREADY_EXISTS")}
    batch = idempotent_batch(-1, -1, -1, [b"x"])
    with RawConnection(broker.bootstrap_servers) as conn:
        assert produce(conn, "missing", 0, batch).error_code == 3
        conn.request(create_topics_request("there", 1))
        assert conn.request(create_topics_request("there", 1)).topics[0].error_code == 36
        assert produce(conn, "there", 0, batch).error_code == 0
        assert produce(conn, "there", 0, batch).error_code == 0
        # a Metadata request for a topic that is not there (no auto-creation by default)
        r = conn.request(metadata_request(["also-missing"], allow_auto_topic_creation=False))
        assert r.topics[0].error_code == 3
    assert errors("Produce", "UNKNOWN_TOPIC_OR_PARTITION") == \
        before["Produce", "UNKNOWN_TOPIC_OR_PARTITION"] + 1
    assert errors("Produce", "NONE") == before["Produce", "NONE"] + 2
    assert errors("CreateTopics", "TOPIC_ALREADY_EXISTS") == \
        before["CreateTopics", "TOPIC_ALREADY_EXISTS"] + 1
    assert errors("Metadata", "UNKNOWN_TOPIC_OR_PARTITION") == \
        before["Metadata", "UNKNOWN_TOPIC_OR_PARTITION"] + 1


def late_wakeups(fams, over: str) -> float:
    """Measures of the loop's lag beyond the bucket bound ``over``."""
    return value(fams, "oncelog_event_loop_wakeup_delay_seconds_count") - \
        value(fams, "oncelog_event_loop_wakeup_delay_seconds_bucket", le=over)


def test_event_loop_lag_is_measured(broker):
    fams = families(broker.url)
    assert fams["oncelog_event_loop_lag_seconds"].type == "gauge"
    assert fams["oncelog_event_loop_wakeup_delay_seconds"].type == "histogram"
    stalled = late_wakeups(fams, "0.25")
    broker.call(time.sleep, 0.8)  # the loop blocked: its next timer fires over 0.25 s late
    fams = families(broker.url)
    assert late_wakeups(fams, "0.25") == stalled + 1
    assert value(fams, "oncelog_event_loop_wakeup_delay_seconds_sum") >= 0.5
