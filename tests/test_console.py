"""The broker's web console over plain HTTP: what its pages show of a live broker (an open
transaction holding the LSO, a group's lag), the HW/LSO history, escaping, bad requests, HTTP
Basic authentication against the broker's SASL users, HTTPS, and the consumer-group lag metric.
The same pages in a real browser: tests/test_console_browser.py."""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import urllib.request

import pytest
from support.console import ConsoleBrokerProcess, get, raw, rows, status_of
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    idempotent_batch,
    init_producer_id_request,
    produce,
)
from support.security import USERS, Op, R, allow, creds, grant, sasl_config
from support.waiting import wait_until

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.client import UserScramCredentialUpsertion as Upsertion
from oncelog.server.console import start_console_server
from oncelog.server.console.httpd import MAX_CONNECTIONS, MAX_PER_ADDRESS
from oncelog.server.console.sampler import OffsetSampler
from oncelog.server.embedded import EmbeddedBroker

GROUP = "<script>alert('group')</script>"
TXN_ID = "<script>alert('txn')</script>"


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config={"console.port": "0", "metrics.port": "0",
                                "transaction.state.log.num.partitions": "2",
                                "offsets.topic.num.partitions": "2",
                                "group.initial.rebalance.delay.ms": "0"}) as b:
        bs = b.bootstrap_servers
        with Admin(bootstrap_servers=bs) as admin:
            admin.create_topics([NewTopic("orders", 2, 1)])
        with Producer(bootstrap_servers=bs) as p:
            for i in range(10):
                p.send("orders", value=f"o{i}", partition=0)
        # A transaction left open on orders-0: its LSO stays at 10 while the HW moves on.
        txn = Producer(bootstrap_servers=bs, transactional_id=TXN_ID)
        txn.init_transactions()
        txn.begin_transaction()
        txn.send("orders", value="open", partition=0)
        txn.flush()
        with Producer(bootstrap_servers=bs) as p:
            for i in range(5):
                p.send("orders", value=f"later{i}", partition=0)
        with Consumer(bootstrap_servers=bs, group_id=GROUP, enable_auto_commit=False) as c:
            c.commit({TopicPartition("orders", 0): 4, TopicPartition("orders", 1): 0})
        b.console = b.server.console
        b.url = f"http://127.0.0.1:{b.console.port}"
        yield b
        txn.close()


def page(b, path: str) -> str:
    status, headers, body = get(b.url + path)
    assert status == 200, body
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    return body


def test_topics_page_shows_the_lso_held_by_the_open_transaction(broker):
    body = page(broker, "/topics")
    [held] = rows(body, topic="orders", partition=0)
    assert (held["data-log-start"], held["data-lso"], held["data-hw"]) == ("0", "10", "16")
    assert held["data-open-transactions"] == "1" and held["class"] == "stuck"
    [other] = rows(body, topic="orders", partition=1)
    assert other["data-lso"] == other["data-hw"] == "0" and "class" not in other
    assert "__consumer_offsets" not in body  # internal topics on request only
    assert "__consumer_offsets" in page(broker, "/topics?internal=1")
    detail = page(broker, "/topics/orders")
    assert "<svg" in detail and len(rows(detail, producer_id=re.search(
        r'data-producer-id="(\d+)"', detail).group(1))) == 1


def test_transactions_page_lists_the_open_transaction_on_both_sides(broker):
    body = page(broker, "/transactions")
    [coordinator_row] = rows(body, transactional_id=TXN_ID)
    assert coordinator_row["data-state"] == "Ongoing"
    assert "orders-0" in body
    [partition_row] = rows(body, topic="orders", partition=0)
    assert partition_row["data-hanging"] == "no"  # young, and its coordinator knows it
    assert "&lt;script&gt;alert(&#x27;txn&#x27;)&lt;/script&gt; (Ongoing)" in body
    assert "<script>" not in body


def test_a_transaction_its_coordinator_never_knew_is_shown_hanging(broker):
    # A transactional batch of a producer id no coordinator gave out (as a late produce of a
    # finished transaction leaves one), written long ago (its batch's timestamps are).
    with RawConnection(broker.bootstrap_servers) as conn:
        conn.request(create_topics_request("hang", 1))
        pid = conn.request(init_producer_id_request()).producer_id
        produce(conn, "hang", 0, idempotent_batch(pid, 0, 0, [b"h"], is_transactional=True))
    body = page(broker, "/transactions")
    [row] = rows(body, topic="hang", partition=0)
    assert row["data-hanging"] == "yes" and row["data-producer-id"] == str(pid)
    assert "unknown to the coordinator" in body
    assert not rows(body, transactional_id="hang")


def test_groups_page_shows_the_lag_per_partition(broker):
    body = page(broker, "/groups")
    assert rows(body, group=GROUP)
    [p0] = rows(body, topic="orders", partition=0, lag=12)  # HW 16 - committed 4
    assert p0
    assert rows(body, topic="orders", partition=1, lag=0)
    assert "&lt;script&gt;alert(&#x27;group&#x27;)&lt;/script&gt;" in body
    assert "<script>" not in body


def test_groups_page_shows_a_live_member_and_the_partitions_it_consumes(broker):
    bs = broker.bootstrap_servers
    with Consumer(bootstrap_servers=bs, group_id="live", client_id="console-test",
                  enable_auto_commit=False) as c:
        c.subscribe(["orders"])

        def assigned() -> bool:
            c.poll(0.2)  # joins the group
            return len(c.assignment()) == 2

        wait_until(assigned, 30, "the assignment")
        c.commit({TopicPartition("orders", 0): 16, TopicPartition("orders", 1): 0})
        body = page(broker, "/groups")
        [member] = [r for r in rows(body, group="live") if "data-member-id" in r]
        assert "console-test" in body
        for p in (0, 1):
            [row] = rows(body, group="live", topic="orders", partition=p, lag=0)
            assert row["data-consumer-id"] == member["data-member-id"]


def test_brokers_page_shows_the_broker_and_the_leaders(broker):
    body = page(broker, "/brokers")
    [me] = rows(body, node_id=1)
    assert rows(body, topic="orders", partition=0, leader=1)
    assert f"127.0.0.1:{broker.port}" in body and me


def test_sampler_records_a_flat_lso_under_a_climbing_hw(broker):
    bs = broker.bootstrap_servers
    console = broker.console
    with Admin(bootstrap_servers=bs) as admin:
        admin.create_topics([NewTopic("held", 1, 1)])
    with Producer(bootstrap_servers=bs, transactional_id="held-writer") as txn:
        txn.init_transactions()
        txn.begin_transaction()
        txn.send("held", value="open", partition=0)
        txn.flush()
        broker.call(console.sampler.sample)
        with Producer(bootstrap_servers=bs) as p:
            for i in range(3):
                p.send("held", value=f"more{i}", partition=0)
        broker.call(console.sampler.sample)
        points, _last = broker.call(console.sampler.history, "held", 0)
        readings = [(hw, lso) for _t, hw, lso in points]
        # (the loop's own one-second sampling may have added readings in between)
        assert (1, 0) in readings and readings[-1] == (4, 0)
        assert {lso for _hw, lso in readings} == {0}
        txn.abort_transaction()
    assert broker.call(console.sampler.history, "__consumer_offsets", 0) == ([], 0.0)


def test_sampler_keeps_changes_only_and_the_window(broker):
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        admin.create_topics([NewTopic("sampled", 1, 1)])
    now = [1000.0]
    sampler = OffsetSampler(broker.broker, window_s=10.0, clock=lambda: now[0])
    broker.call(sampler.sample)
    for _ in range(5):  # nothing changes: one reading kept, its time moves on
        now[0] += 1
        broker.call(sampler.sample)
    points, last_seen = broker.call(sampler.history, "sampled", 0)
    assert len(points) == 1 and points[0][0] == 1000.0 and last_seen == 1005.0
    with Producer(bootstrap_servers=broker.bootstrap_servers) as p:
        p.send("sampled", value="x", partition=0)
    now[0] += 1
    broker.call(sampler.sample)
    points, _ = broker.call(sampler.history, "sampled", 0)
    # the flat stretch's end, then the change: the chart steps where it happened
    assert [(t, hw - points[0][1]) for t, hw, _lso in points] == [
        (1000.0, 0), (1005.0, 0), (1006.0, 1)]
    now[0] += 30  # past the window: only the reading before it stays, where the line enters
    broker.call(sampler.sample)
    points, _ = broker.call(sampler.history, "sampled", 0)
    assert [t for t, _hw, _lso in points] == [1006.0]


def test_group_lag_metric(broker):
    url = f"http://127.0.0.1:{broker.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    assert re.search(r'^oncelog_consumer_group_lag\{group="<script>alert\(\'group\'\)'
                     r'</script>",topic="orders",partition="0"\} 12$', text, re.MULTILINE), text


def test_a_script_in_the_path_is_shown_as_text(broker):
    status, _h, body = get(broker.url + "/topics/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert status == 404
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>" not in body
    status, _h, body = get(broker.url + "/nowhere%3Cscript%3E")
    assert status == 404 and "<script>" not in body


def test_bad_requests_are_answered_and_the_broker_goes_on(broker):
    port = broker.console.port
    assert status_of(raw(port, b"garbage\r\n\r\n")) == 400
    assert status_of(raw(port, b"GET /topics SPDY/3\r\n\r\n")) == 400
    assert status_of(raw(port, b"GET /topics HTTP/1.1\r\nno colon here\r\n\r\n")) == 400
    assert status_of(raw(port, b"GET http://evil/ HTTP/1.1\r\n\r\n")) == 400
    assert status_of(raw(port, b"GET /topics/%ff HTTP/1.1\r\n\r\n")) == 400
    assert status_of(raw(port, b"GET /topics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n")) \
        == 431
    assert status_of(raw(port, b"GET /topics HTTP/1.1\r\n" + b"X: y\r\n" * 100 + b"\r\n")) \
        == 431
    answer = raw(port, b"POST /topics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
    assert status_of(answer) == 405 and b"Allow: GET, HEAD" in answer
    assert raw(port, b"\x00" * 16) == b""  # no request head at all: hung up on
    head = raw(port, b"HEAD /topics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(head) == 200 and head.endswith(b"\r\n\r\n")  # no body
    answer = raw(port, b"GET / HTTP/1.1\r\n\r\n")
    assert status_of(answer) == 303 and b"Location: /topics\r\n" in answer
    # still serving pages and Kafka requests
    assert rows(page(broker, "/topics"), topic="orders", partition=0)
    with RawConnection(broker.bootstrap_servers) as conn:
        conn.request(create_topics_request("after-garbage", 1))
        pid = conn.request(init_producer_id_request()).producer_id
        produce(conn, "after-garbage", 0, idempotent_batch(pid, 0, 0, [b"x"]))


def test_connections_over_the_limit_are_turned_away(broker):
    console = broker.console
    # from several addresses, each within its MAX_PER_ADDRESS (tests/test_metrics_http.py)
    sources = [f"127.0.0.{2 + i // MAX_PER_ADDRESS}" for i in range(MAX_CONNECTIONS)]
    idle = [socket.create_connection(("127.0.0.1", console.port), timeout=20,
                                     source_address=(source, 0)) for source in sources]
    try:
        wait_until(lambda: broker.call(lambda: console.connections) == MAX_CONNECTIONS, 20,
                   "the idle connections accepted")
        assert status_of(raw(console.port, b"GET /topics HTTP/1.1\r\n\r\n")) == 503
    finally:
        for s in idle:
            s.close()
    wait_until(lambda: broker.call(lambda: console.connections) == 0, 20, "the console idle")
    assert rows(page(broker, "/topics"), topic="orders", partition=0)


def test_broker_command_serves_the_console_and_prints_where(tmp_path):
    with ConsoleBrokerProcess(tmp_path / "data") as b:  # oncelog broker --console-port 0
        assert b.console_url.startswith("http://127.0.0.1:")
        status, _h, body = get(b.console_url + "/brokers")
        assert status == 200 and f"127.0.0.1:{b.port}" in body


def test_console_is_off_unless_asked_for(embedded_broker):
    assert embedded_broker.server.console is None


# -- security ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console-sasl")
    with EmbeddedBroker(data_dir=tmp / "data",
                        config={**sasl_config(tmp), "console.port": "0",
                                "connection.failed.authentication.delay.ms": "0"}) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers, **creds("admin")) as admin:
            admin.create_topics([NewTopic("secret"), NewTopic("shared")])
            admin.alter_user_scram_credentials([
                Upsertion("carol", "SCRAM-SHA-512", "carol-pw", iterations=4096)])
        grant(b, allow("User:alice", R.TOPIC, "shared", Op.DESCRIBE))
        b.console_port = b.server.console.port
        b.url = f"http://127.0.0.1:{b.console_port}"
        yield b


def test_sasl_broker_console_asks_for_credentials(sasl_broker):
    url = sasl_broker.url + "/topics"
    status, headers, body = get(url)
    assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="oncelog"')
    assert "secret" not in body
    assert get(url, "admin", "wrong")[0] == 401
    assert get(url, "nobody", "x")[0] == 401
    assert status_of(raw(sasl_broker.console_port,
                         b"GET /topics HTTP/1.1\r\nAuthorization: Basic !!!\r\n\r\n")) == 401
    head = raw(sasl_broker.console_port, b"HEAD /topics HTTP/1.1\r\n\r\n")
    assert status_of(head) == 401 and head.endswith(b"\r\n\r\n")  # HEAD: no body
    assert sasl_broker.broker.cluster_id not in body  # nothing of the broker before a login
    status, _h, body = get(url, "admin", USERS["admin"])  # the users file (as PLAIN checks)
    assert status == 200 and rows(body, topic="secret", partition=0)


def test_scram_user_logs_in_and_sees_what_its_acls_let_it_describe(sasl_broker):
    url = sasl_broker.url + "/topics"
    status, _h, body = get(url, "carol", "carol-pw")  # added with AlterUserScramCredentials
    assert status == 200 and not rows(body, topic="secret", partition=0)
    assert get(url, "carol", "wrong")[0] == 401
    status, _h, body = get(url, "alice", USERS["alice"])
    assert status == 200
    assert rows(body, topic="shared", partition=0) and not rows(body, topic="secret")


def test_console_over_https(embedded_broker, tmp_path):
    from support.tls import make_certificates

    certs = make_certificates(tmp_path / "certs")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(certs.server_cert, certs.server_key)
    console = asyncio.run_coroutine_threadsafe(
        start_console_server(embedded_broker.broker, "127.0.0.1", 0, server_ctx),
        embedded_broker.loop).result(30)
    try:
        assert console.scheme == "https"
        client_ctx = ssl.create_default_context(cafile=certs.ca)
        status, _h, body = get(f"https://127.0.0.1:{console.port}/brokers", context=client_ctx)
        assert status == 200 and rows(body, node_id=1)
        # plain HTTP to the TLS port: no answer, and the console goes on
        assert raw(console.port, b"GET /topics HTTP/1.1\r\n\r\n")[:4] != b"HTTP"
        assert get(f"https://127.0.0.1:{console.port}/topics", context=client_ctx)[0] == 200
    finally:
        embedded_broker.call(console.close)
