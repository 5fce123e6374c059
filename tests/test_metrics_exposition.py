"""The metrics page as Prometheus reads it: every family typed and grouped (prometheus_client's
parsers are the reference), OpenMetrics when asked, and Kafka's broker figures (bytes and
messages per topic, requests and their latency per API, connections, authentications, log
size) counted after real produce and consume with our client and confluent-kafka, against one
broker process with SASL (so that a failed login can be counted too)."""

from __future__ import annotations

import base64
import json
import re
import socket
from pathlib import Path
from urllib.parse import urlsplit

import promql_parser
import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka import TopicPartition as ConfluentTP
from support.metrics import families, fetch, metrics_url, openmetrics, sample_names, value
from support.raw_wire import RawConnection
from support.security import USERS, creds, sasl_config
from support.waiting import wait_until

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, make, request_module

RECORDS = 40


def confluent_config(user: str = "admin") -> dict:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": USERS[user]}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    with BrokerProcess(tmp / "data", settings={**sasl_config(tmp), "metrics.port": "0"}) as b:
        b.metrics_url = metrics_url(b, "admin", USERS["admin"])  # a super user sees all
        yield b


@pytest.fixture(scope="module")
def traffic(broker):
    """"ours" written and read by our client, "theirs" by confluent-kafka: RECORDS records of
    100 bytes each, over 2 partitions."""
    bs = broker.bootstrap_servers
    with Admin(bootstrap_servers=bs, **creds("admin")) as a:
        a.create_topics([NewTopic("ours", 2), NewTopic("theirs", 2)])
    with Producer(bootstrap_servers=bs, **creds("admin")) as p:
        for i in range(RECORDS):
            p.send("ours", b"o" * 100, partition=i % 2)
        p.flush()
    p = ConfluentProducer({"bootstrap.servers": bs, **confluent_config()})
    for i in range(RECORDS):
        p.produce("theirs", b"t" * 100, partition=i % 2)
    assert p.flush(30) == 0
    with Consumer(bootstrap_servers=bs, auto_offset_reset="earliest", **creds("admin")) as c:
        c.assign([TopicPartition("ours", 0), TopicPartition("ours", 1)])
        got = []
        wait_until(lambda: len(got) + len(got.extend(c.poll(0.5)) or ()) >= RECORDS, 30,
                   "our consumer's records")
    c = ConfluentConsumer({"bootstrap.servers": bs, "group.id": "metrics-test",
                           "enable.auto.commit": False, **confluent_config()})
    c.assign([ConfluentTP("theirs", 0, 0), ConfluentTP("theirs", 1, 0)])
    got = 0
    while got < RECORDS:
        m = c.poll(10)
        assert m is not None and m.error() is None, m and m.error()
        got += 1
    c.commit(offsets=[ConfluentTP("theirs", 0, 5)], asynchronous=False)  # a lag of 15
    c.close()


def test_every_family_is_typed_and_once_on_the_page(broker, traffic):
    _ctype, text = fetch(broker.metrics_url)
    fams = families(broker.metrics_url)  # also: no family twice (the samples are grouped)
    assert [f.name for f in fams.values() if f.type in ("unknown", "untyped")] == []
    type_lines = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(type_lines) == len(set(type_lines)) == len(fams)
    for f in fams.values():
        for s in f.samples:
            assert s.name.endswith("_total") or f.type != "counter", s
    assert fams["oncelog_requests"].type == "counter"
    assert fams["oncelog_bytes_in"].type == "counter"
    assert fams["oncelog_request_total_time_seconds"].type == "histogram"
    assert fams["oncelog_partition_high_watermark"].type == "gauge"
    assert fams["oncelog_txn_verification"].type == "counter"
    assert fams["oncelog_txn_verification_time_seconds"].type == "summary"


def test_openmetrics_when_the_scraper_asks_for_it(broker, traffic):
    ctype, text = fetch(broker.metrics_url)
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    assert "# EOF" not in text
    om = openmetrics(broker.metrics_url)  # the strict parser: # EOF, names, histograms
    prom = families(broker.metrics_url)
    assert set(om) == set(prom)
    assert {f.name: f.type for f in om.values()} == {f.name: f.type for f in prom.values()}
    assert fetch(broker.metrics_url, "application/openmetrics-text")[1].endswith("# EOF\n")


def test_bytes_and_messages_per_topic(broker, traffic):
    fams = families(broker.metrics_url)
    for topic in ("ours", "theirs"):
        size = sum(value(fams, "oncelog_log_size_bytes", topic=topic, partition=str(p))
                   for p in range(2))
        assert size > RECORDS * 100
        # the log keeps the batches as produced: every byte in is in the log
        assert value(fams, "oncelog_bytes_in_total", topic=topic) == size
        assert value(fams, "oncelog_messages_in_total", topic=topic) == RECORDS
        # each consumer read the topic once, from the start (a batch may be sent again when
        # a fetch is retried, never less)
        assert size <= value(fams, "oncelog_bytes_out_total", topic=topic) < 2 * size
        assert value(fams, "oncelog_replication_bytes_out_total", topic=topic) == 0
        for p in range(2):
            assert value(fams, "oncelog_log_end_offset", topic=topic, partition=str(p)) == \
                RECORDS // 2
            assert value(fams, "oncelog_log_start_offset", topic=topic, partition=str(p)) == 0
            assert value(fams, "oncelog_log_segments", topic=topic, partition=str(p)) == 1
    assert value(fams, "oncelog_under_replicated_partitions") == 0
    assert value(fams, "oncelog_offline_partitions") == 0
    assert value(fams, "oncelog_active_controller") == 1
    assert value(fams, "oncelog_leader_partitions") == value(fams, "oncelog_partitions") > 4


def _requests_and_latency(url: str) -> tuple[dict, dict]:
    """Requests counted per API (over versions), and per API the latency histogram's buckets
    [(le, cumulative count)], its _count and _sum."""
    fams = families(url)
    requests: dict[str, float] = {}
    for s in fams["oncelog_requests"].samples:
        requests[s.labels["request"]] = requests.get(s.labels["request"], 0) + s.value
    latency: dict[str, tuple[list, float, float]] = {}
    for api in requests:
        buckets = [(float(s.labels["le"]), s.value)
                   for s in fams["oncelog_request_total_time_seconds"].samples
                   if s.name.endswith("_bucket") and s.labels["request"] == api]
        latency[api] = (buckets,
                        value(fams, "oncelog_request_total_time_seconds_count", request=api),
                        value(fams, "oncelog_request_total_time_seconds_sum", request=api))
    return requests, latency


def test_request_latency_per_api_matches_the_request_counts(broker, traffic):
    def settled():
        # a request is counted when decoded, timed when answered: the consumers' last long
        # polls may still be waiting out their max wait when the page is read
        requests, latency = _requests_and_latency(broker.metrics_url)
        return (requests, latency) if all(
            latency[api][1] == n for api, n in requests.items()) else None

    requests, latency = wait_until(settled, 10, "every request counted answered")
    assert requests["Produce"] >= 2 and requests["Fetch"] >= 2
    assert requests["SaslAuthenticate"] >= 4
    for api in ("Produce", "Fetch", "Metadata", "SaslAuthenticate"):
        buckets, count, total = latency[api]
        assert [le for le, _ in buckets] == sorted(le for le, _ in buckets)
        assert [n for _, n in buckets] == sorted(n for _, n in buckets)  # cumulative
        assert buckets[-1] == (float("inf"), count) and count == requests[api]
        assert total > 0


def _sasl_plain(conn: RawConnection, user: str, password: str) -> int:
    conn.request(make(request_module(ApiKey.SASL_HANDSHAKE, 1).SaslHandshakeRequest,
                      mechanism="PLAIN"))
    r = conn.request(make(request_module(ApiKey.SASL_AUTHENTICATE, 2).SaslAuthenticateRequest,
                          auth_bytes=f"\0{user}\0{password}".encode()))
    return r.error_code


def test_connections_and_authentications_are_counted(broker, traffic):
    url = broker.metrics_url
    before = families(url)
    with RawConnection(broker.bootstrap_servers) as good, \
            RawConnection(broker.bootstrap_servers) as bad:
        assert _sasl_plain(good, "alice", USERS["alice"]) == 0
        assert _sasl_plain(bad, "alice", "not-her-password") != 0
        during = families(url)
    for name, grew in (("oncelog_successful_authentication_total", 1),
                       ("oncelog_failed_authentication_total", 1),
                       ("oncelog_connection_creation_total", 2)):
        assert value(during, name) == value(before, name) + grew, name
    # the failed login's connection is closed by the broker; the good one is still open
    assert value(during, "oncelog_connection_close_total") == \
        value(before, "oncelog_connection_close_total") + 1
    assert value(during, "oncelog_connections") == value(before, "oncelog_connections") + 1
    wait_until(lambda: value(families(url), "oncelog_connections") ==
               value(before, "oncelog_connections"), 10, "the good connection counted closed")


def test_internal_topics_are_left_out_unless_asked_for(broker, traffic, tmp_path):
    """The confluent consumer's group made __consumer_offsets; metrics.internal.topics=false
    (the default) keeps its 50 partitions off the per-partition families."""
    fams = families(broker.metrics_url)
    topics = {s.labels["topic"] for s in fams["oncelog_partition_high_watermark"].samples}
    assert topics == {"ours", "theirs"}
    with BrokerProcess(tmp_path / "data", settings={
            "metrics.port": "0", "metrics.internal.topics": "true",
            "offsets.topic.num.partitions": "3"}) as b:
        with Consumer(bootstrap_servers=b.bootstrap_servers, group_id="g") as c:
            with Admin(bootstrap_servers=b.bootstrap_servers) as a:
                a.create_topics([NewTopic("t", 1)])
            c.commit({TopicPartition("t", 0): 1})
        shown = families(metrics_url(b))
        partitions = {(s.labels["topic"], s.labels["partition"])
                      for s in shown["oncelog_log_size_bytes"].samples}
        assert {("__consumer_offsets", str(p)) for p in range(3)} <= partitions


def test_an_accept_header_of_any_bytes_gets_the_text_format(broker):
    token = base64.b64encode(f"admin:{USERS['admin']}".encode())
    with socket.create_connection(("127.0.0.1", urlsplit(broker.metrics_url).port),
                                  timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\nAccept: \xff\xfe\r\n"
                  b"Authorization: Basic " + token + b"\r\n\r\n")
        assert b"200 OK" in s.recv(100)


# -- the Grafana dashboard ---------------------------------------------------------------------

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "oncelog.json"
# Grafana's interval variables, as a duration PromQL accepts (Grafana substitutes them)
_GRAFANA_INTERVALS = re.compile(r"\$__(rate_)?interval|\$__range")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads, from its syntax tree (promql-parser, the
    Rust parser of Prometheus' grammar): a syntax error fails the test."""
    names: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr}"
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(_GRAFANA_INTERVALS.sub("5m", expr)), visit)
    return names


def dashboard_expressions(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        query = query.get("query") if isinstance(query, dict) else None
        if query:  # label_values(METRIC{...}, label): the metric
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            assert m, query
            exprs.append(m.group(1))
    return exprs


def test_promql_metric_names_are_found():
    assert promql_metric_names(
        'histogram_quantile(0.99, sum by (request, le) (rate(x_bucket{a=~"$i"}'
        '[$__rate_interval]))) / on(instance) y_total offset 5m') == {"x_bucket", "y_total"}
    with pytest.raises(ValueError):
        promql_metric_names("sum by (topic) (rate(x_total[5m])")


def test_the_grafana_dashboard_reads_only_what_the_broker_serves(broker, traffic):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_expressions(dashboard)
    used = set().union(*(promql_metric_names(e) for e in exprs))
    served = sample_names(families(broker.metrics_url))
    assert used - served == set()
    # what the issue asks the dashboard to show
    for needed in ("oncelog_bytes_in_total", "oncelog_bytes_out_total",
                   "oncelog_messages_in_total", "oncelog_requests_total",
                   "oncelog_request_total_time_seconds_bucket", "oncelog_connections",
                   "oncelog_partition_last_stable_offset", "oncelog_partition_high_watermark",
                   "oncelog_partition_open_transactions", "oncelog_under_replicated_partitions",
                   "oncelog_failed_authentication_total", "oncelog_consumer_group_lag",
                   # issue 29: errors per API and code, the event loop's lag, the process
                   "oncelog_request_errors_total", "oncelog_event_loop_lag_seconds",
                   "oncelog_event_loop_wakeup_delay_seconds_sum", "process_cpu_seconds_total"):
        assert needed in used, needed


def test_every_family_on_the_page_is_documented(broker, traffic):
    docs = (DASHBOARD.parent.parent / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `((?:oncelog|process|python)_\w+)` \|", docs,
                                re.MULTILINE))
    _ctype, text = fetch(broker.metrics_url)
    served = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert served - documented == set()


def test_consumer_group_lag(broker, traffic):
    fams = families(broker.metrics_url)
    assert value(fams, "oncelog_consumer_group_lag", group="metrics-test", topic="theirs",
                 partition="0") == RECORDS // 2 - 5
