"""The broker's metrics page (spec 000, "Metrics"): live producer ids, the last stable offset
of each partition (held back by an open transaction), as Prometheus text over HTTP."""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request

import pytest
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    idempotent_batch,
    init_producer_id_request,
    produce,
    write_txn_markers_request,
)

from oncelog.server.embedded import EmbeddedBroker


@pytest.fixture
def broker():
    with EmbeddedBroker(config={"metrics.port": "0"}) as b:
        yield b


def scrape(broker) -> dict[str, float]:
    url = f"http://127.0.0.1:{broker.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.fullmatch(r"(\S+) (\S+)", line)
        assert m, line
        out[m.group(1)] = float(m.group(2))
    return out


def test_lso_and_live_producer_ids_are_exposed(broker):
    key = '{topic="m",partition="0"}'
    with RawConnection(broker.bootstrap_servers) as conn:
        conn.request(create_topics_request("m", 1))
        pids = [conn.request(init_producer_id_request()).producer_id for _ in range(2)]
        produce(conn, "m", 0, idempotent_batch(pids[0], 0, 0, [b"a", b"b"]))
        produce(conn, "m", 0, idempotent_batch(pids[1], 0, 0, [b"t"], is_transactional=True))
        produce(conn, "m", 0, idempotent_batch(pids[0], 0, 2, [b"c"]))
        m = scrape(broker)
        assert m[f"oncelog_partition_live_producer_ids{key}"] == 2
        assert m[f"oncelog_partition_high_watermark{key}"] == 4
        assert m[f"oncelog_partition_last_stable_offset{key}"] == 2  # the open transaction
        assert m[f"oncelog_partition_open_transactions{key}"] == 1
        assert m["oncelog_live_producer_ids"] == 2
        conn.request(write_txn_markers_request(pids[1], 0, True, [("m", 0)]))
        m = scrape(broker)
        assert m[f"oncelog_partition_last_stable_offset{key}"] == 5
        assert m[f"oncelog_partition_open_transactions{key}"] == 0


def test_other_paths_and_garbage_do_not_hurt_the_broker(broker):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{broker.server.metrics_port}/", timeout=10)
    assert e.value.code == 404
    with socket.create_connection(("127.0.0.1", broker.server.metrics_port), timeout=10) as s:
        s.sendall(b"\x00" * 20000)  # no end of headers within the limit: 431, as the console
        assert s.recv(100).startswith(b"HTTP/1.1 431 ")
    assert "oncelog_live_producer_ids" in scrape(broker)


def test_metrics_are_off_unless_asked_for(embedded_broker):
    assert embedded_broker.server.metrics_port is None


def test_active_transactional_ids_and_groups_are_counted(broker):
    from oncelog import Admin, Consumer, NewTopic, Producer

    assert scrape(broker)["oncelog_active_transactional_ids"] == 0
    with Admin(bootstrap_servers=broker.bootstrap_servers) as a:
        a.create_topics([NewTopic("m", 1)])  # offsets are committed for partitions that exist
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="m1") as p:
        p.init_transactions()
    with Consumer(bootstrap_servers=broker.bootstrap_servers, group_id="mg") as c:
        c.commit({("m", 0): 1})
    m = scrape(broker)
    assert m["oncelog_active_transactional_ids"] == 1 and m["oncelog_groups"] == 1


def test_verification_and_open_transaction_time_are_exposed(broker):
    """KIP-890's VerificationTimeMs / VerificationFailureRate and KIP-939's
    active-transaction-open-time-max."""
    import time

    from oncelog import Producer

    m = scrape(broker)
    assert m["oncelog_txn_verification_total"] == 0
    assert m["oncelog_active_transaction_open_time_max_seconds"] == 0
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="mv",
                  linger_ms=0) as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("mv", b"x").result(10)  # the leader adds the partition (transaction version 2)
        time.sleep(0.2)
        m = scrape(broker)
        assert m["oncelog_txn_verification_total"] == 1
        assert m["oncelog_txn_verification_failures_total"] == 0
        assert m["oncelog_txn_verification_time_max_seconds"] > 0
        assert m["oncelog_active_transaction_open_time_max_seconds"] >= 0.2
        p.commit_transaction()
    assert scrape(broker)["oncelog_active_transaction_open_time_max_seconds"] == 0


def test_label_values_and_help_are_escaped_for_both_parsers():
    """A label value may hold anything (a group id, a transactional id): quotes, backslashes
    and newlines are escaped so that both reference parsers read back what was written."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
    from prometheus_client.parser import text_string_to_metric_families as prom

    from oncelog.server.metrics import COUNTER, Sample, histogram, render

    odd = 'a "quoted" \\ back\nslash'
    samples = [Sample("x_total", "help with \\ and\nnewline", 3, (("group", odd),), COUNTER),
               *histogram("lat_seconds", "h", (0.1, 1.0), [1, 0, 2], 7.5, (("group", odd),)),
               Sample("x_total", "help with \\ and\nnewline", 4, (("group", "plain"),), COUNTER)]
    for text, parse in ((render(samples), prom), (render(samples, openmetrics=True), om)):
        fams = {f.name: f for f in parse(text)}
        assert fams["x"].type == "counter" and fams["x"].documentation == \
            "help with \\ and\nnewline"
        assert [(s.labels["group"], s.value) for s in fams["x"].samples
                if s.name == "x_total"] == [(odd, 3), ("plain", 4)]
        buckets = [(s.labels["le"], s.value) for s in fams["lat_seconds"].samples
                   if s.name == "lat_seconds_bucket"]
        assert buckets == [("0.1", 1), ("1.0", 1), ("+Inf", 3)]


def test_a_family_must_be_typed_consistently():
    from oncelog.server.metrics import COUNTER, Sample, render

    with pytest.raises(ValueError, match="must end in _total"):
        render([Sample("x_count", "h", 1, type=COUNTER)])
    with pytest.raises(ValueError, match="both a gauge and a counter"):
        render([Sample("x_total", "h", 1), Sample("x_total", "h", 1, type=COUNTER)])


def test_other_modules_contribute_samples(broker):
    from oncelog.server.metrics import Sample, histogram

    broker.broker.stats.add_source(lambda: [
        Sample("oncelog_test_lag", "a contributed gauge", 5, (("group", "g"),)),
        *histogram("oncelog_test_seconds", "a contributed histogram", (1.0,), [2, 1], 3.0)])
    m = scrape(broker)
    assert m['oncelog_test_lag{group="g"}'] == 5
    assert m['oncelog_test_seconds_bucket{le="1.0"}'] == 2
    assert m["oncelog_test_seconds_count"] == 3
